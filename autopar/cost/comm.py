"""Communication per axis: which collectives a GPU issues, their payload bytes and their time.

Each axis is described as a list of collective calls (kind, full buffer bytes, count); the payload
bytes (what a byte-counting hook on the running model sees: the input buffer of each call, sends
only for P2P) and the time (each call at the measured rate of its message size,
autopar.cost.collectives) both come from that one list, so they cannot drift apart.

Sources: TP + SP collectives per layer: Megatron-LM (Shoeybi et al. 2019 f/g operators; Korthikanti
et al. 2022 §4.2.2: SP turns each all-reduce into reduce-scatter + all-gather); vocab-parallel
embedding and cross-entropy: Shoeybi et al. 2019 sec. 3; CP ring K/V exchange:
Liu et al. 2023 Ring Attention, Megatron/TE p2p CP (backward sends K/V and dK/dV); EP dispatch and
combine all-to-all, forward and backward: GShard (Lepikhin et al. 2020), Megatron-Core's alltoall
dispatcher; PP send/recv per microbatch per boundary, v times with interleaving: Narayanan et al.
2021 sec. 2.2.2;
DP all-reduce / reduce-scatter + all-gather / FSDP per-microbatch gathers: ZeRO paper (Rajbhandari et al. 2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from autopar.cost.collectives import Group, Links, collective_seconds, p2p_seconds
from autopar.cost.runs import on_runs
from autopar.spec.sharding import MODEL_PLAN, SEQUENCE_STYLES, block_plan, sync_points


@dataclass
class Call:
    kind: str  # "all_reduce" | "reduce_scatter" | "all_gather" | "all_to_all" | "send"
    full_bytes: np.ndarray  # S: the whole buffer (gathered size for all-gather)
    count: np.ndarray


def payload(call: Call, group_size) -> np.ndarray:
    """Bytes this GPU hands to the call: an all-gather's input is its 1/n shard. A group of one
    GPU issues no collective (Megatron skips them), so it hands over nothing."""
    n = np.asarray(group_size, dtype=float)
    s = call.full_bytes / (n if call.kind == "all_gather" else 1.0)
    return np.where(n > 1, s * call.count, 0.0)


class Volume(NamedTuple):
    """A list of calls on one group: the payload this GPU hands to them, and the calls that issue
    anything (each priced at its own message size: autopar.cost.collectives)."""

    handed: np.ndarray | float  # payload bytes this GPU hands to the calls (0 when not counted)
    calls: tuple[Call, ...]


def volume(calls: list[Call], group_size, with_bytes: bool = True) -> Volume:
    """The calls' payload and the calls themselves; `with_bytes=False` leaves the payload at 0 (a
    search ranks by time)."""
    n = np.asarray(group_size, dtype=float)
    handed = 0.0
    kept = []
    for c in calls:
        if np.isscalar(c.count) and c.count == 0:
            continue
        kept.append(c)
        if with_bytes:
            sent = c.full_bytes * c.count
            handed = handed + (sent / n if c.kind == "all_gather" else sent)
    return Volume(np.where(n > 1, handed, 0.0) if with_bytes else 0.0, tuple(kept))


def seconds(v: Volume, group, links: Links, crosses_node=None, dispatch=None) -> np.ndarray:
    """The time of a volume's calls on their group: each call kind at the measured rate of its
    message size; `dispatch` prices the all-to-alls instead of NCCL's (DeepEP's deduplicated
    kernels: autopar.cost.collectives.deduplicated_seconds). Each call is priced once per run of
    plans with the same buffer and group (autopar.cost.runs)."""
    out = np.zeros(())
    for c in v.calls:
        if c.kind == "send":
            t = on_runs(partial(_p2p, links), c.count, c.full_bytes, crosses_node)
        else:
            price = dispatch if c.kind == "all_to_all" and dispatch is not None else partial(collective_seconds, c.kind)
            t = on_runs(
                partial(_on_group, price, links), c.count, c.full_bytes, group.size, group.per_node, group.nodes
            )
        out = out + t
    return out


def _times(count, seconds: np.ndarray) -> np.ndarray:
    """`count` calls of `seconds` each (none where the count is 0)."""
    return np.where(np.asarray(count) > 0, seconds * count, 0.0)


def _p2p(links: Links, count, nbytes, crosses_node) -> np.ndarray:
    return _times(count, p2p_seconds(nbytes, crosses_node, links))


def _on_group(price, links: Links, count, nbytes, size, per_node, nodes) -> np.ndarray:
    """`count` calls of `price(nbytes, group, links)`, the group given as its arrays (`on_runs`
    slices them)."""
    return _times(count, price(nbytes, Group(size, per_node, nodes), links))


def traffic(calls: list[Call], group_size, group, links: Links, crosses_node=None, dispatch=None):
    """(payload bytes, time) of a list of calls on one group."""
    v = volume(calls, group_size)
    return v.handed, seconds(v, group, links, crosses_node, dispatch)


def tp_calls(
    model,
    tokens,
    sp,
    dense_layers,
    moe_layers,
    has_embedding,
    has_head,
    recompute_share,
    etp,
    act_bytes,
    backward_regather=0.0,
) -> list[Call]:
    """TP collectives of one GPU for one microbatch. The sync points per block come from the
    sharding tables (autopar.spec.sharding) the built-in model applies: each row-parallel module
    is one sync point, costing per pass an all-reduce (no SP) or an all-gather + reduce-scatter
    (SP); passes = forward, backward, and the recomputed forward of the `recompute_share` of
    layers fully recomputed. Expert-TP (etp > 1) also gathers the k routed copies on MoE layers
    (and reduce-scatters their partial outputs), after gathering each rank's per-expert row counts
    (E int64 per forward; Megatron-Core `MoEAlltoAllTokenDispatcher` with tp > 1).
    Embedding output, LM-head input and the three fp32 reductions of the vocab-parallel
    cross-entropy come on top. Under SP the embedding's output reduce-scatter has an all-gather of
    its gradient in the backward (Megatron `reduce_scatter_to_sequence_parallel_region`, whose
    backward is `_gather_along_first_dim`; measured on the built-in model).
    `backward_regather` 1: the trainer keeps only its sequence shard of each column-parallel input
    and all-gathers it again in the backward for the weight gradient, one more all-gather per sync
    point per backward (Megatron-Core LinearWithGradAccumulationAndAsyncCommunication.backward,
    megatron/core/tensor_parallel/layers.py; Transformer Engine's LayerNormLinear likewise); the
    built-in model's DTensor keeps the gathered input (0)."""
    s = tokens * model.hidden_size * act_bytes
    moe = model.moe
    shared = moe is not None and moe.num_shared_experts > 0
    k = moe.top_k if moe is not None else 1
    passes = 2.0 + recompute_share
    dense_sync = sync_points(block_plan(moe_layer=False, shared_experts=False))
    moe_sync = sync_points(block_plan(moe_layer=True, shared_experts=shared))
    sync = (dense_layers * dense_sync + moe_layers * moe_sync) * passes
    sync_k = moe_layers * (etp > 1) * passes
    on_sp, off_sp = np.where(sp, 1.0, 0.0), np.where(sp, 0.0, 1.0)
    return [
        Call("all_gather", s, (sync + sync / passes * backward_regather) * on_sp),
        Call("reduce_scatter", s, sync * on_sp),
        Call("all_reduce", s, sync * off_sp),
        Call("all_gather", s * k, sync_k * on_sp),
        Call("reduce_scatter", s * k, sync_k * on_sp),
        Call(
            "all_gather",
            np.full_like(np.asarray(s, dtype=float), moe.num_experts * COUNT_BYTES if moe else 0.0)
            * np.asarray(etp, dtype=float),
            moe_layers * (etp > 1) * (1.0 + recompute_share),
        ),
        Call("reduce_scatter", s, has_embedding * on_sp),
        Call("all_gather", s, has_embedding * on_sp),
        Call("all_reduce", s, has_embedding * off_sp),
        Call("all_gather", s, has_head * on_sp),
        Call("reduce_scatter", s, has_head * on_sp),
        Call("all_reduce", s, has_head * off_sp),
        Call("all_reduce", tokens * 4.0, has_head * 3.0),
    ]


def tp_step_calls(model, sp, dense_layers, moe_layers, has_head, grad_bytes, reductions=1.0) -> list[Call]:
    """TP collectives of one GPU per step that do not scale with the microbatches: under SP the
    gradients of the sequence-parallel parameters (the modules styled "sequence"/"sequence-tokens"
    in the sharding tables: the block norms, the final norm, the MoE router) are partial sums over
    the sequence shards, all-reduced over the TP group with each gradient reduction: once per step
    after the last microbatch (Megatron `finalize_model_grads` -> `_allreduce_layernorm_grads`,
    one coalesced buffer, which also takes the router weight), or `reductions` times when data
    parallelism reduces every microbatch (`grad_reductions_per_step`). Measured on the built-in
    model (DTensor reduces them at the optimizer step, or at each FSDP2 reduce-scatter). Without
    SP every TP rank computes the same full gradient: nothing to reduce."""
    moe = model.moe
    shared = moe is not None and moe.num_shared_experts > 0
    dense_seq = _sequence_params(block_plan(moe_layer=False, shared_experts=False), model)
    moe_seq = _sequence_params(block_plan(moe_layer=True, shared_experts=shared), model) if moe is not None else 0
    head_seq = _sequence_params(MODEL_PLAN, model)
    params = dense_layers * dense_seq + moe_layers * moe_seq + has_head * head_seq
    return [Call("all_reduce", params * grad_bytes, np.where(sp, 1.0, 0.0) * reductions)]


def replica_calls(params, zero_stage, grad_bytes, m, pp, shard, replicas) -> list[Call]:
    """Hybrid sharding: each gradient reduction, after its reduce-scatter within the shard group,
    all-reduces the shard (1/shard of the gradients) across the `replicas` copies of that shard
    (PyTorch FSDP2 HSDP: reduce-scatter, then all-reduce over the replicate mesh dimension,
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce; Megatron-Core's partial
    distributed optimizer: reduce-scatter within an instance, all-reduce across the instances,
    megatron/core/distributed/param_and_grad_buffer.py). None without replicas."""
    reductions = grad_reductions_per_step(zero_stage, m, pp, shard)
    count = np.where(np.asarray(replicas) > 1, reductions, 0.0)
    return [Call("all_reduce", params * grad_bytes / np.asarray(shard, dtype=float), count)]


def grad_reductions_per_step(zero_stage, m, pp, dp_group_size) -> np.ndarray:
    """How often a GPU's gradients are reduced over data parallelism per step: once, after the last
    microbatch (ZeRO-0/1, and every stage under pipeline parallelism, where
    torch.distributed.pipelining defers the reduction to the end of the step), or after every
    microbatch (ZeRO-2/3 without pipelining, to keep the gradients sharded)."""
    per_mb = (np.asarray(zero_stage) >= 2) & (np.asarray(pp) == 1) & (np.asarray(dp_group_size) > 1)
    return np.where(per_mb, np.asarray(m, dtype=float), 1.0)


def _sequence_params(plan, model) -> int:
    """Parameters of the modules a sharding table runs sequence-parallel: a norm has `norm_params`
    weights, the router hidden x experts (autopar.spec.model.ModelSpec.layer_params)."""
    total = 0
    for name, style in plan.items():
        if style in SEQUENCE_STYLES:
            total += model.hidden_size * model.moe.num_experts if name.endswith("router") else model.norm_params
    return total


def cp_calls(
    model, tokens, tp, cp, layers, recompute_share, act_bytes, all_gather=0.0, grad_fp32=0.0, repeat_kv=0.0
) -> tuple[list[Call], list[Call]]:
    """(K/V exchange, dK/dV exchange) of context parallelism per microbatch. Ring attention (Liu et
    al. 2023; TE/Megatron p2p CP): every attention pass (the forward, the backward and the
    recomputed forward) passes the local K/V block cp - 1 times, and the backward passes dK/dV
    cp - 1 times. `all_gather` 1 (PyTorch's context_parallel, `cp_kv_all_gather`): each pass
    all-gathers the cp blocks once instead (the same bytes received). `grad_fp32` 1: dK/dV travel
    in fp32 (`cp_grad_fp32`); `repeat_kv` 1: K/V expanded to the query heads first
    (`attention_repeat_kv`)."""
    repeat = np.where(np.asarray(repeat_kv) > 0, model.num_attention_heads / model.kv_heads_effective, 1.0)
    kv = tokens * (model.k_size + model.v_size) * repeat / np.asarray(tp, dtype=float) * act_bytes
    c = np.asarray(cp, dtype=float)
    steps = c - 1
    passes = layers * (2.0 + recompute_share)
    gather = np.asarray(all_gather) > 0
    exchange = [
        Call("send", kv, np.where(gather, 0.0, passes * steps)),
        Call("all_gather", kv * c, np.where(gather & (c > 1), passes, 0.0)),
    ]
    grads = kv * np.where(np.asarray(grad_fp32) > 0, 4.0 / act_bytes, 1.0)
    return exchange, [Call("send", grads, layers * steps)]


def moe_stat_calls(model, micro_batch, stat_group, moe_layers, recompute_share=0.0) -> list[Call]:
    """The MoE load-balancing loss needs each sequence's routing statistics over all the ranks
    holding its tokens: cp ranks, and tp ranks under SP (autopar.trial.model.MoE.aux_loss;
    Megatron-Core reduces them over the tp x cp group, `sequence_load_balancing_loss_func`): per MoE
    layer per microbatch one all-reduce of the [b, E] fp32 copy counts, one of the [b, E]
    probability sums, and that one's backward; a fully recomputed layer repeats the two forward
    ones. `stat_group` = cp x (tp under SP) ranks."""
    if model.moe is None:
        return []
    s = np.asarray(micro_batch, dtype=float) * model.moe.num_experts * 4.0
    calls = 3.0 + 2.0 * np.asarray(recompute_share, dtype=float)
    return [
        Call("all_reduce", s, np.where(np.asarray(stat_group) > 1, np.asarray(moe_layers, dtype=float) * calls, 0.0))
    ]


#: bytes of one routed-copy count (int64) in the dispatcher's count exchange
COUNT_BYTES = 8


def ep_calls(model, tokens, tp, sp, moe_layers, imbalance, act_bytes, recompute_share=0.0) -> list[Call]:
    """Dispatch and combine all-to-alls, forward and backward, of the k routed copies of the
    tp-local tokens (GShard, Lepikhin et al. 2020; Megatron alltoall dispatcher).

    Measured on the running model (autopar/trial/parallel/expert.py): a rank's send buffer is its
    own k*T copies for the forward dispatch and the backward of the combine whatever the routing
    (dropless), and the R rows it received for the forward combine and the backward of the
    dispatch; `imbalance` = R / (k*T) of the busiest rank (1 when balanced). Before each dispatch
    the ranks exchange their per-expert copy counts (one all-to-all of E int64 per MoE layer per
    forward): the receive buffers cannot be sized without it. A fully recomputed layer runs its
    forward dispatch, combine and count exchange once more (Megatron recomputes the whole layer)."""
    if model.moe is None:
        return []
    local = tokens / np.where(sp, np.asarray(tp, dtype=float), 1.0)
    s = local * model.moe.top_k * model.hidden_size * act_bytes
    counts = np.full_like(np.asarray(s, dtype=float), float(model.moe.num_experts * COUNT_BYTES))
    forwards = 1.0 + np.asarray(recompute_share, dtype=float)
    return [
        Call("all_to_all", s, moe_layers * (1.0 + forwards)),
        Call("all_to_all", s * imbalance, moe_layers * (1.0 + forwards)),
        Call("all_to_all", counts, moe_layers * forwards),
    ]


def pp_calls(model, tokens, tp, sp, pp, vpp, rank, act_bytes, scatter_gather=0.0) -> list[Call]:
    """Activations forward and gradients backward at each (virtual) stage boundary, per microbatch:
    rank r sends v forward (less the last virtual stage's) and v backward (less the first's).
    `scatter_gather` 1 (Megatron-LM 2021-22, `--scatter-gather-tensors-in-pipeline` on by default):
    without SP each of the tp ranks sends 1/tp of the tensor it would send whole, and the receiving
    stage all-gathers it over its TP group (`pp_gather_calls`); Megatron-Core sends the whole tensor."""
    t = np.asarray(tp, dtype=float)
    split = np.where(sp, t, np.where(np.asarray(scatter_gather) > 0, t, 1.0))
    s = tokens * model.hidden_size * act_bytes / split
    return [Call("send", s, _stage_sends(pp, vpp, rank))]


def pp_gather_calls(model, tokens, tp, sp, pp, vpp, rank, act_bytes, scatter_gather=0.0) -> list[Call]:
    """The TP all-gathers of the received pieces that `pp_calls`'s scatter/gather adds: one per
    stage-boundary send (Narayanan et al. SC21 sec. 4.1, "Scatter/gather communication
    optimization"; Megatron-LM megatron/p2p_communication.py `gather_split_1d_tensor`, v2.x-3.0)."""
    on = np.where(sp, 0.0, np.where((np.asarray(scatter_gather) > 0) & (np.asarray(tp) > 1), 1.0, 0.0))
    s = tokens * model.hidden_size * act_bytes
    return [Call("all_gather", s, _stage_sends(pp, vpp, rank) * on)]


def _stage_sends(pp, vpp, rank) -> np.ndarray:
    v = np.asarray(vpp, dtype=float)
    fwd = v - (rank == np.asarray(pp) - 1)
    bwd = v - (rank == 0)
    return np.where(np.asarray(pp) > 1, fwd + bwd, 0.0)


def dp_calls(params, zero_stage, grad_bytes, weight_bytes, m, pp, group_size) -> tuple[list[Call], list[Call]]:
    """(gradient reduction, parameter gathering) calls of one GPU per step for `params` reduced
    over one data-parallel group of `group_size`. ZeRO-0: one all-reduce of the gradients; ZeRO-1:
    one reduce-scatter of the gradients and one all-gather of the parameters (Megatron's distributed
    optimizer); ZeRO-2/3 reduce-scatter as often as `grad_reductions_per_step` says (every
    microbatch without pipelining, to keep the gradients sharded); ZeRO-3 (FSDP2) gathers the
    parameters twice per microbatch (forward, backward), or m + 1 times under
    torch.distributed.pipelining, whose backward keeps them gathered (measured on the built-in
    model)."""
    z = np.asarray(zero_stage)
    grads = params * grad_bytes
    weights = params * weight_bytes
    piped = np.asarray(pp) > 1
    m = np.asarray(m, dtype=float)
    reductions = grad_reductions_per_step(z, m, pp, group_size)
    z3_gathers = np.where(piped, m + 1.0, 2.0 * m)
    reduce = [
        Call("all_reduce", grads, np.where(z == 0, 1.0, 0.0)),
        Call("reduce_scatter", grads, np.where(z >= 1, reductions, 0.0)),
    ]
    gather = [Call("all_gather", weights, np.where(z == 3, z3_gathers, np.where(z >= 1, 1.0, 0.0)))]
    return reduce, gather
