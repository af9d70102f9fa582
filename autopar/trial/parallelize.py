"""parallelize(model, plan, mesh): the plan's apply_* steps in their fixed order.

Order, and why:
1. apply_tp  - tensor/sequence parallelism on the whole model, once, so every stage is sharded by
               the same tables (autopar/spec/sharding.py) whatever the pipeline split;
   apply_cp  - context parallelism: attention becomes a ring over the cp group, RoPE and the batch
               follow this rank's load-balanced token positions (parallel/context.py);
   apply_ep  - expert parallelism: each MoE layer keeps this EP rank's experts and dispatches by
               all-to-all over the EP group of the expert mesh (parallel/expert.py);
   apply_ac  - activation recomputation (parallel/recompute.py): after TP/CP/EP, so a recomputed
               block re-issues their collectives, and before the cut and DP wrapping (torchtitan:
               TP -> AC -> compile -> FSDP);
2. apply_pp  - cut the TP-sharded model into this rank's stage modules (sharing its blocks);
3. materialise - a model built on the meta device gets its values here: each parameter's full
               initial value (a function of seed and name) sliced to this rank's TP shard, so no
               rank ever holds more than its stage;
4. apply_dp  - DDP / FSDP2 wraps each stage module last, over dp x cp (cp ranks hold other tokens of
               the same sequences, so their gradients add up as data-parallel ones), experts over
               expert-dp: it must see the final local parameters,
               and the pipeline stage recognises a DDP/FSDP module to defer gradient sync to the
               last microbatch;
5. the pipeline schedule over the wrapped stages.
Axes of size 1 are skipped, so they issue no collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from autopar.measured.features import plan_problems
from autopar.spec.plan import ParallelPlan
from autopar.trial.loss import cross_entropy
from autopar.trial.materialize import count_params, materialize
from autopar.trial.mesh import build_expert_mesh, dp_cp_mesh, fresh_axis_mesh, new_axes_group
from autopar.trial.model import Transformer
from autopar.trial.parallel.context import apply_cp
from autopar.trial.parallel.data import apply_dp
from autopar.trial.parallel.expert import apply_ep, expert_grad_scale, init_local_experts, sequence_stats_over
from autopar.trial.parallel.pipeline import apply_pp, build_schedule
from autopar.trial.parallel.recompute import apply_ac, recomputed_layers
from autopar.trial.parallel.tensor import apply_tp


@dataclass
class ParallelModel:
    """A parallelised model on this rank: its stage modules (wrapped for DP), the schedule when
    pipelined, and the facts the runner reports."""

    plan: ParallelPlan
    mesh: DeviceMesh
    stages: list[tuple[int, nn.Module]]  # (virtual stage index, module as run: maybe DDP/FSDP)
    unwrapped: list[Transformer]  # the stage modules as built (DDP wraps them; FSDP2 in place)
    schedule: Any | None  # torch.distributed.pipelining schedule when pp > 1
    params: dict[str, nn.Parameter]  # name -> parameter as the optimizer sees it
    param_count: int  # parameters this rank holds under TP (before ZeRO sharding)
    positions: torch.Tensor | None = None  # token positions this cp rank holds (None: all)
    expert_mesh: DeviceMesh | None = None  # (pp, edp, ep, etp) view, when ep > 1
    expert_names: frozenset[str] = frozenset()  # parameters split over ep / etp (full_params gathers them)
    named_axes: dict = field(default_factory=dict)  # ("name", group name) -> axis, for the byte counter

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
            if name in self.expert_names:  # E/ep experts, ffn/etp of each: gather the FFN, then the stack
                ffn_dim = 2 if name.endswith("w2") else 1
                for axis, dim in (("etp", ffn_dim), ("ep", 0)):
                    if getattr(self.plan, axis) > 1:
                        assert self.expert_mesh is not None  # split experts have their mesh
                        group = self.expert_mesh.get_group(axis)
                        parts = [torch.empty_like(t) for _ in range(group.size())]
                        torch.distributed.all_gather(parts, t.detach().contiguous(), group=group)
                        t = torch.cat(parts, dim=dim)
            out[name] = t.detach().float().cpu().clone()
        return out


def parallelize(
    model: Transformer, plan: ParallelPlan, mesh: DeviceMesh, *, device: torch.device, seed: int
) -> ParallelModel:
    """Apply the plan to `model` (built on the meta device, or already initialised) on `mesh`."""
    problems = plan_problems(plan, model.config.spec)
    if problems:
        raise ValueError(f"plan {plan.describe()}: " + "; ".join(problems))
    on_meta = any(p.is_meta for p in model.parameters())
    named_axes: dict = {}
    # 1. tensor + sequence, context and expert parallelism over the whole model, then recomputation
    if plan.tp > 1:
        apply_tp(model, mesh["tp"], sequence_parallel=bool(plan.sequence_parallel))
    positions = apply_cp(model, mesh["cp"], model.config.max_seq_len) if plan.cp > 1 else None
    moe_blocks = [b.moe for b in model.layers.values() if b.moe is not None]
    if moe_blocks:
        _share_moe_statistics(moe_blocks, plan, mesh, positions, model.config.max_seq_len, named_axes)
    _set_aux_scale(moe_blocks, plan)
    experts = _place_experts(model, moe_blocks, plan, device)
    if plan.recompute != "none":  # this pipeline rank's layers (or the first recompute_layers of them)
        layers = recomputed_layers(plan, model.config.spec.num_layers, mesh["pp"].get_local_rank())
        apply_ac(model, plan.recompute, layers)
    # 2. this rank's pipeline stages
    stages: list[tuple[int, Transformer]] = apply_pp(model, plan, mesh["pp"]) if plan.pp > 1 else [(0, model)]
    # 3. values: each rank initialises only what it holds
    _materialize_stages(stages, on_meta=on_meta, seed=seed, device=device, experts_split=experts.split)
    param_count = sum(count_params(s) for _, s in stages)
    # 4. data parallelism, per stage module: dense over dp x cp, experts over expert-dp
    wrapped = _apply_dp_to_stages(stages, plan, mesh, experts, named_axes)
    params = _optimizer_params(stages)
    # 5. the pipeline schedule over the wrapped stages
    schedule = build_schedule(wrapped, plan, mesh["pp"], device, cross_entropy) if plan.pp > 1 else None
    return ParallelModel(
        plan=plan,
        mesh=mesh,
        stages=wrapped,
        unwrapped=[s for _, s in stages],
        schedule=schedule,
        params=params,
        param_count=param_count,
        positions=positions,
        expert_mesh=experts.mesh,
        expert_names=frozenset(n for n in params if ".moe.experts." in n) if experts.split else frozenset(),
        named_axes=named_axes,
    )


@dataclass
class _Experts:
    """Where this plan puts the routed experts of the model's MoE blocks (none: both False)."""

    apart: bool  # the experts have a gradient group of their own (ep > 1, or whole on each tp rank)
    split: bool  # each rank holds only some experts (ep > 1) or a slice of each (etp > 1)
    mesh: DeviceMesh | None  # (pp, edp, ep, etp) view, when apart


