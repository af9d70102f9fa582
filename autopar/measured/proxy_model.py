"""How a proxy trial shrinks the model (autopar.measured.proxy): a stand-in for what the built-in
model cannot build (MLA -> multi-head attention, ...), every width divided (heads kept, head size
after), and the ladder of (layers per stage, width divisor, sequence divisor) a proxy tries."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan

#: most halvings of width and sequence the ladder tries
MAX_HALVINGS = 7


def model_dict(spec: ModelSpec) -> dict:
    return spec.to_dict() | {"name": spec.name}


def standin_model(spec: ModelSpec) -> tuple[ModelSpec, list[str]]:
    """The model with a stand-in for each part the built-in model does not build, and what changed."""
    changes: dict = {}
    said: list[str] = []
    if spec.mla is not None:
        hd = spec.qk_head_dim + spec.qk_head_dim % 2
        changes |= {"mla": None, "head_dim": hd, "num_kv_heads": spec.num_attention_heads}
        said.append(f"multi-head attention ({spec.num_attention_heads} heads of {hd}) stands in for MLA (not built)")
    if spec.qk_norm or spec.qkv_bias or spec.linear_bias:
        changes |= {"qk_norm": False, "qkv_bias": False, "linear_bias": False}
        said.append("no QK-norm or biases (not built)")
    if spec.norm != "rmsnorm":
        changes["norm"] = "rmsnorm"
        said.append(f"RMSNorm for {spec.norm} (not built)")
    if spec.learned_position_embeddings:
        changes["learned_position_embeddings"] = False
        said.append("RoPE for learned positions (not built)")
    if not spec.gated_mlp:
        ffn = max(64, int(round(2 * spec.ffn_hidden_size / 3 / 64)) * 64)
        changes |= {"gated_mlp": True, "ffn_hidden_size": ffn}
        said.append(f"SwiGLU MLP of {ffn} (same parameters) for the plain MLP (not built)")
    if "head_dim" not in changes and spec.head_dim % 2:
        changes["head_dim"] = spec.head_dim + 1
        said.append(f"head_dim {spec.head_dim + 1} (RoPE needs an even size)")
    if spec.moe is not None and spec.moe.num_shared_experts and not spec.moe.shared_expert_ffn_hidden_size:
        changes["moe"] = replace(spec.moe, num_shared_experts=0)
        said.append("no shared expert (no size given)")
    return (replace(spec, **changes) if changes else spec), said


def _head_split(spec: ModelSpec, wd: int, tp: int) -> tuple[int, int] | None:
    """How a width divisor `wd` splits into (fewer heads, smaller head_dim): head counts first, as
    far as the KV heads still divide over tp (so each tp rank keeps whole query groups), then the
    head size (kept even, for RoPE); None when it cannot."""
    f = 1
    while (
        wd % (2 * f) == 0
        and spec.num_kv_heads % (2 * f) == 0
        and spec.num_attention_heads % (2 * f) == 0
        and (spec.num_kv_heads // (2 * f)) % tp == 0
    ):
        f *= 2
    g = wd // f
    if spec.head_dim % g or (spec.head_dim // g) % 2:
        return None
    return f, g


def _narrow(spec: ModelSpec, wd: int, round_to: int, etp: int, tp: int) -> ModelSpec | None:
    """Every width divided by `wd` (hidden, FFN, expert FFN, vocabulary; heads and head size as
    _head_split says), FFN sizes rounded up to a multiple of `round_to` (tp) / etp; None when the
    heads cannot shrink by `wd`."""
    if wd == 1:
        return spec
    split = _head_split(spec, wd, tp)
    if split is None:
        return None
    f, g = split

    def div(n: int, mult: int) -> int:
        return max(mult, -(-n // wd // mult) * mult)

    changes: dict[str, Any] = {
        "hidden_size": max(8, spec.hidden_size // wd),
        "head_dim": spec.head_dim // g,
        "num_attention_heads": spec.num_attention_heads // f,
        "num_kv_heads": spec.num_kv_heads // f,
        "ffn_hidden_size": div(spec.ffn_hidden_size, round_to),
        "vocab_size": max(128, -(-spec.vocab_size // wd)),
    }
    if spec.moe is not None:
        m = spec.moe
        changes["moe"] = replace(
            m,
            expert_ffn_hidden_size=div(m.expert_ffn_hidden_size, etp),
            shared_expert_ffn_hidden_size=div(m.shared_expert_ffn_hidden_size, round_to)
            if m.shared_expert_ffn_hidden_size
            else 0,
        )
    return replace(spec, **changes)


def proxy_spec(
    base: ModelSpec,
    name: str,
    *,
    width_divisor: int,
    round_to: int,
    plan: ParallelPlan,
    ep: int,
    num_layers: int,
    seq_len: int,
) -> ModelSpec | None:
    """The proxy's model: `base` narrowed by `width_divisor` (_narrow), `num_layers` layers of
    `seq_len` tokens, and, for a MoE, the plan's experts per rank on `ep` expert ranks (top-k,
    leading dense layers and MoE frequency cut to what the fewer layers and experts allow); None
    when the width cannot shrink so."""
    assert plan.etp is not None  # ParallelPlan.__post_init__ resolves None to tp
    spec = _narrow(base, width_divisor, round_to, plan.etp, plan.tp)
    if spec is None:
        return None
    moe = spec.moe
    if moe is not None:
        experts = max(1, moe.num_experts // plan.ep) * ep
        moe = replace(
            moe,
            num_experts=experts,
            top_k=min(moe.top_k, experts),
            first_k_dense=0 if moe.first_k_dense >= num_layers else moe.first_k_dense,
            layer_freq=moe.layer_freq if moe.layer_freq <= num_layers else 1,
        )
    return replace(spec, num_layers=num_layers, seq_len=seq_len, moe=moe, name=name)


def _halvings(fixed: int | None, limit: int) -> list[int]:
    if fixed is not None:
        return [fixed]
    return [2**i for i in range(MAX_HALVINGS + 1) if 2**i <= limit]


def _ladder(lps_max: int, widths: list[int], seqs: list[int], fixed_lps: int | None) -> list[tuple[int, int, int]]:
    """(layers per virtual stage, width divisor, sequence divisor), least shrunk first: layers per
    stage halved down to 1, then width and sequence halved alternately."""
    lps = [fixed_lps] if fixed_lps else sorted({max(1, lps_max >> i) for i in range(12)}, reverse=True)
    out = [(n, widths[0], seqs[0]) for n in lps]
    wi = si = 0
    while wi < len(widths) - 1 or si < len(seqs) - 1:
        if wi <= si and wi < len(widths) - 1 or si >= len(seqs) - 1:
            wi += 1
        else:
            si += 1
        out.append((lps[-1], widths[wi], seqs[si]))
    return out
