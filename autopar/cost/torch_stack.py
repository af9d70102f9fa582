"""Peak memory per pipeline rank when the trained program is the "torch" stack (vectorised).

The "torch" training stack (`ClusterSpec.training_stack`; the `local` profile's default) is PyTorch
eager autograd with DTensor TP, FSDP2/DDP and torch.distributed.pipelining: autopar's built-in
trial model (autopar/trial), torchtitan without compile. Its memory differs from Megatron-Core's
fused kernels (the "megatron" stack, autopar.calibration.estimate's default accounting) in what the ops
save (autopar.cost.activations `eager_*`), in torch's buffers, and in when the peak happens:
gradients are created in the backward and freed by `zero_grad(set_to_none=True)`, not held in a
preallocated buffer. Every term was checked against the live tensor bytes of the built-in model
(autopar.trial.memory, tiny model, world 2: benchmarks/bench_memory_accuracy.py).

The peak is the larger of two moments:
1. a backward while the most microbatches are in flight: the stored activations of those
   microbatches plus the working set on top, the larger of the cross-entropy gradients (last stage,
   start of the backward) and a block's backward (its gradient temporaries, its recomputed
   activations, ZeRO-3's gathered units), with the gradients only if a backward has already run in
   this step (fewer microbatches in flight than the step has: not under GPipe, nor with one);
2. the end of the last backward: every gradient, no activation.

Not counted: under torch's zero-bubble schedule, the gradients at the intermediate autograd nodes
that a deferred weight pass starts from (torch/distributed/pipelining/_backward.py
`stage_backward_input` keeps them per microbatch); measured on pp2 they are about as large as the
microbatch's stored activations, so zero-bubble plans are predicted short on the later ranks.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import activations as act
from autopar.cost.flops import padded_vocab
from autopar.spec.hardware import GIB
from autopar.spec.table import SCHED


def pipeline_buffer_bytes(model, tokens, tp, sp, pp, vpp, rank, m, act_bytes) -> np.ndarray:
    """torch.distributed.pipelining allocates a receive buffer per microbatch for each stage input
    and each stage-output gradient it receives (stage.py `_prepare_forward_infra`,
    `_create_grad_recv_info`) and keeps them across steps: rank r holds v stages, v - 1 of them
    with inputs when r = 0 and v - 1 with output gradients when r = p - 1."""
    bsh = np.asarray(tokens, dtype=float) * model.hidden_size * act_bytes / np.where(sp, np.asarray(tp, float), 1.0)
    p, v = np.asarray(pp), np.asarray(vpp, dtype=float)
    recv = (v - (rank == 0)) + (v - (rank == p - 1))
    return np.where(p > 1, np.asarray(m, dtype=float) * recv * bsh, 0.0)


def held_send_bytes(model, tokens, tp, sp, pp, vpp, rank, m, inflight, schedule, act_bytes) -> np.ndarray:
    """Multi-stage schedules (interleaved 1F1B, zero-bubble: torch's `_PipelineScheduleRuntime`)
    wait for their sends only at the end of the step (schedules.py `send_ops`), so each sent stage
    output (v - 1 stages of the last rank, else v) and input gradient (v - 1 stages of rank 0,
    else v) stays alive. Counted at the peak, the last steady-state backward: after all m v
    forwards and m v - w - 1 backwards (w = the chunks in flight), those beyond the in-flight
    chunks the stored activations count. Single-stage schedules wait for each send within a step."""
    bsh = np.asarray(tokens, dtype=float) * model.hidden_size * act_bytes / np.where(sp, np.asarray(tp, float), 1.0)
    p, v, m = np.asarray(pp), np.asarray(vpp, dtype=float), np.asarray(m, dtype=float)
    done = np.maximum(m * v - inflight * v - 1, 0.0)  # backward chunks finished at the peak
    sends = (v - (rank == p - 1)) + (v - (rank == 0))
    multi = (schedule == SCHED["interleaved-1f1b"]) | (schedule == SCHED["zero-bubble"])
    return np.where((p > 1) & multi, done / v * sends * bsh, 0.0)


def zero_bubble_in_flight(schedule, pp, vpp, m, inflight) -> np.ndarray:
    """torch's zero-bubble schedule (ScheduleInterleavedZeroBubble, one stage per rank) warms up
    p - 1 - r forwards and runs each weight pass r microbatches after its input pass
    (schedules.py `_get_1f1b_rank_ops`, `num_1f1b_microbatches = rank`); the input pass keeps the
    graph (`retain_graph=True`) until the weight pass, so every rank holds p microbatches' stored
    activations, not ZB-H1's p - r. The intermediate gradients those deferred weight passes keep are
    not counted (see the module docstring)."""
    zb = (schedule == SCHED["zero-bubble"]) & (np.asarray(vpp) == 1) & (np.asarray(pp) > 1)
    return np.where(zb, np.minimum(np.asarray(pp, dtype=float), m), inflight)


def stage_output_bytes(model, tokens, tp, sp, pp, has_embedding, has_head, act_bytes) -> np.ndarray:
    """Per microbatch in flight, torch.distributed.pipelining keeps each stage's output for its
    backward (stage.py `fwd_cache`): on the last stage the logits [tokens, vocab/tp], which a plain
    model frees after the log-softmax; on the first the last block's output, one residual-stream
    tensor beyond the per-layer count (whose first input there is the embedding output, elsewhere
    the receive buffer), while the last stage's final-norm input is already its last block's."""
    tp = np.asarray(tp, dtype=float)
    bsh = np.asarray(tokens, dtype=float) * model.hidden_size * act_bytes / np.where(sp, tp, 1.0)
    logits = np.asarray(tokens, dtype=float) * padded_vocab(model, tp) / tp * act_bytes
    return np.where(np.asarray(pp) > 1, has_embedding * bsh + has_head * (logits - bsh), 0.0)


def replicated_embedding_grad_bytes(model, tp, has_embedding) -> np.ndarray:
    """Under TP the vocab-parallel embedding's weight gradient comes back from DTensor's
    embedding backward as a replicated [vocab, h] fp32 tensor, not the rank's [vocab/tp, h] shard
    (measured on the built-in model): (1 - 1/tp) of the table more."""
    tp = np.asarray(tp, dtype=float)
    return has_embedding * 4.0 * padded_vocab(model, tp) * model.hidden_size * (1.0 - 1.0 / tp)


def fsdp_master_bytes(dense_params, expert_params, zero_stage, dense_dp, expert_dp, fp32) -> np.ndarray:
    """fp32 training under ZeRO-1/2 (FSDP2 without resharding after forward): the sharded fp32
    parameters the optimizer steps stay apart from the gathered copy the model computes with, 4
    bytes per parameter / dp (measured on the built-in model; in mixed precision this copy is the
    fp32 master already counted in the 12 optimizer bytes). No data-parallel peers, no FSDP."""
    z = np.asarray(zero_stage)
    on = np.asarray(fp32) & ((z == 1) | (z == 2))
    dense_dp, expert_dp = np.asarray(dense_dp, dtype=float), np.asarray(expert_dp, dtype=float)
    return np.where(
        on,
        np.where(dense_dp > 1, 4.0 * dense_params / dense_dp, 0.0)
        + np.where(expert_dp > 1, 4.0 * expert_params / expert_dp, 0.0),
        0.0,
    )


def ddp_bucket_bytes(grads, zero_stage, dp_group, tp, experts_apart) -> np.ndarray:
    """torch DDP (ZeRO-0 without TP, autopar.trial.parallel.data) keeps its reducer's flat bucket
    buffers beside the gradients (`gradient_as_bucket_view=False`, torch's default): a second
    gradient-sized buffer, allocated for the whole run. Megatron's DDP reduces in the gradient
    buffer itself."""
    ddp = (
        (np.asarray(zero_stage) == 0) & (np.asarray(dp_group) > 1) & (np.asarray(tp) == 1) & ~np.asarray(experts_apart)
    )
    return np.where(ddp, grads, 0.0)


def torch_stack_memory(
    model,
    table,
    st,
    prm,
    states,
    *,
    tokens,
    m,
    inflight,
    recompute_share,
    selective,
    act_bytes,
    fp32,
    edp,
    constants,
    fsdp_gather,
    moe_buffers,
) -> dict[str, np.ndarray]:
    """{weights, gradients, optimizer, activations, other} of every pipeline rank ((R, n) arrays)
    at its peak moment (module docstring)."""
    t, p, d, c, e, et, v = (table.tp, table.pp, table.dp, table.cp, table.ep, table.etp, table.vpp)
    sp = table.sequence_parallel.astype(bool)
    dense_l, moe_l = st.dense_layers.astype(float), st.moe_layers.astype(float)
    layers = dense_l + moe_l
    emb, head = st.has_embedding.astype(float), st.has_head.astype(float)
    scale = act_bytes / 2.0  # the fused formulas are for 2-byte activations

    def layer(sel):
        dense = act.eager_dense_layer_bytes(model, tokens, t, sp, c, act_bytes, sel)
        moe = act.eager_moe_layer_bytes(model, tokens, t, sp, c, et, act_bytes, sel) if model.moe else 0.0 * dense
        return dense, moe

    inflight = zero_bubble_in_flight(table.schedule, p, v, m, inflight)
    a_dense, a_moe = layer(selective)
    stored = (
        (dense_l * a_dense + moe_l * a_moe) * (1 - recompute_share)
        + layers * act.layer_input_bytes(model, tokens, t, sp) * scale * recompute_share
        + emb * act.embedding_bytes(model, tokens, t, sp)
        + head * act.eager_head_bytes(model, tokens, t, sp, act_bytes)
        + stage_output_bytes(model, tokens, t, sp, p, emb, head, act_bytes)
    )
    # on top of the stored microbatches: the loss gradients at the start of the backward, or later a
    # layer's backward: its recomputed activations and (ZeRO-3) the FSDP units gathered for it, which
    # are resharded after the forward, so none is gathered while the loss backward runs
    recompute_ws = np.where(recompute_share > 0, np.maximum(*layer(False)), 0.0)
    loss = head * act.eager_loss_transient_bytes(model, tokens, t)
    backward = np.maximum(recompute_ws, act.eager_backward_working_bytes(model, tokens, t, act_bytes))
    in_layer = backward + fsdp_gather > loss
    working = np.where(in_layer, backward, loss)
    gathered = np.where(in_layer, fsdp_gather, 0.0)
    activations = inflight * stored + working

    experts_apart = bool(model.moe) & ((e > 1) | (t > 1))
    z = table.zero_stage
    optimizer = states.optimizer + fsdp_master_bytes(prm.dense, prm.expert, z, d * c, edp, fp32)
    bucket = ddp_bucket_bytes(states.gradients, z, d * c, t, experts_apart)
    buffers = pipeline_buffer_bytes(model, tokens, t, sp, p, v, st.rank, m, act_bytes) + held_send_bytes(
        model, tokens, t, sp, p, v, st.rank, m, inflight, table.schedule, act_bytes
    )
    fixed = constants.runtime_reserved_gib * GIB + moe_buffers + buffers
    grads = states.gradients + replicated_embedding_grad_bytes(model, t, emb)
    grads_then = np.where(inflight < m, grads, 0.0)  # a backward already ran this step
    overhead = constants.allocator_overhead_fraction * activations
    at_backward = states.weights + optimizer + bucket + grads_then + activations + overhead + gathered + fixed
    at_end = states.weights + optimizer + bucket + grads + fixed
    first = at_backward >= at_end
    zero = 0.0 * activations
    return {
        "weights": states.weights + zero,
        "gradients": bucket + np.where(first, grads_then, grads),
        "optimizer": optimizer + zero,
        "activations": np.where(first, activations, 0.0),
        "other": fixed + np.where(first, overhead + gathered, 0.0),
    }
