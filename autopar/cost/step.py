"""Step time from the per-microbatch and per-step terms (vectorised).

Each rank's time per microbatch = compute + the exposed TP, CP, EP and PP communication; the
pipeline runs at the pace of its slowest stage, so pipeline time = m * pace / (1 - bubble
fraction) (Narayanan et al. 2021, Megatron-LM at scale, sec. 2.2: the bubble is idle time on top of m steady
microbatches); then the exposed DP communication, the TP per-step reductions and the optimizer
step of the slowest rank.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost.comm_terms import CommTerms
from autopar.cost.compute import ComputeTerms
from autopar.cost.params import RankParams
from autopar.cost.pipeline import bubble_fraction
from autopar.cost.plan_arrays import PlanArrays
from autopar.spec.hardware import ClusterSpec

#: optimizer step traffic per parameter of the local optimizer shard: read grad (4), master,
#: m, v (12); write master, m, v (12) and the bf16 weight (2); plus grad zeroing (4)
OPTIMIZER_BYTES_PER_PARAM = 34.0


class Exposed(NamedTuple):
    """Seconds per microbatch of each costed rank: compute and the communication left exposed."""

    compute: np.ndarray
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    pp: np.ndarray

    def total(self) -> np.ndarray:
        return self.compute + self.tp + self.ep + self.cp + self.pp


class StepTerms(NamedTuple):
    per_microbatch: Exposed  # (C, n)
    time_per_microbatch: np.ndarray  # (C, n), -inf on ranks a plan does not have
    dp_exposed: np.ndarray  # (C, n) seconds per step
    optimizer: np.ndarray  # (C, n)
    tp_step: np.ndarray  # (C, n)
    pace_index: np.ndarray  # (n,) the costed row of the slowest stage
    tail_index: np.ndarray  # (n,) the costed row with the longest after-pipeline tail
    bubble_fraction: np.ndarray
    pipeline: np.ndarray  # m * pace / (1 - bubble)
    step: np.ndarray

    def at_pace(self, a) -> np.ndarray:
        """A (C, n) term on the slowest stage."""
        return _pick(a, self.pace_index, self.time_per_microbatch.shape)

    def at_tail(self, a) -> np.ndarray:
        """A (C, n) term on the rank with the longest tail."""
        return _pick(a, self.tail_index, self.time_per_microbatch.shape)


def _pick(a, index, shape) -> np.ndarray:
    return np.take_along_axis(np.broadcast_to(a, shape), index[None], 0)[0]


def exposed(x: PlanArrays, cluster: ClusterSpec, compute: ComputeTerms, comm: CommTerms) -> Exposed:
    """What overlap leaves exposed: TP under GEMMs with --tp-comm-overlap (Megatron's userbuffers
    overlap), EP and PP by their calibrated overlap fractions, and the CP ring under the attention
    of the chunk in hand: each of the cp - 1 ring steps sends a K/V block while the attention of
    the previous one runs, and the local step's attention hides nothing, so the ring is hidden
    under (cp - 1) / cp of the attention only (Liu et al. 2023, Ring Attention sec. 3)."""
    k = cluster.constants
    cp = x.cp.astype(float)
    return Exposed(
        compute=compute.total(),
        tp=comm.tp.seconds * (1 - k.tp_overlap * x.table.tp_comm_overlap),
        cp=np.maximum(0.0, comm.cp.seconds - compute.attention * (cp - 1) / cp),
        ep=comm.ep.seconds * (1 - k.ep_overlap * x.table.ep_comm_overlap),
        pp=comm.pp.seconds * (1 - k.pp_overlap),
    )


def dp_exposed(x: PlanArrays, cluster: ClusterSpec, compute_mb: np.ndarray, comm: CommTerms) -> np.ndarray:
    """DP communication left exposed per step: the gradient reduction overlaps the last
    microbatch's backward, the parameter gathering the first forward (Megatron
    --overlap-grad-reduce / --overlap-param-gather); ZeRO-3 (FSDP) gathers and reduces every
    microbatch under its compute. Backward = 2/3 of a microbatch's compute, forward 1/3: the
    backward does twice the forward's FLOPs (Megatron's FLOPs convention, autopar.cost.flops)."""
    k = cluster.constants
    reduce_t, gather_t = comm.dp_reduce.seconds, comm.dp_gather.seconds
    bwd_mb, fwd_mb = compute_mb * 2 / 3, compute_mb / 3
    return np.where(
        x.table.zero_stage == 3,
        np.maximum(0.0, reduce_t + gather_t - k.dp_overlap * x.microbatches * compute_mb),
        np.maximum(0.0, reduce_t - k.dp_overlap * bwd_mb) + np.maximum(0.0, gather_t - k.dp_overlap * fwd_mb),
    )


def optimizer_seconds(x: PlanArrays, cluster: ClusterSpec, prm: RankParams) -> np.ndarray:
    """Adam over the local optimizer shard, memory bound: OPTIMIZER_BYTES_PER_PARAM over HBM
    bandwidth (ZeRO-1+ shards it over the data-parallel group)."""
    sharded = x.table.zero_stage >= 1
    shard = prm.dense / np.where(sharded, x.dp_group, 1.0) + prm.expert / np.where(sharded, x.expert_dp, 1.0)
    return shard * OPTIMIZER_BYTES_PER_PARAM / (cluster.gpu.hbm_gbps * 1e9)


def step_terms(
    x: PlanArrays, cluster: ClusterSpec, prm: RankParams, compute: ComputeTerms, comm: CommTerms
) -> StepTerms:
    mb = exposed(x, cluster, compute, comm)
    t_mb = np.where(x.active, mb.total(), -np.inf)
    dp = dp_exposed(x, cluster, mb.compute, comm)
    optimizer = optimizer_seconds(x, cluster, prm)
    pace_index = np.argmax(t_mb, axis=0)
    pace = _pick(t_mb, pace_index, t_mb.shape)
    m = x.microbatches
    f = bubble_fraction(x.table.schedule, x.pp, m, x.vpp)
    pipeline = m * pace / (1 - f)
    tail = np.where(x.active, dp + optimizer + comm.tp_step.seconds, -np.inf)
    tail_index = np.argmax(tail, axis=0)
    return StepTerms(
        per_microbatch=mb,
        time_per_microbatch=t_mb,
        dp_exposed=dp,
        optimizer=optimizer,
        tp_step=comm.tp_step.seconds,
        pace_index=pace_index,
        tail_index=tail_index,
        bubble_fraction=f,
        pipeline=pipeline,
        step=pipeline + _pick(tail, tail_index, tail.shape),
    )
