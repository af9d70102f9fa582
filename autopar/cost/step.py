"""Step time from the per-microbatch and per-step terms (vectorised), in two steps as the compute:
`step_inputs` gathers what no trainer constant changes (raw compute seconds, communication seconds
at the measured link rates, the schedule), `assemble_step` applies the profile's constants. A fit
of the constants re-runs the assembly only, on the inputs of every case at once
(autopar.calibration.profile_fit).

Each rank's time per microbatch = compute + the exposed TP, CP, EP and PP communication; the
pipeline runs at the pace of its slowest stage, so pipeline time = m * pace / (1 - bubble
fraction) (Narayanan et al. 2021, Megatron-LM at scale, sec. 2.2: the bubble is idle time on top of m
steady microbatches); then the exposed DP communication, the TP per-step reductions, the optimizer
step and the optimizer share offloaded to the host (autopar.cost.offload) of the slowest rank.
Offloaded activations add what their host copies leave exposed to each microbatch
(autopar.cost.activation_offload).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost.activation_offload import copy_seconds, exposed_copies
from autopar.cost.comm_terms import CommTerms, dp_buckets
from autopar.cost.compute import RawCompute, assemble_compute
from autopar.cost.kernels import hbm_rate
from autopar.cost.offload import offload_seconds
from autopar.cost.params import RankParams
from autopar.cost.pipeline import bubble_fraction, steady_fraction
from autopar.cost.plan_arrays import PlanArrays
from autopar.spec.behaviour import behaviour_of, shared_figures
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.table import DISPATCHER

#: parameter tensors of one transformer layer in the Llama-style models of the trainers that slice
#: them rank by rank: fused qkv and gate-up projections, output and down projections, two norms
#: (nanotron/models/llama.py: qkv_proj, o_proj, gate_up_proj, down_proj, input_layernorm,
#: post_attention_layernorm)
TENSORS_PER_LAYER = 6.0

#: optimizer step traffic per parameter of the local optimizer shard: read grad (4), master,
#: m, v (12); write master, m, v (12) and the bf16 weight (2); plus grad zeroing (4)
OPTIMIZER_BYTES_PER_PARAM = 34.0


class StepInputs(NamedTuple):
    """What the step assembly reads: (C, n) per costed rank, (n,) per plan."""

    raw: RawCompute  # (C, n) seconds per microbatch at the published kernel rates
    tp: np.ndarray  # (C, n) seconds per microbatch of each axis at the measured link rates
    cp: np.ndarray  # the K/V exchange of context parallelism
    cp_grad: np.ndarray  # its backward's dK/dV exchange
    ep: np.ndarray
    pp: np.ndarray
    tp_step: np.ndarray  # (C, n) seconds per step
    dp_reduce: np.ndarray
    dp_gather: np.ndarray
    dp_reduce_tail: np.ndarray  # (C, n) seconds of the last gradient bucket's reduction
    dp_gather_tail: np.ndarray  # (C, n) seconds of the first parameter bucket's gathering
    optimizer: np.ndarray  # (C, n) seconds per step
    #: (C, n) host-launched copies of a trainer that moves ZeRO-1 shards rank by rank
    #: (`zero1_rank_copies`): after the optimizer step, and in the last backward's gradient hooks
    zero1_gather_launches: np.ndarray
    zero1_reduce_launches: np.ndarray
    offload: np.ndarray  # (C, n) seconds per step of the optimizer share offloaded to the host
    #: (C, n) seconds per microbatch of the offloaded activations' copies, each direction
    act_copies: np.ndarray
    forward_share: np.ndarray  # (C, n) share of a microbatch's compute in its forward
    active: np.ndarray  # (C, n) the plan has this rank
    tp_overlap_on: np.ndarray  # (n,) --tp-comm-overlap
    tp_backward_share: np.ndarray  # (C, n) share of the TP seconds in the backward pass
    tp_async_backward: np.ndarray  # (n,) the trainer overlaps the backward's TP collectives
    #: (n,) share of the EP all-to-alls that can overlap another microbatch's compute: the plan
    #: overlaps them, in the chunks of the 1F1B steady state (autopar.cost.pipeline.steady_fraction)
    ep_overlap_on: np.ndarray
    #: (n,) share of the SMs overlapped communication takes from the compute beside it: NCCL's
    #: collectives, and the EP dispatcher's (DeepEP's kernels or NCCL's: autopar.spec.behaviour)
    comm_sm_share: np.ndarray
    dispatch_sm_share: np.ndarray
    tp_sm_share: np.ndarray  # userbuffer SMs under --tp-comm-overlap, else NCCL's
    zero3: np.ndarray  # (n,)
    cp_size: np.ndarray  # (n,)
    microbatches: np.ndarray  # (n,)
    bubble_fraction: np.ndarray  # (n,)


class Exposed(NamedTuple):
    """Seconds per microbatch of each costed rank: compute and the communication left exposed."""

    compute: np.ndarray
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    pp: np.ndarray
    act_offload: np.ndarray  # the offloaded activations' host copies

    def total(self) -> np.ndarray:
        return self.compute + self.tp + self.ep + self.cp + self.pp + self.act_offload


class StepTerms(NamedTuple):
    per_microbatch: Exposed  # (C, n)
    time_per_microbatch: np.ndarray  # (C, n), -inf on ranks a plan does not have
    dp_exposed: np.ndarray  # (C, n) seconds per step
    optimizer: np.ndarray  # (C, n)
    offload: np.ndarray  # (C, n)
    tp_step: np.ndarray  # (C, n)
    pace_index: np.ndarray  # (n,) the costed row of the slowest stage
    tail_index: np.ndarray  # (n,) the costed row with the longest after-pipeline tail
    bubble_fraction: np.ndarray
    pipeline: np.ndarray  # m * pace / (1 - bubble)
    step: np.ndarray
    recompute_flops: np.ndarray  # (C, n)

    def at_pace(self, a) -> np.ndarray:
        """A (C, n) term on the slowest stage."""
        return _pick(a, self.pace_index, self.time_per_microbatch.shape)

    def at_tail(self, a) -> np.ndarray:
        """A (C, n) term on the rank with the longest tail."""
        return _pick(a, self.tail_index, self.time_per_microbatch.shape)


def _pick(a, index, shape) -> np.ndarray:
    return np.take_along_axis(np.broadcast_to(a, shape), index[None], 0)[0]


def step_inputs(
    x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, prm: RankParams, raw: RawCompute, comm: CommTerms
) -> StepInputs:
    t = x.table
    overlap = t.ep_comm_overlap.astype(bool) & (x.ep > 1)
    # overlapped communication runs on SMs the compute beside it then lacks: NCCL's kernels 8-32
    # (arXiv 2603.07685 sec. 4.1.7) of the GPU's SMs; DeepEP's 20 cost the GEMMs "roughly 20%" on an
    # H100 (sec. 4.2.3), more than their share, and as much per SM taken on another GPU
    sms = behaviour_of(cluster.gpu).sms
    nccl_share = shared_figures().nccl_sms / sms
    dispatch = shared_figures().dispatch
    deepep_share = np.minimum(dispatch.overhead_per_sm_share * dispatch.sms / sms, 1.0)
    gather_launches, reduce_launches = zero1_copy_launches(x, model, cluster, prm)
    regather = np.where(x.sequence_parallel, cluster.constants.sp_backward_regather / 2.0, 0.0)
    # FSDP2's copies into and out of its collectives' buffers run as memory-bound kernels beside the
    # microbatches' own (autopar.cost.comm_terms.fsdp_copy_bytes)
    copies = np.asarray(comm.zero3_copy_bytes) / x.microbatches / hbm_rate(cluster)
    return StepInputs(
        raw=raw._replace(traffic=raw.traffic + copies),
        tp=comm.tp.seconds,
        cp=comm.cp.seconds,
        cp_grad=comm.cp_grad.seconds,
        ep=comm.ep.seconds,
        pp=comm.pp.seconds,
        tp_step=comm.tp_step.seconds,
        dp_reduce=comm.dp_reduce.seconds,
        dp_gather=comm.dp_gather.seconds,
        dp_reduce_tail=comm.dp_reduce_tail,
        dp_gather_tail=comm.dp_gather_tail,
        optimizer=optimizer_seconds(x, cluster, prm),
        zero1_gather_launches=gather_launches,
        zero1_reduce_launches=reduce_launches,
        offload=offload_seconds(x, cluster, prm),
        act_copies=copy_seconds(x, model, cluster),
        # a microbatch runs forward 1, backward 2 and the recomputed forward (Megatron's FLOPs, autopar.cost.flops)
        forward_share=1.0 / (3.0 + x.recompute_share),
        active=x.active,
        tp_overlap_on=t.tp_comm_overlap.astype(float),
        # TP calls run once per forward, backward and recomputed forward, and the backward re-gathers
        # the sequence-parallel inputs where the trainer does: half a pass more (autopar.cost.comm.tp_calls)
        tp_backward_share=(1.0 + regather) / (2.0 + x.recompute_share + regather),
        tp_async_backward=np.full(len(t), cluster.constants.tp_async_backward),
        ep_overlap_on=overlap * steady_fraction(t.schedule, x.pp, x.microbatches, x.vpp),
        comm_sm_share=np.full(len(t), nccl_share),
        tp_sm_share=np.where(t.tp_comm_overlap.astype(bool), shared_figures().ub_sms / sms, nccl_share),
        dispatch_sm_share=np.where(t.moe_dispatcher == DISPATCHER["deepep"], deepep_share, nccl_share),
        zero3=t.zero_stage == 3,
        cp_size=x.cp.astype(float),
        microbatches=x.microbatches,
        bubble_fraction=bubble_fraction(t.schedule, x.pp, x.microbatches, x.vpp),
    )


def _with_contention(comm, hidden, sm_share):
    """Communication left exposed when `hidden` seconds of it run beside compute: the rest, plus the
    compute those seconds slow down by taking `sm_share` of the SMs."""
    hidden = np.minimum(hidden, comm)
    return comm - hidden + hidden * sm_share


def _tp_hidden_share(inp: StepInputs, k) -> np.ndarray:
    """Share of the TP seconds hidden: every pass's at `tp_overlap` with --tp-comm-overlap, else the
    backward's at `tp_backward_overlap` where the trainer launches it asynchronously."""
    on = inp.tp_overlap_on
    backward = inp.tp_backward_share * k.tp_backward_overlap * inp.tp_async_backward
    return on * k.tp_overlap + (1 - on) * backward


