"""parallelize(model, plan, mesh): the plan's apply_* steps in their fixed order.

Order, and why:
1. apply_tp  - tensor/sequence parallelism on the whole model, once, so every stage is sharded by
               the same tables (autopar/spec/sharding.py) whatever the pipeline split;
2. apply_pp  - cut the TP-sharded model into this rank's stage modules (sharing its blocks);
3. materialise - a model built on the meta device gets its values here: each parameter's full
               initial value (a function of seed and name) sliced to this rank's TP shard, so no
               rank ever holds more than its stage;
4. apply_dp  - DDP / FSDP2 wraps each stage module last: it must see the final local parameters,
               and the pipeline stage recognises a DDP/FSDP module to defer gradient sync to the
               last microbatch;
5. the pipeline schedule over the wrapped stages.
Axes of size 1 are skipped, so they issue no collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from autopar.spec.plan import ParallelPlan
from autopar.trial.loss import cross_entropy
from autopar.trial.materialize import count_params, materialize
from autopar.trial.model import Transformer
from autopar.trial.parallel.data import apply_dp
from autopar.trial.parallel.pipeline import apply_pp, build_schedule
from autopar.trial.parallel.tensor import apply_tp


def plan_problems(plan: ParallelPlan) -> list[str]:
    """Plan features the built-in model cannot run yet, as sentences."""
    out = []
    if plan.cp > 1:
        out.append("context parallelism (cp > 1) is not built yet")
    if plan.ep > 1 or plan.etp != plan.tp:
        out.append("expert parallelism (ep > 1, etp != tp) is not built yet")
    if plan.recompute != "none":
        out.append("activation recomputation is not built yet")
    if plan.dtype == "fp8":
        out.append("fp8 training is not built (use bf16 or fp32)")
    if plan.sequence_parallel and plan.tp == 1:
        out.append("sequence parallelism needs tp > 1")
    return out


@dataclass
class ParallelModel:
    """A parallelised model on this rank: its stage modules (wrapped for DP), the schedule when
    pipelined, and the facts the runner reports."""

    plan: ParallelPlan
    mesh: DeviceMesh
    stages: list[tuple[int, nn.Module]]  # (virtual stage index, module as run: maybe DDP/FSDP)
    unwrapped: list[nn.Module]  # the stage modules as built (DDP wraps them; FSDP2 in place)
    schedule: Any | None  # torch.distributed.pipelining schedule when pp > 1
    params: dict[str, nn.Parameter]  # name -> parameter as the optimizer sees it
    param_count: int  # parameters this rank holds under TP (before ZeRO sharding)

    @property
    def num_stages(self) -> int:
        return self.plan.pp * self.plan.vpp

    @property
    def is_first(self) -> bool:
        return any(i == 0 for i, _ in self.stages)

    @property
    def is_last(self) -> bool:
        return any(i == self.num_stages - 1 for i, _ in self.stages)

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter of this rank's stages as a full CPU tensor (a collective over tp and dp:
        all ranks of a stage must call it together)."""
        out = {}
        for name, p in self.params.items():
            t: torch.Tensor = p
            if isinstance(t, DTensor):
                t = t.full_tensor()
            out[name] = t.detach().float().cpu().clone()
        return out


def parallelize(model: Transformer, plan: ParallelPlan, mesh: DeviceMesh, *, device: torch.device,
                seed: int) -> ParallelModel:
    """Apply the plan to `model` (built on the meta device, or already initialised) on `mesh`."""
    problems = plan_problems(plan)
    if problems:
        raise ValueError(f"plan {plan.describe()}: " + "; ".join(problems))
    on_meta = any(p.is_meta for p in model.parameters())

    # 1. tensor + sequence parallelism over the whole model
    if plan.tp > 1:
        apply_tp(model, mesh["tp"], sequence_parallel=bool(plan.sequence_parallel))
    # 2. this rank's pipeline stages
    stages: list[tuple[int, Transformer]] = apply_pp(model, plan, mesh["pp"]) if plan.pp > 1 else [(0, model)]
    # 3. values: each rank initialises only what it holds
    for _, stage in stages:
        if on_meta:
            materialize(stage, seed, device)
        else:
            stage.to(device)
    param_count = sum(count_params(s) for _, s in stages)
    # 4. data parallelism, per stage module
    wrapped: list[tuple[int, nn.Module]] = []
    for i, stage in stages:
        if plan.dp > 1:
            wrapped.append((i, apply_dp(stage, mesh["dp"], zero_stage=plan.zero_stage, bf16=plan.dtype == "bf16")))
        else:
            wrapped.append((i, stage))
    # parameters as the optimizer sees them (FSDP2 swaps in unsharded ones only inside a step)
    params: dict[str, nn.Parameter] = {}
    for _, stage in stages:
        params.update(dict(stage.named_parameters()))
    # 5. the pipeline schedule over the wrapped stages
    schedule = build_schedule(wrapped, plan, mesh["pp"], device, cross_entropy) if plan.pp > 1 else None
    return ParallelModel(plan=plan, mesh=mesh, stages=wrapped, unwrapped=[s for _, s in stages],
                         schedule=schedule, params=params, param_count=param_count)
