"""Communication of every costed pipeline rank, per axis: payload bytes and time (vectorised).

Which calls each axis issues is autopar.cost.comm (one call list gives both bytes and time); which
link a group runs on is autopar.cost.collectives (`place`, from the rank order tp, cp, dp, pp,
innermost first; experts etp, ep, edp).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from autopar.cost.collectives import Group, Links, deduplicated_seconds, place
from autopar.cost.comm import (
    Call,
    Volume,
    cp_calls,
    dp_calls,
    ep_calls,
    grad_reductions_per_step,
    moe_stat_calls,
    pp_calls,
    pp_gather_calls,
    replica_calls,
    seconds,
    tp_calls,
    tp_step_calls,
    volume,
)
from autopar.cost.compute import expert_load
from autopar.cost.params import RankParams
from autopar.cost.plan_arrays import PlanArrays
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.ranks import EXPERT_MESH_ORDER, group_stride
from autopar.spec.table import DISPATCHER


class Traffic(NamedTuple):
    bytes: np.ndarray | float  # payload this GPU hands to the calls (0 when not counted)
    seconds: np.ndarray


class CommTerms(NamedTuple):
    """Per microbatch: tp, cp, ep, pp. Per step: tp_step (SP norm gradients), dp_reduce (gradient
    reduction), dp_gather (parameter gathering), dense and expert parameters together, each issued
    bucket by bucket; dp_reduce_tail / dp_gather_tail: the seconds of one bucket of each (the last
    reduced and the first gathered, which nothing hides)."""

    tp: Traffic
    cp: Traffic  # the K/V exchange (and the MoE statistics when cp > 1)
    cp_grad: Traffic  # the backward's dK/dV exchange
    ep: Traffic
    pp: Traffic
    tp_step: Traffic
    dp_reduce: Traffic
    dp_gather: Traffic
    dp_reduce_tail: np.ndarray
    dp_gather_tail: np.ndarray
    #: (C, n) HBM bytes per step of the trainer's ZeRO-3 copies into and out of the collectives'
    #: buffers (`fsdp_copy_bytes`; 0 where the trainer gathers in place)
    zero3_copy_bytes: np.ndarray | float = 0.0


@dataclass(frozen=True)
class OnGroup:
    """An axis's calls, summed (autopar.cost.comm.Volume), and the group they run on."""

    volume: Volume
    group: Group | None
    crosses_node: np.ndarray | None = None

    def traffic(self, links: Links, dispatch=None) -> Traffic:
        return Traffic(self.volume.handed, seconds(self.volume, self.group, links, self.crosses_node, dispatch))


class CommVolumes(NamedTuple):
    """What every axis sends on which group: nothing here depends on a performance profile, so a
    search sums the calls once per plan and prices them once per profile (`comm_terms`)."""

    stats: OnGroup  # MoE aux-loss statistics, booked on cp when cp > 1, else on tp
    tp: OnGroup
    cp: OnGroup  # the K/V exchange of context parallelism
    cp_grad: OnGroup  # the backward's dK/dV exchange
    ep: OnGroup
    pp: OnGroup
    tp_step: OnGroup
    dense_reduce: OnGroup
    dense_gather: OnGroup
    expert_reduce: OnGroup | None  # None: a dense model
    expert_gather: OnGroup | None
    on_cp: np.ndarray
    dense_replicas: OnGroup | None = None  # hybrid sharding: the shards' all-reduce across their copies