def _place_experts(model: Transformer, blocks: list, plan: ParallelPlan, device: torch.device) -> _Experts:
    """Expert parallelism (apply_ep over the expert mesh) when the plan splits the experts, else
    the experts' own gradient scale when they have a gradient group of their own."""
    # routed experts get their own gradient group whenever their ranks do not all see the same
    # tokens' gradients as the dense layers do: split over EP, or whole on each tp rank (etp = 1)
    assert plan.etp is not None  # ParallelPlan.__post_init__ resolves None to tp
    apart = bool(blocks) and (plan.ep > 1 or plan.tp > 1)
    experts = _Experts(
        apart=apart,
        split=bool(blocks) and (plan.ep > 1 or plan.etp > 1),
        mesh=build_expert_mesh(plan, device.type) if apart else None,
    )
    scale = expert_grad_scale(plan.tp, plan.ep, plan.etp)
    if experts.split:
        # etp is 1 or tp (plan_problems), so split experts are also apart: they have their mesh
        assert experts.mesh is not None
        ep_mesh = experts.mesh["ep"] if plan.ep > 1 else None
        etp_mesh = experts.mesh["etp"] if plan.etp > 1 else None
        apply_ep(model, ep_mesh, etp_mesh, scale)
    elif experts.apart:
        for moe in blocks:
            moe.experts.grad_scale = scale
    return experts


