"""FLOPs per token under the counting conventions published runs use for TFLOP/s and MFU.

A published TFLOP/s or MFU figure is only a throughput once its FLOP convention is known:
tokens/s/GPU = TFLOP/s/GPU * 1e12 / (FLOPs per token of that convention). Sources differ in
whether attention is causal-halved, whether embeddings count, and whether recompute counts.
"""

from __future__ import annotations

from autopar.cost.flops import model_flops_per_step, padded_vocab
from autopar.spec.model import ModelSpec

#: convention -> what it counts (shown with the validation assumptions)
CONVENTIONS = {
    "megatron-causal": "current Megatron-Core (causal attention halved; since 2025-03-06)",
    "megatron-full": "Megatron before 2025-03 and NeMo 24.x (full, non-causal attention)",
    "narayanan": "Narayanan et al. 2021 (96*B*s*l*h^2*(1 + s/6h + V/16lh): counts the recompute)",
    "6n-full-attention": "llm-foundry collect_results.py (6 * all params incl. embeddings + 12*L*h*s, non-causal)",
    "palm": "PaLM / nanoGPT / torchtitan (6 * params + 12*L*H*Q*T, non-causal)",
}


def flops_per_token(convention: str, model: ModelSpec, seq_len: int, tp: int = 1) -> float:
    """FLOPs per trained token under `convention` (one of CONVENTIONS)."""
    s = seq_len
    L, h = model.num_layers, model.hidden_size
    if convention == "megatron-causal":
        return float(model_flops_per_step(model, 1, s, tp) / s)
    if convention == "narayanan":  # Narayanan et al. 2021 appendix, full recompute (4 passes)
        V = int(padded_vocab(model, tp))
        return 96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    if convention == "megatron-full":  # Megatron num_floating_point_operations before 8873b55d6a
        V = int(padded_vocab(model, tp))
        q = model.q_size / h
        gl = 1.5 if model.gated_mlp else 1.0
        return (
            12
            * L
            * h
            * h
            * (
                (1 + model.num_kv_heads / model.num_attention_heads + s / h) * q
                + model.ffn_hidden_size / h * gl
                + V / (2 * L * h)
            )
        )
    attention = 12.0 * L * model.num_attention_heads * model.qk_head_dim * s  # 12*L*H*Q*T, non-causal
    if convention == "6n-full-attention":  # llm-foundry counts every parameter (tied wte, learned wpe)
        return 6.0 * model.params_total + attention
    if convention == "palm":  # torchtitan 2024 train.py / nanoGPT estimate_mfu: every parameter but positions
        return 6.0 * (model.params_active - model.position_embedding_params) + attention
    raise ValueError(f"unknown FLOP convention {convention!r}")