def exposed(inp: StepInputs, k) -> Exposed:
    """What overlap leaves exposed: TP under GEMMs with --tp-comm-overlap (Megatron's userbuffers
    overlap), EP (under another microbatch's compute) and PP by their overlap fractions, each
    hiding at most the compute it runs beside (the GEMMs for TP, a microbatch's compute for EP), and
    and CP under the attention of the block in hand (`_cp_exposed`). Hidden communication still
    costs the compute beside it the SMs it runs on."""
    compute = assemble_compute(inp.raw, k)
    s = inp.comm_sm_share
    return Exposed(
        compute=compute.total(),
        tp=_with_contention(inp.tp, np.minimum(inp.tp, compute.gemm) * _tp_hidden_share(inp, k), inp.tp_sm_share),
        cp=_cp_exposed(inp, k, compute.attention),
        ep=_with_contention(
            inp.ep, np.minimum(inp.ep, compute.total()) * k.ep_overlap * inp.ep_overlap_on, inp.dispatch_sm_share
        ),
        pp=_with_contention(inp.pp, inp.pp * k.pp_overlap, s),
        act_offload=exposed_copies(inp.act_copies, compute.total(), inp.forward_share),
    )


def _cp_exposed(inp: StepInputs, k, attention: np.ndarray) -> np.ndarray:
    """CP's exchanges left exposed. A ring sends each of the cp - 1 K/V (and dK/dV) blocks while the
    attention of the previous one runs, and the local block's attention hides nothing: hidden under
    (cp - 1) / cp of the attention (Liu et al. 2023, Ring Attention sec. 3). PyTorch's all-gather
    (`cp_kv_all_gather`) is issued with the local block and waited before the next, so each pass's
    K/V hides under 1 / cp of its attention only, and the backward's dK/dV ring under (cp - 1) / cp
    of the backward's (twice the forward's: autopar.cost.flops). Meta's all-gather CP
    (cp_ring_overlap 0) hides none of it."""
    cp, s, g = inp.cp_size, inp.comm_sm_share, k.cp_kv_all_gather
    window = attention * k.cp_ring_overlap
    ring = _with_contention(inp.cp + inp.cp_grad, window * (cp - 1) / cp, s)
    backward = window * 2.0 * inp.forward_share
    gathered = _with_contention(inp.cp, window / cp, s) + _with_contention(inp.cp_grad, backward * (cp - 1) / cp, s)
    return g * gathered + (1.0 - g) * ring


