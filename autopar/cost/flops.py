"""FLOPs. Convention: Megatron-LM `num_floating_point_operations` at HEAD (megatron/training/training.py):
model FLOPs, forward + backward = 3 x forward, 2 FLOPs per multiply-add, causal attention counted
as half the score matrix (Megatron since 2025-03-06, commit 8873b55d6a), padded vocabulary, the
router and norms not counted. Recomputation is hardware FLOPs only (HFU, not MFU).
"""

from __future__ import annotations

import numpy as np

from autopar.spec.model import ModelSpec

#: Megatron pads the vocabulary to a multiple of this times tp (`--make-vocab-size-divisible-by`)
VOCAB_DIVISOR = 128


def padded_vocab(model: ModelSpec, tp) -> np.ndarray:
    """Megatron `_vocab_size_with_padding`: round up to a multiple of 128 * tp."""
    unit = VOCAB_DIVISOR * np.asarray(tp, dtype=np.int64)
    return -(-model.vocab_size // unit) * unit


def attention_linear_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the attention projections per token: 2 x their weights
    (Megatron `standard_self_attn_term` / 3; the MLA projections likewise)."""
    return 2.0 * model.attention_weight_params


def mlp_flops_per_token(model: ModelSpec, moe_layer: bool) -> float:
    """Forward MLP FLOPs per token: 2 * h * ffn * (3 if SwiGLU else 2), with top-k routed experts
    plus shared experts on MoE layers (Megatron A.4.a `ffn_expansion_factor` terms)."""
    g = 3 if model.gated_mlp else 2
    h = model.hidden_size
    if not moe_layer:
        return 2.0 * h * model.ffn_hidden_size * g
    m = model.moe
    assert m is not None  # moe_layer: a MoE model
    return 2.0 * h * g * (m.expert_ffn_hidden_size * m.top_k + m.shared_expert_ffn_hidden_size)


def attention_core_flops_per_token(model: ModelSpec, seq_len) -> np.ndarray:
    """Forward score + value FLOPs per token, causal: 2 * heads * (d_qk + d_v) * s / 2
    (Megatron A.4.a `standard_self_attn_core_term`, '/2 causal mask')."""
    n = model.num_attention_heads
    return 2.0 * n * (model.qk_head_dim + model.v_head_dim) * np.asarray(seq_len, dtype=float) / 2


def head_flops_per_token(model: ModelSpec, tp) -> np.ndarray:
    """Forward LM-head FLOPs per token: 2 * h * padded vocab (Megatron A.4.a logit term)."""
    return 2.0 * model.hidden_size * padded_vocab(model, tp)


def layer_flops_per_token(model: ModelSpec, moe_layer: bool, seq_len) -> np.ndarray:
    """Forward FLOPs of one transformer layer per token."""
    return (
        attention_linear_flops_per_token(model)
        + mlp_flops_per_token(model, moe_layer)
        + attention_core_flops_per_token(model, seq_len)
    )


def model_flops_per_step(model: ModelSpec, global_batch, seq_len, tp=1) -> np.ndarray:
    """Model FLOPs of one training step: 3 x forward over every token of the global batch
    (Megatron A.4.a; for a dense GQA model this is the closed form
    6Bs*L*[h(2Qp + 2gd) + E*h*F] + 6Bs*h*V + 6*B*s^2*L*Qp)."""
    tokens = np.asarray(global_batch, dtype=float) * np.asarray(seq_len, dtype=float)
    per_token = (
        model.num_dense_layers * layer_flops_per_token(model, False, seq_len)
        + (model.num_moe_layers * layer_flops_per_token(model, True, seq_len) if model.moe else 0.0)
        + head_flops_per_token(model, tp)
    )
    return 3.0 * tokens * per_token
