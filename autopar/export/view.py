"""The plan as every exporter must reproduce it: `plan_view` (the fields a trainer's files must
express, as plain values) and `normalize` (which drops the distinctions a run does not have).
Every exporter's `parse` returns a normalized view, so the round trip is
`parse(render(plan, ...)) == plan_view(plan, model)`."""

from __future__ import annotations

from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan

VIEW_KEYS = (
    "num_gpus",
    "tp",
    "pp",
    "vpp",
    "cp",
    "dp",
    "ep",
    "etp",
    "sequence_parallel",
    "zero_stage",
    "micro_batch_size",
    "global_batch_size",
    "num_microbatches",
    "pp_schedule",
    "layout",
    "recompute",
    "recompute_layers",
    "dtype",
    "main_grads_fp32",
    "tp_comm_overlap",
    "moe_dispatch",
    "capacity_factor",
    "moe_dispatcher",
    "ep_comm_overlap",
)


def plan_view(plan: ParallelPlan, model: ModelSpec) -> dict:
    """What a trainer must reproduce of a plan, as plain values (normalized)."""
    layout = plan.resolved_layout(model.num_layers)
    return normalize(
        {
            "num_gpus": plan.num_gpus,
            "tp": plan.tp,
            "pp": plan.pp,
            "vpp": plan.vpp,
            "cp": plan.cp,
            "dp": plan.dp,
            "ep": plan.ep,
            "etp": plan.etp,
            "sequence_parallel": bool(plan.sequence_parallel),
            "zero_stage": plan.zero_stage,
            "micro_batch_size": plan.micro_batch_size,
            "global_batch_size": plan.global_batch_size,
            "num_microbatches": plan.num_microbatches,
            "pp_schedule": plan.pp_schedule,
            "layout": tuple(layout.stages),
            "recompute": plan.recompute,
            "recompute_layers": plan.recompute_layers,
            "dtype": plan.dtype,
            "main_grads_fp32": plan.main_grads_fp32,
            "tp_comm_overlap": plan.tp_comm_overlap,
            # a dense model drops no token and dispatches none: it reads back as dropless all-to-all
            "moe_dispatch": plan.moe_dispatch if model.moe is not None else "dropless",
            "capacity_factor": plan.capacity_factor if model.moe is not None else None,
            "moe_dispatcher": plan.moe_dispatcher if model.moe is not None else "alltoall",
            "ep_comm_overlap": plan.ep_comm_overlap and model.moe is not None,
        }
    )


def normalize(view: dict) -> dict:
    """Drop distinctions that do not exist in a run: no schedule or layout without a pipeline, no
    sharding stage without data-parallel ranks to shard over, no SP without TP."""
    v = {k: view.get(k) for k in VIEW_KEYS}
    if v["pp"] == 1:
        v["pp_schedule"] = None
        v["layout"] = None
    elif v["layout"] is not None:
        v["layout"] = tuple(int(x) for x in v["layout"])
    if v["dp"] is not None and v["cp"] is not None and v["dp"] * v["cp"] == 1:
        v["zero_stage"] = None
    if v["tp"] == 1:
        v["sequence_parallel"] = False
        v["tp_comm_overlap"] = False
    if v["ep"] == 1:
        v["ep_comm_overlap"] = False
    if v["recompute"] != "full":
        v["recompute_layers"] = None
    if v["moe_dispatch"] != "capacity":
        v["capacity_factor"] = None
    elif v["capacity_factor"] is not None:
        v["capacity_factor"] = float(v["capacity_factor"])
    return v
