"""What the built-in model can run: the plan features it refuses, as sentences. No torch import,
so the CLI and the measured stage can check a plan before launching anything."""

from __future__ import annotations

from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan


def plan_problems(plan: ParallelPlan, spec: ModelSpec | None = None) -> list[str]:
    """Plan features the built-in model cannot run yet, as sentences (MoE ones when `spec` is given)."""
    out = []
    if spec is not None and spec.moe is not None and plan.etp not in (1, plan.tp):
        out.append(f"expert tensor parallelism over part of the tp group (etp = {plan.etp}, tp = {plan.tp}) is not "
                   f"built: use etp = tp (each expert's FFN split like the dense MLP) or etp = 1 (experts whole, "
                   f"EP folded over the tp ranks)")
    if plan.dtype == "fp8":
        out.append("fp8 training is not built (use bf16 or fp32)")
    if plan.sequence_parallel and plan.tp == 1:
        out.append("sequence parallelism needs tp > 1")
    return out