def dp_exposed(inp: StepInputs, k, compute_mb: np.ndarray) -> np.ndarray:
    """DP communication left exposed per step. It is issued bucket by bucket as the backward
    produces the gradients (Megatron --overlap-grad-reduce, PyTorch DDP's bucket hooks, FSDP's
    per-unit reduce-scatter): every bucket but the last overlaps the last microbatch's backward,
    and the parameter gathering every bucket but the first the first forward (Megatron
    --overlap-param-gather; FSDP prefetches one unit ahead); ZeRO-3 (FSDP) gathers and reduces
    every microbatch under its compute. `dp_overlap` is the share of that window the trainer's
    overlap reaches. Backward = 2/3 of a microbatch's compute, forward 1/3: the backward does
    twice the forward's FLOPs (Megatron's FLOPs convention, autopar.cost.flops). Hidden
    communication still costs the compute beside it the SMs it runs on."""
    reduce_t, gather_t = inp.dp_reduce, inp.dp_gather
    reduce_tail, gather_tail = np.minimum(inp.dp_reduce_tail, reduce_t), np.minimum(inp.dp_gather_tail, gather_t)
    bwd_mb, fwd_mb = compute_mb * 2 / 3, compute_mb / 3
    s = inp.comm_sm_share
    tails = reduce_tail + gather_tail
    zero3 = _with_contention(reduce_t + gather_t - tails, k.dp_overlap * inp.microbatches * compute_mb, s)
    other = _with_contention(reduce_t - reduce_tail, k.dp_overlap * bwd_mb, s) + _with_contention(
        gather_t - gather_tail, k.dp_overlap * fwd_mb, s
    )
    return tails + np.where(inp.zero3, zero3, other)


