"""Activation memory per layer and per microbatch, per GPU (vectorised over plans).

Source: Korthikanti et al. 2022 (arXiv:2205.05198) §4 and Table 2, generalised:
- per token, 16-bit activations: LayerNorm inputs 2 x 2h, QKV input 2h, MLP input 2h, Q/K/V 2(q+k+v),
  attention output 2o, MLP hidden 2F twice (GeLU) or three times (SwiGLU: gate, up, product), and
  1-byte dropout masks 2h when the model uses dropout. For GPT (MHA, F = 4h, dropout) this is the
  paper's 34h, and without SP its 10h + 24h/t.
- attention is flash attention: the 5as^2 score terms are never stored, so `selective` recompute
  (Megatron's default `core_attn` module) stores what `none` stores and costs the core-attention
  forward again; `full` keeps only each layer's input (2h, sharded by SP).
- context parallelism divides the tokens by cp (Megatron docs context_parallel.md); sequence
  parallelism divides everything by tp, otherwise only the tensor-parallel part is divided.
- 32-bit training (dtype fp32) doubles every activation but the 1-byte masks, int64 ids and the
  fp32 logits (the estimate scales the layer terms by act_bytes / 2).
- MoE layers: router logits (fp32), each token's k routed copies (dispatched input, expert hidden
  units, output kept for the probability weighting) and the shared experts (like a dense MLP).
"""

from __future__ import annotations

import numpy as np

from autopar.cost.flops import padded_vocab
from autopar.spec.model import ModelSpec


def _mlp_hidden_bytes(model: ModelSpec, ffn: int) -> int:
    """Bytes per token of an MLP's hidden activations: 2 bytes x ffn x (3 SwiGLU | 2 GeLU)."""
    return 2 * ffn * (3 if model.gated_mlp else 2)


def replicated_bytes_per_token(model: ModelSpec) -> int:
    """The part of a layer's activations that TP alone does not shard (SP does): two norm inputs,
    the QKV and MLP inputs, dropout masks (Korthikanti Table 2 'TP' row: the 10 in 10 + 24/t)."""
    h = model.hidden_size
    return 4 * h + 2 * h + 2 * h + (2 * h if model.dropout else 0)


def attention_sharded_bytes_per_token(model: ModelSpec) -> int:
    """Q, K, V and the attention output, 16-bit: TP-sharded with the heads."""
    return 2 * (model.q_size + model.k_size + model.v_size) + 2 * model.attn_out_size


def dense_layer_bytes(model: ModelSpec, tokens, tp, sp) -> np.ndarray:
    """Bytes one dense layer stores for one microbatch of `tokens` tokens (per CP rank) on a GPU."""
    rep = replicated_bytes_per_token(model)
    shard = attention_sharded_bytes_per_token(model) + _mlp_hidden_bytes(model, model.ffn_hidden_size)
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    return np.where(sp, tokens * (rep + shard) / tp, tokens * (rep + shard / tp))


def moe_layer_bytes(model: ModelSpec, tokens, tp, etp) -> np.ndarray:
    """Bytes one MoE layer stores per microbatch on a GPU (SP is required with tp > 1, so every
    term is over the tp-local tokens). Routed experts: each of the top-k copies keeps its
    dispatched input (gathered over etp), the expert hidden units (ffn/etp of etp x the tokens) and
    the expert output for the router-probability weighting."""
    m = model.moe
    assert m is not None  # a MoE model
    h = model.hidden_size
    local = np.asarray(tokens, dtype=float) / np.asarray(tp, dtype=float)
    attention = replicated_bytes_per_token(model) - 2 * h + attention_sharded_bytes_per_token(model)
    router = 2 * h + 4 * m.num_experts  # router input (= MLP input), fp32 logits
    routed = m.top_k * (
        2 * h * np.asarray(etp, dtype=float) + _mlp_hidden_bytes(model, m.expert_ffn_hidden_size) + 2 * h
    )
    shared = _mlp_hidden_bytes(model, m.shared_expert_ffn_hidden_size)
    return local * (attention + router + routed + shared)


