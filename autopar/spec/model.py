"""The model spec: a decoder-only transformer's shape. Parameter counts are derived, never typed in.

Parameter counting follows Megatron-LM `megatron/training/theoretical_memory_usage.py` (HEAD
d98e8a6, reference section A.1.a), term for term, with three additions that model cards count and
Megatron's estimator leaves out: linear biases (GPT-3), QK-norm weights (Qwen3) and learned position
embeddings (GPT-3).

MLA (DeepSeek-V3): parameters use Megatron's exact MLA terms. Activations and attention FLOPs use
the *equivalent projection sizes* that MLA materialises after up-projection: every head gets its own
K of width qk_nope+qk_rope and V of width v_head_dim (so kv heads = attention heads), which is what
Megatron-Core's MLA attention computes on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from autopar.errors import InputError, quoted
from autopar.spec.schema import MAX_NAME_CHARS, MLA_LIMITS, MODEL_LIMITS, MOE_LIMITS, breaks_line

#: the model's true/false fields
_FLAGS = (
    "gated_mlp",
    "tied_embeddings",
    "qk_norm",
    "qkv_bias",
    "linear_bias",
    "learned_position_embeddings",
    "dropout",
)


def _field_problems(obj, limits: dict, prefix: str) -> list[str]:
    """The integer fields of `obj` outside their (lowest, highest) limits, as sentences (None is
    allowed for MLA's optional query rank)."""
    out = []
    for f, (lo, hi) in limits.items():
        v = getattr(obj, f)
        if v is None and f == "q_lora_rank":
            continue
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            kind = "a positive integer" if lo == 1 else "a non-negative integer"
            out.append(f"{prefix}{f} must be {kind} up to {hi:,}, got {quoted(v)}")
    return out


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts shape. Which layers are MoE: after `first_k_dense` dense layers, every
    `layer_freq`-th layer (Megatron `--moe-layer-freq`, DeepSeek `first_k_dense_replace`)."""

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    #: total intermediate size of the shared experts (Megatron `moe_shared_expert_intermediate_size`)
    shared_expert_ffn_hidden_size: int = 0
    first_k_dense: int = 0
    layer_freq: int = 1
    #: DeepSeek-V3's aux-loss-free balancing bias: one extra parameter per expert
    router_bias: bool = False
    #: group-limited routing (Megatron `--moe-router-num-groups` / `--moe-router-group-topk`, HF
    #: `n_group` / `topk_group`): the experts in `router_groups` equal groups of consecutive experts,
    #: each token routed inside the `router_group_topk` groups its top experts score highest; 1 / 1:
    #: no limit. DeepSeek-V3: 8 / 4, one group per node at EP64, so a token reaches at most 4 nodes
    #: (DeepSeek-V3 report sec. 2.1.2, "node-limited routing")
    router_groups: int = 1
    router_group_topk: int = 1


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3). `q_lora_rank` None = no query compression."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, kw_only=True)
class LayerParams:
    """Parameters of one transformer layer, split the way Megatron shards them."""

    tp_sharded: int  # attention + dense MLP / shared experts: divided by TP
    replicated: int  # norms, router, row-parallel biases: on every TP rank
    expert: int  # routed experts: divided by EP x ETP


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    seq_len: int
    gated_mlp: bool = True
    tied_embeddings: bool = False
    norm: str = "rmsnorm"  # "rmsnorm" | "layernorm"
    qk_norm: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False  # every linear layer has a bias (GPT-2/3 style)
    learned_position_embeddings: bool = False
    dropout: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    #: RoPE base frequency (config.json `rope_theta`); None = not stated. Exports only: no cost term
    #: depends on it, hence compare=False like `source`
    rope_theta: float | None = field(default=None, compare=False)
    #: the norms' epsilon (config.json `rms_norm_eps` / `layer_norm_epsilon`); None = not stated
    norm_epsilon: float | None = field(default=None, compare=False)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise InputError(f"model {quoted(self.name)}: " + "; ".join(problems[:4]))

    def problems(self) -> list[str]:
        """Every inconsistency in the shape, as sentences (each size within autopar.spec.schema's
        limits, so no per-layer loop runs for ever)."""
        out = _field_problems(self, MODEL_LIMITS, "")
        if not isinstance(self.name, str) or len(self.name) > MAX_NAME_CHARS:
            out.append(f"name must be a string of at most {MAX_NAME_CHARS} characters, got {quoted(self.name)}")
        elif breaks_line(self.name):
            out.append(f"name must be one line without control characters, got {quoted(self.name)}")
        for f in _FLAGS:
            if not isinstance(getattr(self, f), bool):
                out.append(f"{f} must be true or false, got {quoted(getattr(self, f))}")
        if self.norm not in ("rmsnorm", "layernorm"):
            out.append(f"norm must be 'rmsnorm' or 'layernorm', got {quoted(self.norm)}")
        for f in ("rope_theta", "norm_epsilon"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
                out.append(f"{f} must be a positive number, got {quoted(v)}")
        for key, typ, limits in (("moe", MoESpec, MOE_LIMITS), ("mla", MLASpec, MLA_LIMITS)):
            sub = getattr(self, key)
            if sub is not None and not isinstance(sub, typ):
                out.append(f"{key} must be a mapping of its fields, got {quoted(sub)}")
            elif sub is not None:
                out += _field_problems(sub, limits, f"{key}.")
        if out:
            return out
        if self.num_attention_heads % self.num_kv_heads:
            out.append(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.moe is not None:
            m = self.moe
            if not isinstance(m.router_bias, bool):
                out.append(f"moe.router_bias must be true or false, got {quoted(m.router_bias)}")
            if m.top_k > m.num_experts:
                out.append(f"moe.top_k ({m.top_k}) exceeds moe.num_experts ({m.num_experts})")
            if m.num_experts % m.router_groups:
                out.append(
                    f"moe.router_groups ({m.router_groups}) must divide moe.num_experts ({m.num_experts}): "
                    f"the groups are equal runs of consecutive experts"
                )
            elif m.router_group_topk > m.router_groups or m.top_k % m.router_group_topk:
                out.append(
                    f"moe.router_group_topk ({m.router_group_topk}) must be at most moe.router_groups "
                    f"({m.router_groups}) and divide moe.top_k ({m.top_k}) (Megatron scores a group by its "
                    f"top top_k / router_group_topk experts)"
                )
            if not 0 <= m.first_k_dense <= self.num_layers:
                out.append(f"moe.first_k_dense ({m.first_k_dense}) must be within 0..num_layers")
            if m.num_shared_experts and not m.shared_expert_ffn_hidden_size:
                out.append("moe.num_shared_experts is set but shared_expert_ffn_hidden_size is 0")
        return out

    # ---- shape facts shared by memory, FLOPs and the built-in model ---------------------------

    @property
    def norm_params(self) -> int:
        """Parameters of one norm: RMSNorm has a weight, LayerNorm a weight and a bias."""
        return self.hidden_size * (1 if self.norm == "rmsnorm" else 2)

    @property
    def qk_head_dim(self) -> int:
        return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def kv_heads_effective(self) -> int:
        """K/V heads as computed on: MLA up-projects a K and V for every head."""
        return self.num_attention_heads if self.mla else self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.qk_head_dim

    @property
    def k_size(self) -> int:
        return self.kv_heads_effective * self.qk_head_dim

    @property
    def v_size(self) -> int:
        return self.kv_heads_effective * self.v_head_dim

    @property
    def attn_out_size(self) -> int:
        """Width of the attention output, the input of the output projection."""
        return self.num_attention_heads * self.v_head_dim

    def is_moe_layer(self, index: int) -> bool:
        m = self.moe
        if m is None or index < m.first_k_dense:
            return False
        return (index - m.first_k_dense) % m.layer_freq == 0

    @property
    def moe_layer_mask(self) -> tuple[bool, ...]:
        return tuple(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        """Layers first_k_dense, first_k_dense + layer_freq, ... below num_layers (closed form)."""
        m = self.moe
        if m is None or self.num_layers <= m.first_k_dense:
            return 0
        return -(-(self.num_layers - m.first_k_dense) // m.layer_freq)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---- parameters ---------------------------------------------------------------------------

    @property
    def attention_weight_params(self) -> int:
        """Attention projection weights. Source: Megatron theoretical_memory_usage.py (A.1.a)
        `self_attn_term` (GQA form, and the MLA form when `mla` is set)."""
        h = self.hidden_size
        if self.mla is None:
            return h * (self.q_size + self.k_size + self.v_size) + self.attn_out_size * h
        m, n = self.mla, self.num_attention_heads
        # the query: straight from h without a latent, else its down-projection and norm
        q_term = h * n * (m.qk_nope_head_dim + m.qk_rope_head_dim) if m.q_lora_rank is None else m.q_lora_rank * (h + 1)
        kv_term = m.kv_lora_rank * (h + 1)  # the keys' and values' down-projection and its norm
        return q_term + kv_term + self.mla_up_projection_params + h * m.qk_rope_head_dim + n * m.v_head_dim * h

    @property
    def mla_up_projection_params(self) -> int:
        """MLA's up-projection weights: the query's from its latent (q_lora_rank x heads x qk head
        dim) and the keys' and values' from theirs (kv_lora_rank x heads x (qk nope + v head dim));
        0 without MLA. Megatron's --recompute-modules mla_up_proj recomputes these GEMMs."""
        m = self.mla
        if m is None:
            return 0
        n = self.num_attention_heads
        q_up = (m.q_lora_rank or 0) * n * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        return q_up + m.kv_lora_rank * n * (m.qk_nope_head_dim + m.v_head_dim)

    def _mlp_weight_params(self, ffn: int) -> int:
        """Source: Megatron A.1.a `dense_mlp_params = 2*h*ffn*gated_linear_multiplier`."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    def _mlp_bias_params(self, ffn: int) -> tuple[int, int]:
        """(column-parallel, row-parallel) MLP bias parameters when linear layers carry biases."""
        if not self.linear_bias:
            return 0, 0
        return (2 if self.gated_mlp else 1) * ffn, self.hidden_size

    def layer_params(self, moe_layer: bool) -> LayerParams:
        """One layer's parameters by sharding class (Megatron A.1.a `tp_sharded`/`replicated`/
        `expert_sharded` split)."""
        h = self.hidden_size
        col_bias = (self.q_size + self.k_size + self.v_size) if (self.qkv_bias or self.linear_bias) else 0
        row_bias = h if self.linear_bias else 0
        replicated = 2 * self.norm_params + row_bias + (2 * self.qk_head_dim if self.qk_norm else 0)
        tp_sharded = self.attention_weight_params + col_bias
        expert = 0
        if not moe_layer:
            mlp_col_bias, mlp_row_bias = self._mlp_bias_params(self.ffn_hidden_size)
            tp_sharded += self._mlp_weight_params(self.ffn_hidden_size) + mlp_col_bias
            replicated += mlp_row_bias
        else:
            m = self.moe
            assert m is not None
            tp_sharded += self._mlp_weight_params(m.shared_expert_ffn_hidden_size)
            replicated += h * m.num_experts + (m.num_experts if m.router_bias else 0)
            expert = m.num_experts * self._mlp_weight_params(m.expert_ffn_hidden_size)
        return LayerParams(tp_sharded=tp_sharded, replicated=replicated, expert=expert)

    @property
    def embedding_params(self) -> int:
        """Input embedding (vocab x hidden). Source: Megatron A.1.a `embedding_size`."""
        return self.vocab_size * self.hidden_size

    @property
    def output_params(self) -> int:
        """The LM head's own weights: 0 when tied to the embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def position_embedding_params(self) -> int:
        return self.seq_len * self.hidden_size if self.learned_position_embeddings else 0

    @property
    def params_total(self) -> int:
        """All parameters. Source: Megatron A.1.a (sum of every term) + the additions above."""
        dense = self.layer_params(False)
        moe = self.layer_params(True) if self.moe else dense
        per_dense = dense.tp_sharded + dense.replicated + dense.expert
        per_moe = moe.tp_sharded + moe.replicated + moe.expert
        return (
            per_dense * self.num_dense_layers
            + per_moe * self.num_moe_layers
            + self.embedding_params
            + self.output_params
            + self.norm_params
            + self.position_embedding_params
        )

    @property
    def params_active(self) -> int:
        """Parameters one token touches: routed experts count top-k of num_experts."""
        if self.moe is None:
            return self.params_total
        inactive = self.layer_params(True).expert * (1 - self.moe.top_k / self.moe.num_experts)
        return round(self.params_total - inactive * self.num_moe_layers)

    def scaled(self, *, num_layers: int | None = None, width_divisor: int = 1) -> "ModelSpec":
        """A proxy: fewer layers and/or every width divided by `width_divisor` (same ratios)."""
        d = width_divisor
        changes: dict = {"name": f"{self.name}-proxy"}
        if num_layers is not None:
            changes["num_layers"] = num_layers
        if d != 1:
            changes.update(
                hidden_size=self.hidden_size // d,
                ffn_hidden_size=self.ffn_hidden_size // d,
                num_attention_heads=max(1, self.num_attention_heads // d),
                num_kv_heads=max(1, self.num_kv_heads // d),
            )
            if self.moe:
                changes["moe"] = replace(
                    self.moe,
                    expert_ffn_hidden_size=self.moe.expert_ffn_hidden_size // d,
                    shared_expert_ffn_hidden_size=self.moe.shared_expert_ffn_hidden_size // d,
                )
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain-data form (the autopar model-file schema)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "source":
                continue
            if isinstance(v, (MoESpec, MLASpec)):
                v = {g.name: getattr(v, g.name) for g in fields(v)}
            out[f.name] = v
        return out
