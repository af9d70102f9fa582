"""What the built-in model can run: the model and plan features it refuses, as sentences. No torch
import, so the CLI and the measured stage can check a plan before launching anything."""

from __future__ import annotations

from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan


def model_problems(spec: ModelSpec) -> list[str]:
    """Spec features the built-in Llama-style model does not implement, as sentences."""
    out = []
    if spec.mla is not None:
        out.append("multi-head latent attention (MLA) is not implemented")
    if not spec.gated_mlp:
        out.append("only the gated (SwiGLU) MLP is implemented")
    if spec.norm != "rmsnorm":
        out.append("only RMSNorm is implemented")
    if spec.qk_norm or spec.qkv_bias or spec.linear_bias:
        out.append("QK-norm and linear biases are not implemented")
    if spec.learned_position_embeddings:
        out.append("learned position embeddings are not implemented (the model uses RoPE)")
    if spec.head_dim % 2:
        out.append(f"RoPE needs an even head_dim, got {spec.head_dim}")
    if spec.moe is not None and spec.moe.num_shared_experts and not spec.moe.shared_expert_ffn_hidden_size:
        out.append("shared experts need shared_expert_ffn_hidden_size")
    return out


def plan_problems(plan: ParallelPlan, spec: ModelSpec | None = None) -> list[str]:
    """Plan features the built-in model cannot run yet, as sentences (MoE ones when `spec` is given)."""
    out = []
    if spec is not None and spec.moe is not None and plan.etp not in (1, plan.tp):
        out.append(
            f"expert tensor parallelism over part of the tp group (etp = {plan.etp}, tp = {plan.tp}) is not "
            f"built: use etp = tp (each expert's FFN split like the dense MLP) or etp = 1 (experts whole, "
            f"EP folded over the tp ranks)"
        )
    if spec is not None and spec.tied_embeddings and plan.pp > 1:
        out.append(
            "tied embeddings under pipeline parallelism need an embedding-group gradient all-reduce, which "
            "the built-in model does not implement"
        )
    if plan.dtype == "fp8":
        out.append("fp8 training is not built (use bf16 or fp32)")
    if plan.sequence_parallel and plan.tp == 1:
        out.append("sequence parallelism needs tp > 1")
    return out