def zero1_copy_launches(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, prm: RankParams):
    """(after the optimizer step, in the last backward) host launches of a ZeRO-1 that slices every
    parameter over the dp ranks and copies slice by slice (nanotron, `zero1_rank_copies`; other
    trainers move flat buckets and launch none of these):
    - the parameter all-gather flattens one output per rank, PyTorch copies each rank's part out of
      its flat buffer, and nanotron copies every rank's slice of every parameter tensor back:
      dp x (tensors + 2);
    - each gradient bucket's reduce-scatter flattens one input per rank, which PyTorch copies into
      its flat buffer again: 2 x dp per bucket.
    Zero where the trainer does not, or without ZeRO-1 over more than one rank."""
    dp = np.asarray(x.dp_shard, dtype=float)
    on = (x.table.zero_stage == 1) & (dp > 1)
    head_tensors = 1.0 + (0.0 if model.tied_embeddings else 1.0)  # final norm, untied LM head
    tensors = TENSORS_PER_LAYER * x.layers + x.has_embedding + head_tensors * x.has_head
    units = x.layers + x.has_embedding + x.has_head
    buckets = dp_buckets(x, prm.dense, dp, units, cluster.constants)
    gather = np.where(on, dp * (tensors + 2.0), 0.0)
    reduce = np.where(on, 2.0 * dp * buckets, 0.0)
    return gather, reduce