def _set_aux_scale(moe_blocks: list, plan: ParallelPlan) -> None:
    """The aux loss's gradient per microbatch: the pipeline schedules scale all gradients by
    1/microbatches themselves; outside them each microbatch's loss is divided by it. Under SP
    every tp rank computes the same aux loss from the all-reduced statistics, and the
    statistics' backward sums the tp ranks' gradients, which are then summed again over tp (the
    router is a sequence-parallel parameter), not averaged like cp's: 1/tp undoes the double count."""
    tp_copies = plan.tp if plan.tp > 1 and plan.sequence_parallel else 1
    for moe in moe_blocks:
        moe.aux_scale = (1.0 if plan.pp > 1 else 1.0 / plan.num_microbatches) / tp_copies


def _materialize_stages(
    stages: list[tuple[int, Transformer]], *, on_meta: bool, seed: int, device: torch.device, experts_split: bool
) -> None:
    """Give each stage module its values on `device`: a meta-built one is initialised here, only
    what this rank holds (its own experts too, when they are split); a built one is moved."""
    for _, stage in stages:
        if on_meta:
            materialize(stage, seed, device)
        else:
            stage.to(device)
        if experts_split and on_meta:
            init_local_experts(stage, seed)


def _apply_dp_to_stages(
    stages: list[tuple[int, Transformer]], plan: ParallelPlan, mesh: DeviceMesh, experts: _Experts, named_axes: dict
) -> list[tuple[int, nn.Module]]:
    """Wrap each stage module for data parallelism (apply_dp): dense parameters over dp x cp,
    experts over expert-dp; a stage with no data-parallel peer is returned as is."""
    apart_mesh = experts.mesh if experts.apart else None  # (not None when apart)
    edp_mesh = fresh_axis_mesh(apart_mesh, "edp") if apart_mesh is not None and plan.expert_dp > 1 else None
    if edp_mesh is not None:  # booked as data-parallel traffic, whatever other axis has its ranks
        named_axes[("name", edp_mesh.get_group().group_name)] = "dp"
    if plan.dp * plan.cp > 1:
        dmesh, with_experts = (mesh["dp"] if plan.cp == 1 else dp_cp_mesh(mesh)), experts.apart
    elif edp_mesh is not None:  # dp = cp = 1 under TP: only the experts have data-parallel peers
        dmesh, with_experts = mesh["dp"], True
    else:
        return list(stages)
    bf16 = plan.dtype == "bf16"
    return [
        (i, apply_dp(stage, dmesh, zero_stage=plan.zero_stage, bf16=bf16, expert_mesh=edp_mesh, experts=with_experts))
        for i, stage in stages
    ]


def _optimizer_params(stages: Sequence[tuple[int, nn.Module]]) -> dict[str, nn.Parameter]:
    """The parameters as the optimizer sees them (FSDP2 swaps in unsharded ones only inside a step)."""
    params: dict[str, nn.Parameter] = {}
    for _, stage in stages:
        params.update(dict(stage.named_parameters()))
    return params


def _share_moe_statistics(
    moe_blocks: list,
    plan: ParallelPlan,
    mesh: DeviceMesh,
    positions: torch.Tensor | None,
    seq_len: int,
    named_axes: dict,
) -> None:
    """The aux loss's routing statistics are the whole sequence's: summed over the ranks holding
    its tokens (cp, and tp under SP), on a group of their own named after the axis the cost model
    books them on (cp when cp > 1, else tp: autopar.calibration.estimate). Balanced routing needs each
    token's real position: this cp rank's positions, split over tp by SP."""
    axes = tuple(a for a in ("cp", "tp") if getattr(plan, a) > 1 and (a == "cp" or plan.sequence_parallel))
    stats = new_axes_group(mesh, axes) if axes else None
    if stats is not None:
        named_axes[("name", stats.group_name)] = "cp" if plan.cp > 1 else "tp"
    pos = positions if positions is not None else torch.arange(seq_len // plan.cp)
    if plan.tp > 1 and plan.sequence_parallel:
        pos = pos.chunk(plan.tp)[mesh["tp"].get_local_rank()]
    for moe in moe_blocks:
        if stats is not None:
            moe.sequence_stats = sequence_stats_over(stats)
        moe.positions = pos if (positions is not None or plan.tp > 1) else None