def comm_volumes(
    x: PlanArrays,
    model: ModelSpec,
    gpus_per_node: int,
    prm: RankParams,
    with_bytes: bool = True,
    sp_regather: float = 0.0,
    pp_scatter: float = 0.0,
    cp_facts: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> CommVolumes:
    """Every axis's calls (autopar.cost.comm), summed, on its group; `with_bytes=False` leaves the
    payload bytes at 0 (a search ranks by time only); `sp_regather`, `pp_scatter` and `cp_facts`:
    the trainer's facts (`sp_backward_regather`, autopar.cost.comm.tp_calls; `pp_scatter_gather`,
    pp_calls; `cp_kv_all_gather`, `cp_grad_fp32`, `attention_repeat_kv`, cp_calls)."""
    gpn = gpus_per_node
    vol = partial(volume, with_bytes=with_bytes)
    t, c, share, sp = x.tp, x.cp, x.recompute_share, x.sequence_parallel
    ranks = {"pp": x.pp, "dp": x.dp, "cp": c, "tp": t}  # MESH_ORDER's sizes
    expert = {"pp": x.pp, "edp": x.expert_dp, "ep": x.ep, "etp": x.etp}  # EXPERT_MESH_ORDER's
    tp_group = place(t, group_stride(ranks, ("tp",)), gpn)
    # MoE aux-loss statistics over the ranks holding a sequence's tokens (cp x tp under SP): booked
    # on cp when cp > 1, else on tp (the built-in model names its group so: autopar.trial.parallelize)
    stat_n = c * np.where(sp, t, 1)
    stats = OnGroup(
        vol(moe_stat_calls(model, x.micro_batch, stat_n, x.moe_layers, share), stat_n),
        place(stat_n, group_stride(ranks, ("cp", "tp")), gpn),
    )
    layers = (x.dense_layers, x.moe_layers, x.has_embedding, x.has_head)
    stage = (model, x.tokens, t, sp, x.pp, x.vpp, x.rank, x.act_bytes, pp_scatter)
    calls = tp_calls(model, x.tokens, sp, *layers, share, x.etp, x.act_bytes, sp_regather) + pp_gather_calls(*stage)
    tp = OnGroup(vol(calls, t), tp_group)
    cp_group = place(c, group_stride(ranks, ("cp",)), gpn)
    kv_calls, grad_calls = cp_calls(model, x.tokens, t, c, x.layers, share, x.act_bytes, *cp_facts)
    cp = OnGroup(vol(kv_calls, c), cp_group, cp_group.nodes > 1)
    cp_grad = OnGroup(vol(grad_calls, c), cp_group, cp_group.nodes > 1)
    load = expert_load(x) if model.moe else 1.0
    ep = OnGroup(
        vol(ep_calls(model, x.tokens, t, sp, x.moe_layers, load, x.act_bytes, share), x.ep),
        place(x.ep, group_stride(expert, ("ep",), EXPERT_MESH_ORDER), gpn),
    )
    # neighbouring stages are tp*cp*dp ranks apart: do two of them share a node?
    neighbours = place(2, group_stride(ranks, ("pp",)), gpn)
    pp = OnGroup(vol(pp_calls(*stage), x.pp), None, neighbours.nodes > 1)
    reductions = grad_reductions_per_step(x.table.zero_stage, x.microbatches, x.pp, x.dp_group)
    tp_step = OnGroup(
        vol(tp_step_calls(model, sp, x.dense_layers, x.moe_layers, x.has_head, x.grad_bytes, reductions), t), tp_group
    )
    # hybrid sharding: a shard group is dp_shard neighbouring ranks of the dp x cp group, its copies
    # are dp_shard such ranks apart
    dp_stride = group_stride(ranks, ("dp", "cp"))
    # FP8 parameter gather: the linear weights all-gathered in 1 byte, the embedding and head rows
    # in their own precision (Megatron-Core param_and_grad_buffer: FP8 params gather as FP8 bytes)
    dense_bytes = np.where(x.fp8_gather, 1.0 + prm.vocab / np.maximum(prm.dense, 1.0), x.weight_bytes)
    dense = _dp_volumes(x, prm.dense, x.dp_shard, place(x.dp_shard, dp_stride, gpn), vol, dense_bytes)
    calls = replica_calls(prm.dense, x.table.zero_stage, x.grad_bytes, x.microbatches, x.pp, x.dp_shard, x.dp_replicas)
    replicas = OnGroup(vol(calls, x.dp_replicas), place(x.dp_replicas, dp_stride * x.dp_shard, gpn))
    expert_dp: tuple[OnGroup | None, OnGroup | None] = (
        _dp_volumes(
            x,
            prm.expert,
            x.expert_dp,
            place(x.expert_dp, group_stride(expert, ("edp",), EXPERT_MESH_ORDER), gpn),
            vol,
            np.where(x.fp8_gather, 1.0, x.weight_bytes),
        )
        if model.moe
        else (None, None)
    )
    return CommVolumes(stats, tp, cp, cp_grad, ep, pp, tp_step, *dense, *expert_dp, c > 1, replicas)


def _dp_volumes(x: PlanArrays, params, group_size, group, vol, weight_bytes) -> tuple[OnGroup, OnGroup]:
    """(gradient reduction, parameter gathering) of `params` over one data-parallel group, the
    parameters gathered at `weight_bytes` each."""
    reduce, gather = dp_calls(params, x.table.zero_stage, x.grad_bytes, weight_bytes, x.microbatches, x.pp, group_size)
    return OnGroup(vol(reduce, group_size), group), OnGroup(vol(gather, group_size), group)


def comm_terms(
    x: PlanArrays,
    model: ModelSpec,
    cluster: ClusterSpec,
    prm: RankParams,
    with_bytes: bool = True,
    volumes: CommVolumes | None = None,
) -> CommTerms:
    """Every axis's calls priced on its group with the cluster's measured links (NCCL, or DeepEP's
    deduplicated kernels for the EP all-to-alls of plans with that dispatcher); `volumes`:
    `comm_volumes` of the same plans, when already summed."""
    k = cluster.constants
    facts = (k.sp_backward_regather, k.pp_scatter_gather, (k.cp_kv_all_gather, k.cp_grad_fp32, k.attention_repeat_kv))
    v = volumes if volumes is not None else comm_volumes(x, model, cluster.gpus_per_node, prm, with_bytes, *facts)
    links = Links.of(cluster)
    stats, tp, cp = v.stats.traffic(links), v.tp.traffic(links), v.cp.traffic(links)
    ep = v.ep.traffic(links)
    if model.moe:
        deepep = x.table.moe_dispatcher == DISPATCHER["deepep"]
        if deepep.any():
            mo = model.moe
            dedup = partial(
                deduplicated_seconds,
                top_k=mo.top_k,
                groups=mo.router_groups,
                group_topk=mo.router_group_topk,
                experts=mo.num_experts,
            )
            fused = v.ep.traffic(links, dedup).seconds
            ep = Traffic(ep.bytes, np.where(deepep, fused, ep.seconds))
    dense_n = dp_buckets(x, prm.dense, x.dp_shard, x.layers + x.has_embedding + x.has_head, k)
    reduce, gather = (
        _bucketed(v.dense_reduce, dense_n).traffic(links),
        _bucketed(v.dense_gather, dense_n).traffic(links),
    )
    if v.dense_replicas is not None:
        rep = _bucketed(v.dense_replicas, dense_n).traffic(links)
        reduce = Traffic(reduce.bytes + rep.bytes, reduce.seconds + rep.seconds)
    reduce_tail, gather_tail = reduce.seconds / dense_n, gather.seconds / dense_n
    if v.expert_reduce is not None:
        assert v.expert_gather is not None  # both, or neither (a dense model)
        expert_n = dp_buckets(x, prm.expert, x.expert_dp, x.moe_layers, k)
        er = _bucketed(v.expert_reduce, expert_n).traffic(links)
        eg = _bucketed(v.expert_gather, expert_n).traffic(links)
        reduce = Traffic(reduce.bytes + er.bytes, reduce.seconds + er.seconds)
        gather = Traffic(gather.bytes + eg.bytes, gather.seconds + eg.seconds)
        # the expert buffer's buckets run on their own group beside the dense ones, on the same NICs
        reduce_tail, gather_tail = reduce_tail + er.seconds / expert_n, gather_tail + eg.seconds / expert_n
    on_cp = v.on_cp
    groups = (v.dense_reduce, v.dense_gather, v.expert_reduce, v.expert_gather)
    copies = np.where(x.table.zero_stage == 3, fsdp_copy_bytes(groups), 0.0) * k.fsdp_copy_traffic
    return CommTerms(
        tp=Traffic(tp.bytes + np.where(on_cp, 0.0, stats.bytes), tp.seconds + np.where(on_cp, 0.0, stats.seconds)),
        cp=Traffic(cp.bytes + np.where(on_cp, stats.bytes, 0.0), cp.seconds + np.where(on_cp, stats.seconds, 0.0)),
        cp_grad=v.cp_grad.traffic(links),
        ep=ep,
        pp=v.pp.traffic(links),
        tp_step=v.tp_step.traffic(links),
        dp_reduce=reduce,
        dp_gather=gather,
        dp_reduce_tail=reduce_tail,
        dp_gather_tail=gather_tail,
        zero3_copy_bytes=copies,
    )


def fsdp_copy_bytes(groups: tuple[OnGroup | None, ...]) -> np.ndarray | float:
    """HBM bytes per step that FSDP2 moves copying each unsharded buffer of its collectives: every
    all-gather's output is copied out into the unit's parameters (`foreach_all_gather_copy_out`,
    torch.ops.fsdp.split_with_sizes_copy) and every reduction's unsharded gradients are copied into
    the reduce-scatter input (`foreach_reduce_scatter_copy_in`, torch.ops.fsdp.chunk_cat): a read
    and a write of the whole unsharded buffer per call (torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py, torch 2.13)."""
    total: np.ndarray | float = 0.0
    for on in groups:
        for c in on.volume.calls if on is not None else ():
            total = total + 2.0 * c.full_bytes * np.asarray(c.count, dtype=float)
    return total


def dp_buckets(x: PlanArrays, params, group_size, units, k) -> np.ndarray:
    """How many calls a data-parallel reduction (and gathering) of `params` is issued as: from
    ZeRO-2 up on a trainer that shards by wrapped unit (FSDP, Megatron-FSDP: `dp_unit_sharding`) one
    per unit (`units`: the rank's layers, embedding and head), else one per gradient bucket of the
    trainer's size (`dp_bucket_params`, Megatron's growing with the group: max(40 M, 1 M x dp)
    parameters)."""
    size = np.maximum(k.dp_bucket_params, k.dp_bucket_params_per_rank * np.asarray(group_size, dtype=float))
    by_size = np.maximum(1.0, np.ceil(np.asarray(params, dtype=float) / size))
    per_unit = (x.table.zero_stage >= 2) & (np.asarray(k.dp_unit_sharding) > 0)
    return np.where(per_unit, np.maximum(units, 1.0), by_size)


def _bucketed(on: OnGroup, n) -> OnGroup:
    """The same calls issued as `n` equal calls each (the payload is unchanged; each call is priced
    at its own message size and latency)."""
    calls = tuple(Call(c.kind, c.full_bytes / n, c.count * n) for c in on.volume.calls)
    return OnGroup(Volume(on.volume.handed, calls), on.group, on.crosses_node)