def optimizer_seconds(x: PlanArrays, cluster: ClusterSpec, prm: RankParams) -> np.ndarray:
    """Adam over the local optimizer shard, memory bound: OPTIMIZER_BYTES_PER_PARAM at the achieved
    HBM bandwidth (ZeRO-1+ shards it over the data-parallel group); the share offloaded to the
    host (--optimizer-offload) is stepped by the CPU instead (autopar.cost.offload)."""
    sharded = x.table.zero_stage >= 1
    shard = prm.dense / np.where(sharded, x.dp_shard, 1.0) + prm.expert / np.where(sharded, x.expert_dp, 1.0)
    return shard * (1.0 - x.table.optimizer_offload) * OPTIMIZER_BYTES_PER_PARAM / hbm_rate(cluster)


def zero1_copy_seconds(inp: StepInputs, k) -> tuple[np.ndarray, np.ndarray]:
    """(after the optimizer step, after the last backward) seconds of a trainer's rank-by-rank
    ZeRO-1 copies (`zero1_copy_launches`) at the host's launch cost. The gathering runs inside the
    optimizer step with the GPU idle: all of it is exposed. The gradient hooks launch theirs during
    the last microbatch's backward, whose own host launches leave the GPU work ahead of the host
    as slack: only what exceeds that slack is exposed."""
    launch_s = k.zero1_rank_copies * k.host_launch_us * 1e-6
    c = assemble_compute(inp.raw, k)
    backward_share = 1.0 - inp.forward_share
    slack = np.maximum(c.gemm + c.attention + c.elementwise + c.launch - c.host, 0.0) * backward_share
    gather = inp.zero1_gather_launches * launch_s
    reduce = np.maximum(inp.zero1_reduce_launches * launch_s - slack, 0.0)
    return gather, reduce


def assemble_step(inp: StepInputs, k) -> StepTerms:
    """The step with the profile's constants `k` (floats, or per-plan arrays)."""
    mb = exposed(inp, k)
    t_mb = np.where(inp.active, mb.total(), -np.inf)
    gather_host, reduce_host = zero1_copy_seconds(inp, k)
    dp = dp_exposed(inp, k, mb.compute) + reduce_host
    optimizer = inp.optimizer + gather_host
    pace_index = np.argmax(t_mb, axis=0)
    pace = _pick(t_mb, pace_index, t_mb.shape)
    m, f = inp.microbatches, inp.bubble_fraction
    pipeline = m * pace / (1 - f)
    tail = np.where(inp.active, dp + optimizer + inp.offload + inp.tp_step, -np.inf)
    tail_index = np.argmax(tail, axis=0)
    return StepTerms(
        per_microbatch=mb,
        time_per_microbatch=t_mb,
        dp_exposed=dp,
        optimizer=optimizer,
        offload=inp.offload,
        tp_step=inp.tp_step,
        pace_index=pace_index,
        tail_index=tail_index,
        bubble_fraction=f,
        pipeline=pipeline,
        step=pipeline + _pick(tail, tail_index, tail.shape),
        recompute_flops=inp.raw.recompute_flops,
    )


def step_terms(
    x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, prm: RankParams, raw: RawCompute, comm: CommTerms
) -> StepTerms:
    return assemble_step(step_inputs(x, model, cluster, prm, raw, comm), cluster.constants)
