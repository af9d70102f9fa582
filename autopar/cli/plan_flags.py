"""The plan flags, declared once: `@with_plan_flags` appends them to a command's signature and hands
the command one `PlanRequest` (autopar.spec.resolve) in its `plan` parameter
(autopar.cli.option_groups). Every flag defaults to None (not given): each command fills in its own
defaults (estimate: the hardware's dtype; export --run: the ranked plan's values).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Optional

import typer

from autopar.cli.option_groups import Opt, with_options
from autopar.spec.resolve import PlanRequest
from autopar.spec.trainers import TRAINERS

PANEL = "Plan"  # help panel of the plan flags


def _opt(*names: str, help: str):
    return typer.Option(*names, help=help, rich_help_panel=PANEL, show_default=False)


#: field -> (type, typer option); one entry per PlanRequest field, in --help order
PLAN_OPTIONS: dict[str, tuple[object, object]] = {
    "tp": (Optional[int], _opt("--tp", help="Tensor-parallel size (default 1).")),
    "pp": (Optional[int], _opt("--pp", help="Pipeline-parallel size (default 1).")),
    "vpp": (Optional[int], _opt("--vpp", help="Virtual pipeline stages per pp rank: interleaved 1F1B (default 1).")),
    "cp": (Optional[int], _opt("--cp", help="Context-parallel size (default 1).")),
    "dp": (Optional[int], _opt("--dp", help="Data-parallel size (default: gpus / (tp*pp*cp)).")),
    "ep": (
        Optional[int],
        _opt("--ep", help="Expert-parallel size, carved out of the dp x cp (x tp) ranks (default 1)."),
    ),
    "etp": (Optional[int], _opt("--etp", help="Expert tensor-parallel size (default: tp).")),
    "zero": (
        Optional[int],
        _opt("--zero", help="ZeRO stage: 0 DDP, 1 distributed optimizer, 2 + sharded gradients, 3 FSDP (default 1)."),
    ),
    "sp": (Optional[bool], _opt("--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1).")),
    "mbs": (Optional[int], _opt("--mbs", help="Micro-batch size in sequences (default 1).")),
    "gbs": (Optional[int], _opt("--gbs", help="Global batch size in sequences (default: ~4M tokens).")),
    "pp_schedule": (
        Optional[str],
        _opt(
            "--pp-schedule",
            help="gpipe | 1f1b | interleaved-1f1b | zero-bubble (default: 1f1b, interleaved when vpp > 1).",
        ),
    ),
    "recompute": (Optional[str], _opt("--recompute", help="none | selective | full (default none).")),
    "recompute_layers": (
        Optional[int],
        _opt("--recompute-layers", help="With --recompute full: layers per stage to recompute (default: all)."),
    ),
    "dtype": (
        Optional[str],
        _opt("--dtype", help="bf16 | fp8 (GEMMs in FP8) | fp32 (full precision). Default: bf16; fp32 on --gpu local."),
    ),
    "grads": (
        Optional[str],
        _opt(
            "--grads",
            help="Main-gradient dtype: fp32 (Megatron, 18 B/param; default) or "
            "bf16 (16 bytes per parameter with Adam).",
        ),
    ),
    "pp_layout": (Optional[str], _opt("--pp-layout", help="Layers per virtual stage, e.g. 4,5,5,4.")),
    "pp_first": (
        Optional[int],
        _opt("--pp-first", help="Layers on the first stage (Megatron --decoder-first-pipeline-num-layers)."),
    ),
    "pp_last": (Optional[int], _opt("--pp-last", help="Layers on the last stage.")),
    "pp_embedding_as_layer": (
        Optional[bool],
        _opt("--pp-embedding-as-layer", help="Count the embedding as a layer when balancing stages."),
    ),
    "pp_loss_as_layer": (
        Optional[bool],
        _opt("--pp-loss-as-layer", help="Count the loss as a layer when balancing stages."),
    ),
    "tp_comm_overlap": (
        Optional[bool],
        _opt(
            "--tp-comm-overlap/--no-tp-comm-overlap",
            help="Overlap TP collectives with GEMMs (Megatron --tp-comm-overlap, torchtitan async TP; default off).",
        ),
    ),
    "trainer": (
        Optional[str],
        _opt(
            "--trainer",
            help=f"The trainer that runs the plan: {', '.join(TRAINERS)} "
            f"(default megatron); its capabilities and performance "
            f"profile apply.",
        ),
    ),
    "moe_dispatch": (
        Optional[str],
        _opt(
            "--moe-dispatch",
            help="MoE token dispatch: dropless (default) or capacity (tokens past the capacity factor dropped).",
        ),
    ),
    "capacity_factor": (
        Optional[float],
        _opt("--capacity-factor", help="With --moe-dispatch capacity: expert capacity / mean load (default 1.0)."),
    ),
    "moe_dispatcher": (
        Optional[str],
        _opt(
            "--moe-dispatcher",
            help="MoE token dispatcher: alltoall (NCCL, default) or deepep (DeepEP / HybridEP kernels).",
        ),
    ),
    "ep_comm_overlap": (
        Optional[bool],
        _opt(
            "--ep-comm-overlap/--no-ep-comm-overlap",
            help="Hide the EP all-to-alls of one microbatch under another's "
            "compute (Megatron --overlap-moe-expert-parallel-comm; default off).",
        ),
    ),
}
assert tuple(PLAN_OPTIONS) == tuple(f.name for f in fields(PlanRequest)), "one option per PlanRequest field"


def _request(values: dict) -> PlanRequest:
    """The PlanRequest of the parsed options; the two layout switches given as False mean not given."""
    for name in ("pp_embedding_as_layer", "pp_loss_as_layer"):
        if values.get(name) is False:
            values[name] = None
    return PlanRequest(**values)


def with_plan_flags(command):
    """Give `command(..., plan: PlanRequest)` the plan flags as options; the command's own
    parameters come first (its `plan` parameter is filled in, not an option)."""
    return with_options({name: Opt(typ, opt) for name, (typ, opt) in PLAN_OPTIONS.items()}, "plan", _request)(command)
