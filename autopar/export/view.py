"""The plan as every exporter must reproduce it: `plan_view` (the fields a trainer's files must
express, as plain values) and `normalize` (which drops the distinctions a run does not have).
Every exporter's `parse` returns a normalized view, so the round trip is
`parse(render(plan, ...)) == plan_view(plan, model)`."""

from __future__ import annotations

from autopar.figures import NUM_MICROBATCHES
from autopar.spec.model import ModelSpec
from autopar.spec.plan import GRID_FIRST, ParallelPlan
from autopar.spec.plan_fields import BOOL, LAYOUT
from autopar.spec.recompute_modules import DEFAULT_SELECTIVE, parse_modules

#: the plan's fields an export must express (autopar.spec.plan: every one but the trainer, whose
#: files the export is)
VIEWED = tuple(f for f in GRID_FIRST if f.view)
VIEW_KEYS = ("num_gpus", NUM_MICROBATCHES) + tuple(f.name for f in VIEWED)
#: what a field reads back as where a trainer's files do not say it (the trainer has no such
#: setting): the plan's default
DEFAULTS = {f.name: f.default for f in VIEWED}


def plan_view(plan: ParallelPlan, model: ModelSpec) -> dict:
    """What a trainer must reproduce of a plan, as plain values (normalized)."""
    view: dict[str, object] = {"num_gpus": plan.num_gpus, NUM_MICROBATCHES: plan.num_microbatches}
    for f in VIEWED:
        if f.kind == LAYOUT:
            view[f.name] = tuple(plan.resolved_layout(model.num_layers).stages)
        elif f.name == "fp8_recipe":
            view[f.name] = plan.fp8_recipe_used  # "default" named: the recipe the trainer runs
        elif f.name == "fp8_param_gather":
            view[f.name] = plan.fp8_param_gather_used
        elif f.moe and model.moe is None:
            view[f.name] = f.default  # a dense model drops no token and dispatches none: the defaults
        else:
            view[f.name] = bool(getattr(plan, f.name)) if f.kind == BOOL else getattr(plan, f.name)
    return normalize(view)


def normalize(view: dict) -> dict:
    """Drop distinctions that do not exist in a run: no schedule or layout without a pipeline, no
    sharding stage without data-parallel ranks to shard over, no SP without TP. A field the view
    does not give reads back as the plan's default (DEFAULTS)."""
    v = {k: view.get(k, DEFAULTS.get(k)) for k in VIEW_KEYS}
    if v["pp"] == 1:
        v["pp_schedule"] = None
        v["layout"] = None
    elif v["layout"] is not None:
        v["layout"] = tuple(int(x) for x in v["layout"])
    if v["dp"] is not None and v["cp"] is not None and v["dp"] * v["cp"] == 1:
        v["zero_stage"] = None
    if v["dp_shard"] is not None and v["dp"] is not None and v["cp"] is not None and v["dp_shard"] == v["dp"] * v["cp"]:
        v["dp_shard"] = None  # shards over the whole group: no hybrid sharding
    if v["dtype"] != "fp8":
        v["fp8_recipe"] = v["fp8_param_gather"] = None  # no FP8 GEMMs: no scaling recipe, no FP8 parameters
    if v["tp"] == 1:
        v["sequence_parallel"] = False
        v["tp_comm_overlap"] = False
    if v["ep"] == 1:
        v["ep_comm_overlap"] = False
    if v["recompute"] != "full":
        v["recompute_layers"] = None
    if v["recompute"] != "selective" or v["recompute_modules"] is None:
        v["recompute_modules"] = None
    else:  # one spelling: registry order, Megatron's default (core_attn alone) as None
        names = parse_modules(v["recompute_modules"])
        v["recompute_modules"] = None if names == DEFAULT_SELECTIVE else names
    if v["moe_dispatch"] != "capacity":
        v["capacity_factor"] = None
    elif v["capacity_factor"] is not None:
        v["capacity_factor"] = float(v["capacity_factor"])
    return v
