"""Peak memory per pipeline rank of a GPU training program, by term (vectorised, (C, n) arrays).

The peak is the larger of two moments (as on the built-in stack, autopar.cost.torch_stack):
1. a backward with the most microbatches in flight: the stored activations of those microbatches
   plus the working set on top (a recomputed layer rebuilt in full, or the loss's temporaries on
   the last stage);
2. for programs whose gradients appear in the backward (nanotron's bf16 gradients before its fp32
   accumulation), the end of a backward: one microbatch fewer in flight, every such gradient.
States by program (autopar.cost.memory_stacks `grads`):
- Megatron-Core (Megatron `theoretical_memory_usage.py`, docs dist_optimizer.md): 16-bit weights,
  fp32 (or bf16) main gradients in one buffer, fp32 master + Adam over the data-parallel group
  (autopar.cost.memory), less the share offloaded to the host (autopar.cost.offload); FP8 adds
  TE's cached FP8 weight and transpose unless the parameters themselves are FP8 (--fp8-param-gather);
- Megatron-DeepSpeed: 16-bit gradients with DeepSpeed's fp16 ZeRO optimizer, whose partition adds
  an fp32 gradient copy (4/d) and a reduce bucket of `reduce_bucket_size` = 5e8 elements
  (deepspeed/runtime/zero/config.py default);
- FSDP (torchtitan FSDP2, Composer / fms-fsdp FSDP1, mixed precision bf16 compute, fp32 reduce):
  fp32 sharded parameters, gradients and Adam (16/d), the bf16 units gathered for compute (two:
  the one computed and the one prefetched), every parameter gathered through the step under
  ZeRO-2 (reshard_after_forward=False, SHARD_GRAD_OP) and under pipelining where the program keeps
  stages unsharded, and unsharded fp32 gradients accumulated over a pipelined step's microbatches;
  a model cast to bf16 before sharding (NeMo AutoModel's MoE models) holds all of these in bf16;
- nanotron (FP32GradientAccumulator): bf16 weights, an fp32 gradient buffer of every parameter,
  fp32 master weights and Adam sharded with ZeRO-1, a torch DDP reducer's bf16 buckets under
  ZeRO-0 with dp > 1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost import activations as act
from autopar.cost.memory import state_bytes
from autopar.cost.memory_overheads import fragmentation, runtime
from autopar.cost.memory_stacks import MemoryFacts, MemoryStack, compiled
from autopar.cost.pipeline import microbatches_in_flight
from autopar.cost.stack_activations import PlanShape, StackLayers, head_bytes, stack_layers
from autopar.cost.torch_stack import zero_bubble_in_flight
from autopar.spec.hardware import LOCAL
from autopar.spec.offload_modules import SHIFT
from autopar.spec.table import DTYPE, SCHED

#: DeepSpeed ZeRO `reduce_bucket_size` default, elements (deepspeed/runtime/zero/config.py)
DEEPSPEED_REDUCE_BUCKET = 5e8


class MemoryTerms(NamedTuple):
    """The estimate's five memory columns: bytes per GPU of each costed rank at its peak."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    other: np.ndarray  # buffers, the allocator's reserve, the CUDA context and NCCL

    def total(self) -> np.ndarray:
        return sum(self)  # type: ignore[return-value]  # five arrays: an array, never sum's start 0


class MemoryBreakdown(NamedTuple):
    """Bytes per GPU of each costed rank at its peak, (C, n) arrays."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    buffers: np.ndarray  # gathered FSDP units, dispatch and pipeline buffers, reduce buckets
    fragmentation: np.ndarray
    cuda_context: np.ndarray
    nccl: np.ndarray

    @property
    def allocated(self) -> np.ndarray:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    @property
    def reserved(self) -> np.ndarray:
        return self.allocated + self.fragmentation

    @property
    def device(self) -> np.ndarray:
        """What nvidia-smi shows: reserved + CUDA context + NCCL."""
        return self.reserved + self.cuda_context + self.nccl

    @property
    def required(self) -> np.ndarray:
        """What must fit: the allocated peak + CUDA context + NCCL. The allocator's reserve beyond
        it is not counted: under pressure it frees its cached blocks and retries before failing
        (c10/cuda/CUDACachingAllocator.cpp `release_cached_blocks`)."""
        return self.allocated + self.cuda_context + self.nccl

    def terms(self) -> MemoryTerms:
        """The estimate's columns; their sum is `required`."""
        other = self.buffers + self.cuda_context + self.nccl
        return MemoryTerms(self.weights, self.gradients, self.optimizer, self.activations, other)


