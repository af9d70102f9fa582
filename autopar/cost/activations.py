"""Activation memory per layer and per microbatch, per GPU (vectorised over plans).

Source: Korthikanti et al. 2022 (arXiv:2205.05198) §4 and Table 2 (reference A.3), generalised:
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
    h = model.hidden_size
    local = np.asarray(tokens, dtype=float) / np.asarray(tp, dtype=float)
    attention = replicated_bytes_per_token(model) - 2 * h + attention_sharded_bytes_per_token(model)
    router = 2 * h + 4 * m.num_experts  # router input (= MLP input), fp32 logits
    routed = m.top_k * (2 * h * np.asarray(etp, dtype=float)
                        + _mlp_hidden_bytes(model, m.expert_ffn_hidden_size) + 2 * h)
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
