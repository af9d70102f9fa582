"""Activation bytes per layer and microbatch as each GPU training program saves them (vectorised).

Every term is per token of a microbatch (on one CP rank) and names the tensor an op keeps for its
backward. The Megatron-Core stack with 16-bit activations is Korthikanti et al. 2022
(arXiv:2205.05198) Table 2 exactly (autopar.cost.activations): two norm inputs 2h each, the QKV and
MLP inputs 2h each, Q/K/V and the attention output, the MLP hidden tensors, 1-byte dropout masks;
the other stacks differ where their code does (autopar.cost.memory_stacks, one switch per
mechanism):
- which linear inputs are saved (the sequence-parallel shard or DTensor's gathered copy), in
  16-bit or, under Transformer Engine FP8, as the quantized 1-byte copy (plus the attention
  output's 1-byte copy for the output projection beside the bf16 one flash attention keeps);
- eager norms (fp32 copy and normalised output) vs fused ones (input only), eager SwiGLU's four
  hidden tensors vs Megatron's three vs Inductor's two, and the key/value repeat before SDPA;
- attention without flash kernels (Korthikanti's 5as/h: softmax output, dropout mask and output);
- what recompute keeps: Megatron's selective recompute modules (autopar.spec.recompute_modules:
  core_attn by default), torchtitan's op-level selective AC;
- what Megatron's fine-grained activation offloading moves to the host (autopar.spec.offload_modules):
  the saved input of each offloaded module. Megatron-Core keeps the last layer's group of each module
  on the GPU so that its reload does not stall the backward (fine_grained_activation_offload.py
  `post_warmup_callback`); that one layer of the layers x microbatches in flight is not priced.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost.flops import padded_vocab
from autopar.cost.memory_stacks import MemoryStack
from autopar.spec.model import ModelSpec
from autopar.spec.offload_modules import OFFLOAD_BITS, SHIFT
from autopar.spec.recompute_modules import MODULE_BITS

#: a PlanShape's `modules` bits: the plan's recompute modules, then its offloaded activations
#: (autopar.spec.offload_modules, shifted past the recompute bits) as "offload_<module>"
_BITS = MODULE_BITS | {f"offload_{m}": b << SHIFT for m, b in OFFLOAD_BITS.items()}


class StackLayers(NamedTuple):
    """Bytes one layer keeps for one microbatch on a GPU, (C, n) or (n,) arrays."""

    dense: np.ndarray
    moe: np.ndarray
    layer_input: np.ndarray  # what a fully recomputed layer keeps: its input
    working: np.ndarray  # one layer rebuilt in full for a recomputed backward (Korthikanti §5)


class PlanShape(NamedTuple):
    """The plan columns the activation terms read (broadcastable arrays)."""

    tokens: np.ndarray  # tokens of one microbatch on one CP rank
    tp: np.ndarray  # float
    sp: np.ndarray  # bool
    cp: np.ndarray
    etp: np.ndarray
    act_bytes: np.ndarray  # 2, or 4 in fp32
    fp8: np.ndarray  # bool: FP8 GEMMs
    selective: np.ndarray | bool  # bool: recompute = "selective" (False: rebuilt with nothing recomputed)
    #: int bitmask of Megatron's selective recompute modules (autopar.spec.recompute_modules, the
    #: default core_attn filled in) and, shifted past them, the plan's offloaded activations
    #: (autopar.spec.offload_modules)
    modules: np.ndarray
    flash: float  # 1 = flash attention kernels; 0 = the score matrix is materialised
    seq_len: int  # keys per query (the sequence on this CP rank)


def _has(shape: PlanShape, module: str) -> np.ndarray:
    return (np.asarray(shape.modules) & _BITS[module]) > 0


def _linear_input_bytes(stack: MemoryStack, shape: PlanShape) -> np.ndarray:
    """Bytes per element of a saved linear input: 16-bit, or 1 under TE FP8."""
    return np.where(shape.fp8 & stack.fp8_saves_fp8_inputs, 1.0, shape.act_bytes)


def _norm_bytes(stack: MemoryStack, h: int, a: np.ndarray) -> np.ndarray:
    """One norm, per token: fused = its input (Korthikanti's 2h); eager Llama RMSNorm = the fp32
    copy of its input that the square saves (4h) + its normalised output (a h) + fp32 1/rms."""
    return a * h if stack.fused_norm else 4.0 * h + a * h + 4.0


def _mlp_bytes(stack: MemoryStack, ffn: int, gated: bool, shape: PlanShape, act_recomputed) -> np.ndarray:
    """A (dense or expert) MLP's hidden tensors per token, before TP sharding. Megatron: the fc1
    output (2F gated, F plain) at 16-bit and the fc2 input (F, FP8-quantized under TE FP8), which
    `moe_act` recompute drops; eager and compiled stacks: their tensor count at 16-bit."""
    a = shape.act_bytes
    if stack.family == "megatron":
        fc1 = (2.0 if gated else 1.0) * ffn * a
        fc2_in = ffn * _linear_input_bytes(stack, shape)
        return fc1 + np.where(act_recomputed, 0.0, fc2_in)
    tensors = stack.gated_mlp_tensors if gated else stack.plain_mlp_tensors
    return tensors * ffn * a


def _attention_bytes(stack: MemoryStack, model: ModelSpec, shape: PlanShape) -> np.ndarray:
    """The attention core's saved tensors per token, TP-sharded with the heads: Q, K, V (keys and
    values repeated per query head where the stack repeats them; MLA's latents only under
    `mla_up_proj` recompute), the output at 16-bit (twice where the stack copies it for the output
    projection; plus its FP8 copy for the projection under TE FP8), fp32 log-sum-exp per head on
    the torch stacks, and without flash kernels the softmax output, its dropout mask and output
    (5 a s bytes per token, Korthikanti §4.1), which selective recompute drops. Offloading
    `core_attn` moves Q, K and V to the host, `attn_proj` the output (Megatron requires both)."""
    a = shape.act_bytes
    rep = model.num_attention_heads / model.num_kv_heads if stack.repeats_kv else 1.0
    qkv = (model.q_size + rep * (model.k_size + model.v_size)) * a
    if model.mla is not None:
        m = model.mla
        latents = ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim) * a * shape.tp
        qkv = np.where(_has(shape, "mla_up_proj"), latents, qkv)
    qkv = np.where(_has(shape, "offload_core_attn"), 0.0, qkv)  # core attention's input on the host
    copies = (2.0 if stack.copies_attention_output else 1.0) * a
    out = model.attn_out_size * (copies + np.where(shape.fp8 & stack.fp8_saves_fp8_inputs, 1.0, 0.0))
    out = np.where(_has(shape, "offload_attn_proj"), 0.0, out)  # the projection's input (needs core_attn's)
    lse = 0.0 if stack.family == "megatron" else 4.0 * model.num_attention_heads
    per_score = a + ((1.0 + a) if model.dropout else 0.0)
    scores = (1.0 - shape.flash) * model.num_attention_heads * shape.seq_len * per_score
    kept_scores = np.where(shape.selective | _has(shape, "core_attn"), 0.0, scores)
    return qkv + out + lse + kept_scores


def dense_layer(stack: MemoryStack, model: ModelSpec, shape: PlanShape, recompute_off=False) -> np.ndarray:
    """Bytes a dense layer keeps per microbatch. `recompute_off`: as if nothing were recomputed
    (a layer rebuilt for its backward)."""
    h, a = model.hidden_size, shape.act_bytes
    seq = np.where(shape.sp, shape.tp, 1.0)
    lin_div = seq if stack.saves_sp_shard else 1.0
    mods = shape if not recompute_off else shape._replace(modules=np.zeros_like(shape.modules), selective=False)
    kept_norms = 2.0 - _has(mods, "offload_attn_norm") - _has(mods, "offload_mlp_norm")  # their inputs
    norms = kept_norms * _norm_bytes(stack, h, a) / seq
    kept_inputs = 2.0 - _has(mods, "offload_qkv_linear")  # the QKV and fc1 inputs
    lin_in = np.where(_has(mods, "layernorm"), 0.0, kept_inputs * h * _linear_input_bytes(stack, mods)) / lin_div
    masks = (2.0 * h if model.dropout else 0.0) / seq
    attention = _attention_bytes(stack, model, mods) / shape.tp
    mlp = _mlp_bytes(stack, model.ffn_hidden_size, model.gated_mlp, mods, False) / shape.tp
    mlp = np.where(_has(mods, "mlp"), 0.0, mlp)
    per_token = norms + lin_in + masks + attention + mlp
    if stack.selective == "op_sac" and not recompute_off:
        per_token = np.where(shape.selective, _op_sac_bytes(model, shape), per_token)
    return np.asarray(shape.tokens, dtype=float) * per_token


def _op_sac_bytes(model: ModelSpec, shape: PlanShape) -> np.ndarray:
    """torchtitan's op-level selective AC keeps, per token, the block input and the outputs of its
    saved ops: every odd matmul in forward order (wq, wv, w1, w2 of wq wk wv wo w1 w3 w2; w2's is
    the row-parallel partial sum, on every token), the SDPA output and log-sum-exp, and under TP
    the two reduce-scatter outputs (torchtitan distributed/activation_checkpoint.py
    `_custom_policy`, `_save_list`)."""
    h, a, t = model.hidden_size, shape.act_bytes, shape.tp
    seq = np.where(shape.sp, t, 1.0)
    sharded = (model.q_size + model.v_size + model.ffn_hidden_size + model.attn_out_size) * a / t
    lse = 4.0 * model.num_attention_heads / t
    reduce_scatter = np.where(t > 1, 2.0 * h * a / seq, 0.0)
    return h * a / seq + sharded + lse + h * a + reduce_scatter


def moe_layer(stack: MemoryStack, model: ModelSpec, shape: PlanShape, recompute_off=False) -> np.ndarray:
    """Bytes an MoE layer keeps per microbatch: the attention side of a dense layer, the fp32 router
    logits, per routed copy of the tp-local tokens its expert input (gathered over etp), hidden
    tensors and, where the stack keeps it, its output (`MemoryStack.moe_keeps_expert_output`), and
    the shared experts. `moe` recompute keeps only the layer's input (its MLP input), `moe_act`
    drops the expert activation output, `shared_experts` the shared experts' hidden tensors;
    offloaded expert inputs and activation inputs (`offload_expert_fc1`, `offload_moe_act`) leave
    the GPU."""
    m = model.moe
    assert m is not None  # a MoE model
    h, a = model.hidden_size, shape.act_bytes
    mods = shape if not recompute_off else shape._replace(modules=np.zeros_like(shape.modules), selective=False)
    tokens = np.asarray(shape.tokens, dtype=float)
    local = tokens / shape.tp
    dense_mlp = _mlp_bytes(stack, model.ffn_hidden_size, model.gated_mlp, mods, False) / shape.tp
    # op-level SAC's saved list is a dense block's (_op_sac_bytes): an MoE block is priced as kept
    plain = shape._replace(selective=np.zeros_like(shape.selective)) if stack.selective == "op_sac" else shape
    attention_side = dense_layer(stack, model, plain, recompute_off) - tokens * np.where(
        _has(mods, "mlp"), 0.0, dense_mlp
    )
    expert_in = h * np.asarray(shape.etp, dtype=float) * _linear_input_bytes(stack, mods)
    expert_in = np.where(_has(mods, "offload_expert_fc1"), 0.0, expert_in)
    hidden = _mlp_bytes(stack, m.expert_ffn_hidden_size, model.gated_mlp, mods, _has(mods, "moe_act"))
    fc1_out = (2.0 if model.gated_mlp else 1.0) * m.expert_ffn_hidden_size * a
    hidden = hidden - np.where(_has(mods, "offload_moe_act") & (stack.family == "megatron"), fc1_out, 0.0)
    routed = m.top_k * (expert_in + hidden + (h * a if stack.moe_keeps_expert_output else 0.0))
    shared = _mlp_bytes(stack, m.shared_expert_ffn_hidden_size, model.gated_mlp, mods, False)
    shared = np.where(_has(mods, "shared_experts"), 0.0, shared)  # checkpointed: its input is the MLP input
    router = 4.0 * m.num_experts
    whole = local * (router + routed + shared)
    return attention_side + np.where(_has(mods, "moe"), 0.0, whole)  # its input is the MLP input kept above


def stack_layers(stack: MemoryStack, model: ModelSpec, shape: PlanShape) -> StackLayers:
    dense = dense_layer(stack, model, shape)
    moe = moe_layer(stack, model, shape) if model.moe else np.zeros_like(dense)
    seq = np.where(shape.sp, shape.tp, 1.0)
    layer_input = np.asarray(shape.tokens, dtype=float) * model.hidden_size * shape.act_bytes / seq
    full_dense = dense_layer(stack, model, shape, recompute_off=True)
    full_moe = moe_layer(stack, model, shape, recompute_off=True) if model.moe else np.zeros_like(dense)
    return StackLayers(dense, moe, layer_input, np.maximum(full_dense, full_moe))


def head_bytes(stack: MemoryStack, model: ModelSpec, shape: PlanShape) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) bytes of the last stage per microbatch: the final norm's input and the LM
    head's input (shard or gathered copy), the loss's saved tensors per vocabulary entry
    (`MemoryStack.loss_saved_bytes`), and what is alive only while the loss runs."""
    h, a, t = model.hidden_size, shape.act_bytes, shape.tp
    tokens = np.asarray(shape.tokens, dtype=float)
    seq = np.where(shape.sp, t, 1.0)
    lin_div = seq if stack.saves_sp_shard else 1.0
    vocab = padded_vocab(model, np.asarray(t).astype(np.int64)) / t
    kept = tokens * (_norm_bytes(stack, h, a) / seq + h * a / lin_div + stack.loss_saved_bytes * vocab)
    return kept, tokens * stack.loss_transient_bytes * vocab