def plan_shape(x, model, cluster) -> PlanShape:
    return PlanShape(
        tokens=x.tokens,
        tp=x.tp_float,
        sp=x.sequence_parallel,
        cp=x.cp,
        etp=x.etp,
        act_bytes=x.act_bytes,
        fp8=x.table.dtype == DTYPE["fp8"],
        selective=x.selective,
        modules=x.recompute_modules | (x.table.offload_modules.astype(np.int64) << SHIFT),
        flash=float(cluster.constants.attention_flash),
        seq_len=int(x.seq_len),
    )


def in_flight(x, stack: MemoryStack) -> np.ndarray:
    """Microbatches each rank holds at its peak (autopar.cost.pipeline; torch's zero-bubble schedule
    as autopar.cost.torch_stack); Llama 3's schedule warms up 2(p - r - 1) + (v - 1) N chunks with
    N microbatches a round (MemoryStack.pp_round)."""
    t = x.table
    base = microbatches_in_flight(t.schedule, x.pp, x.rank, x.microbatches, x.vpp)
    if stack.family == "torch":  # torch's zero-bubble schedule keeps p (autopar.cost.torch_stack)
        base = zero_bubble_in_flight(t.schedule, x.pp, x.vpp, x.microbatches, base)
    if not stack.pp_round:
        return base
    p, r, v, m = (np.asarray(a, dtype=float) for a in (x.pp, x.rank, x.vpp, x.microbatches))
    rounds = np.minimum(2 * (p - r - 1) + (v - 1) * np.minimum(stack.pp_round, p) + 1, m * v) / v
    return np.where(t.schedule == SCHED["interleaved-1f1b"], rounds, base)


def stored_per_microbatch(x, model, stack, shape, layers: StackLayers) -> tuple[np.ndarray, np.ndarray]:
    """(bytes one microbatch leaves on a rank, the loss's transient bytes on the last stage)."""
    share = x.recompute_share
    head_kept, head_transient = head_bytes(stack, model, shape)
    stored = (
        (x.dense_layers * layers.dense + x.moe_layers * layers.moe) * (1 - share)
        + x.layers * layers.layer_input * share
        + x.has_embedding * act.embedding_bytes(model, x.tokens, x.tp, x.sequence_parallel)
        + x.has_head * head_kept
    )
    if stack.name in ("megatron-deepspeed", "nanotron"):
        # DeepSpeed's PipelineEngine (pipe_buffers "outputs") and nanotron's pipeline state keep each
        # in-flight microbatch's stage output for its backward; Megatron-Core frees it after the send
        # (deallocate_output_tensor), torch pipelining keeps it too (autopar.cost.torch_stack)
        stored = stored + (x.pp > 1) * (1 - x.has_head) * layers.layer_input
    return stored, x.has_head * head_transient


def megatron_states(x, prm, stack: MemoryStack, facts: MemoryFacts, model):
    """(weights, gradients, optimizer, buffers) of the Megatron family."""
    t = x.table
    states = state_bytes(prm.dense, prm.expert, t.zero_stage, x.dp_shard, x.expert_dp, t.main_grads_fp32, x.fp32, x.pp)
    weights, grads, opt = states.weights, states.gradients, states.optimizer
    fp8 = t.dtype == DTYPE["fp8"]
    if stack.fp8_weights == "te_cache":
        linear = prm.total - prm.vocab
        # ZeRO-3 (Megatron-FSDP) gathers per unit: its FP8 copies are not kept for the whole model;
        # FP8 parameters (--fp8-param-gather) are the FP8 copy: no BF16 weight beside it to cache
        cached = fp8 & (t.zero_stage < 3) & ~x.fp8_gather
        weights = weights + np.where(cached, 2.0 * np.maximum(linear, 0.0), 0.0)
    if facts.bf16_optimizer_states:
        opt = opt * (8.0 / 12.0)  # fp32 master + bf16 m, v
    buffers = 0.0 * weights
    if stack.grads == "deepspeed":
        sixteen_bit = ~np.asarray(t.main_grads_fp32)
        sharded = (prm.dense / x.dp_shard + prm.expert / x.expert_dp) * (t.zero_stage >= 1)
        opt = opt + np.where(sixteen_bit, 4.0 * sharded, 0.0)  # fp32 gradient partition
        buffers = buffers + np.where(x.dp_group > 1, 2.0 * DEEPSPEED_REDUCE_BUCKET, 0.0)
    # the offloaded share of the shard lives in host memory (autopar.cost.offload): Megatron's fp32
    # master and Adam states, DeepSpeed's with its fp32 gradient partition; the 16-bit weights and the
    # main-gradient buffer stay
    opt = opt * (1.0 - t.optimizer_offload)
    return weights, grads, opt, buffers