def layer_input_bytes(model: ModelSpec, tokens, tp, sp) -> np.ndarray:
    """Full recompute keeps only the layer input: 2h per token, sharded by SP (Korthikanti §4.1)."""
    tokens = np.asarray(tokens, dtype=float)
    return 2.0 * model.hidden_size * tokens / np.where(sp, np.asarray(tp, dtype=float), 1.0)


def embedding_bytes(model: ModelSpec, tokens, tp, sp) -> np.ndarray:
    """First stage: int64 token ids (Megatron A.2 `8*s*b`) and the embedding dropout mask."""
    tokens = np.asarray(tokens, dtype=float)
    mask = model.hidden_size * tokens / np.where(sp, np.asarray(tp, dtype=float), 1.0) if model.dropout else 0.0
    return 8.0 * tokens + mask


def head_bytes(model: ModelSpec, tokens, tp, sp, act_bytes=2.0) -> np.ndarray:
    """Last stage: final-norm input, LM-head input and fp32 vocab-parallel logits
    (Korthikanti §4.3: 4sbh/t * (1 + v/h) with 2-byte activations)."""
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    return tokens * (2.0 * act_bytes * model.hidden_size / np.where(sp, tp, 1.0) + 4.0 * padded_vocab(model, tp) / tp)


# ---- the "torch" training stack: PyTorch eager autograd, as the built-in trial model runs -----------
# Each term is a tensor an op's backward saves, read off the built-in model's code and checked against
# its measured live tensors (autopar.trial.memory tensor peak, tiny model, fp32, every tp/sp/cp split).


def eager_attention_bytes_per_token(model: ModelSpec, tp, cp, act_bytes, selective) -> np.ndarray:
    """Attention core inputs and outputs per token (tp-sharded with the heads): Q after RoPE, K and V
    repeated to every query head (the model's explicit GQA repeat before SDPA) and the attention
    output at `act_bytes`, plus SDPA's fp32 log-sum-exp per head. Selective recompute
    (autopar.trial.parallel.recompute) keeps q, k, v unrepeated and nothing else of the core. Ring
    attention (cp > 1, not recomputed) keeps q, k, v unrepeated, its output and the log-sum-exp, the
    output twice below fp32 (its fp32 accumulator and the copy wo reads)."""
    rep = model.num_attention_heads / model.num_kv_heads
    q, kv, o = model.q_size, model.k_size + model.v_size, model.attn_out_size
    a = np.asarray(act_bytes, dtype=float)
    lse = 4.0 * model.num_attention_heads
    sdpa = np.where(selective, (q + kv + o) * a, (q + rep * kv + o) * a + lse)
    ring = (q + kv + o) * a + np.where(a < 4, 4.0 * o, 0.0) + lse
    return np.where(np.asarray(cp) > 1, ring, sdpa) / np.asarray(tp, dtype=float)


def eager_norm_bytes_per_token(model: ModelSpec, act_bytes, norms: int = 2) -> np.ndarray:
    """RMSNorms on their (sequence-parallel) tokens: each keeps its input (the residual stream),
    its fp32 1/rms (4 bytes a token) and its normalised output before the weight product (the
    unfused RMSNorm's `* weight` saves it): 2h + 4 each. The weighted output is kept only as the
    column-parallel input."""
    return norms * (2.0 * model.hidden_size * np.asarray(act_bytes, dtype=float) + 4.0)


def eager_dense_layer_bytes(model: ModelSpec, tokens, tp, sp, cp, act_bytes, selective=False) -> np.ndarray:
    """Bytes one dense block of the built-in model keeps per microbatch of `tokens` (per CP rank):
    the norms on the sequence-parallel tokens; on all tokens the attention and MLP inputs (2h: the
    column-parallel linears save them; under SP that is DTensor's all-gathered copy, where Megatron
    keeps the shard and gathers again in the backward), the attention terms, and SwiGLU's w1 x,
    w3 x, silu(w1 x) and their product (4F/tp; Korthikanti's fused count is 3F)."""
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    a = np.asarray(act_bytes, dtype=float)
    seq = tokens / np.where(sp, tp, 1.0)
    full = (
        2.0 * model.hidden_size * a
        + eager_attention_bytes_per_token(model, tp, cp, act_bytes, selective)
        + 4.0 * model.ffn_hidden_size * a / tp
    )
    return seq * eager_norm_bytes_per_token(model, act_bytes) + tokens * full


def eager_moe_layer_bytes(model: ModelSpec, tokens, tp, sp, cp, etp, act_bytes, selective=False) -> np.ndarray:
    """An MoE block under the torch stack (measured on the built-in model, autopar/trial/model.py
    MoE): the eager attention side and MLP input of a dense block; the fp32 router probabilities
    and top-k weights; per routed copy of the tp-local tokens, the expert input (gathered over etp:
    etp rows of h), SwiGLU's four hidden tensors of the expert's ffn/etp columns (w1 x, w3 x,
    silu(w1 x), their product: 4F where the fused count is 3F) and the expert output kept for the
    router-weight product; a shared expert keeps a dense MLP's four hidden tensors."""
    m = model.moe
    assert m is not None  # a MoE model
    a = np.asarray(act_bytes, dtype=float)
    h = model.hidden_size
    dense = eager_dense_layer_bytes(model, tokens, tp, sp, cp, act_bytes, selective)
    mlp = np.asarray(tokens, dtype=float) * 4.0 * model.ffn_hidden_size * a / tp
    local = np.asarray(tokens, dtype=float) / np.asarray(tp, dtype=float)
    routed = m.top_k * (h * np.asarray(etp, dtype=float) + 4.0 * m.expert_ffn_hidden_size + h) * a
    router = 4.0 * (m.num_experts + m.top_k)  # fp32 softmax probabilities and top-k weights
    shared = 4.0 * m.shared_expert_ffn_hidden_size * a
    return dense - mlp + local * (router + routed + shared)


def eager_head_bytes(model: ModelSpec, tokens, tp, sp, act_bytes) -> np.ndarray:
    """Last stage: the final norm as a block's (sequence-parallel tokens), the LM head's input on
    all tokens (DTensor's gathered copy under SP), and the fp32 log-softmax of the vocab-parallel
    logits that the cross-entropy backward needs (the logits themselves are freed)."""
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    a = np.asarray(act_bytes, dtype=float)
    norm = eager_norm_bytes_per_token(model, act_bytes, norms=1)
    return tokens * (norm / np.where(sp, tp, 1.0) + model.hidden_size * a + 4.0 * padded_vocab(model, tp) / tp)


def eager_loss_transient_bytes(model: ModelSpec, tokens, tp) -> np.ndarray:
    """Live at the start of the last stage's backward, on top of the stored activations: the fp32
    [tokens, vocab/tp] gradients torch's cross-entropy materialises. Plain `F.cross_entropy`
    (log_softmax + nll_loss): d(log-probabilities) and d(logits), two; DTensor `loss_parallel`
    (tp > 1): one, its nll_loss backward returns the logits' gradient and the log-softmax backward
    passes it through (torch/distributed/tensor/parallel/loss.py). Megatron's fused vocab-parallel
    cross-entropy computes it in place."""
    tp = np.asarray(tp, dtype=float)
    return np.asarray(tokens, dtype=float) * 4.0 * padded_vocab(model, tp) / tp * np.where(tp > 1, 1.0, 2.0)


def eager_backward_working_bytes(model: ModelSpec, tokens, tp, act_bytes) -> np.ndarray:
    """A block's backward, on top of what is stored: the down projection's input gradient
    [tokens, F/tp] and its fresh fp32 weight gradient [h, F/tp] before it is accumulated
    (measured on the built-in model: the largest pair of gradient temporaries of a SwiGLU block)."""
    ffn = model.ffn_hidden_size / np.asarray(tp, dtype=float)
    return ffn * (np.asarray(tokens, dtype=float) * np.asarray(act_bytes, dtype=float) + 4.0 * model.hidden_size)