def torch_states(x, prm, stack: MemoryStack):
    """(weights, gradients, optimizer, gathered, end-of-backward gradients) of the torch family,
    mixed precision (bf16 compute; fp32 training keeps 4-byte copies only)."""
    t = x.table
    z, d, e = t.zero_stage, x.dp_shard.astype(float), x.expert_dp.astype(float)
    sharded = prm.dense / np.where(z >= 1, d, 1.0) + prm.expert / np.where(z >= 1, e, 1.0)
    total = prm.total
    half = np.where(x.fp32, 0.0, 2.0)  # bf16 compute copies
    pp = (x.pp > 1) & (x.microbatches > 1)  # unsharded gradients accumulate over a pipelined step
    if stack.grads == "fp32_accum":
        weights = half * total + np.where(x.fp32, 4.0 * total, 0.0)
        grads = 4.0 * total + np.where((z == 0) & (d > 1), half * total, 0.0)
        opt = np.where(x.fp32, 8.0, 12.0) * sharded  # fp32 master + Adam, sharded with ZeRO-1
        return weights, grads, opt, 0.0 * total, half * total
    gathered_all = (z == 2) | (z == 1) | (pp & stack.pp_keeps_params_gathered & (z == 3))
    gathered_bytes = np.where((t.dtype == DTYPE["fp8"]) & stack.fp8_all_gather, 1.0, half)
    units = np.where((z == 3) & (d > 1) & ~gathered_all, 2.0 * gathered_bytes * prm.dense_layer_max, 0.0)
    full = np.where(x.fp32, 4.0, stack.param_bytes)  # a parameter, its gradient, each Adam moment
    weights = np.where(z >= 1, full * sharded + np.where(gathered_all, half * total, 0.0), full * total)
    grads = np.where(z >= 1, full * sharded + np.where(pp, full * total, 0.0), full * total)
    ddp_buckets = np.where((z == 0) & (d > 1), full * total, 0.0)
    opt = 2.0 * full * sharded
    return weights, grads + ddp_buckets, opt, units, 0.0 * total


def gpu_memory(x, model, cluster, prm, stack: MemoryStack, facts: MemoryFacts, moe_buffers) -> MemoryBreakdown:
    """Every costed rank's peak on a GPU program (module docstring)."""
    shape = plan_shape(x, model, cluster)
    layers = stack_layers(stack, model, shape)
    inflight = in_flight(x, stack)
    stored, loss = stored_per_microbatch(x, model, stack, shape, layers)
    if not stack.compiled and np.any(x.table.compile):  # the plans that run under torch.compile
        fused_stack = compiled(stack)
        fused = stack_layers(fused_stack, model, shape)
        fused_stored, fused_loss = stored_per_microbatch(x, model, fused_stack, shape, fused)
        on = x.table.compile
        layers = StackLayers(*(np.where(on, c, e) for c, e in zip(fused, layers)))
        stored, loss = np.where(on, fused_stored, stored), np.where(on, fused_loss, loss)
    rebuilds = (x.recompute_share > 0) | (x.selective & (stack.selective == "op_sac"))
    working = np.maximum(np.where(rebuilds, layers.working, 0.0), loss)
    if stack.family == "megatron":
        weights, grads, opt, buffers = megatron_states(x, prm, stack, facts, model)
        gather = np.where((x.table.zero_stage == 3) & (x.dp_shard > 1), 2.0 * x.weight_bytes * prm.dense_layer_max, 0.0)
        buffers = buffers + gather
        end_grads = 0.0 * weights
    else:
        weights, grads, opt, buffers, end_grads = torch_states(x, prm, stack)
    buffers = buffers + moe_buffers
    at_backward = inflight * stored + working
    at_end = np.maximum(inflight - 1, 0.0) * stored + end_grads
    first = at_backward >= at_end
    activations = np.where(first, at_backward, np.maximum(inflight - 1, 0.0) * stored)
    grads = grads + np.where(first, 0.0, end_grads)
    on_gpu = cluster.gpu.key != LOCAL
    frag = fragmentation(stack, activations + buffers, on_gpu)
    rt = runtime(x, stack, facts.era_2022, on_gpu)
    zero = 0.0 * activations
    return MemoryBreakdown(weights + zero, grads + zero, opt + zero, activations, buffers + zero, frag, *rt)
