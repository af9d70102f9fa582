"""HuggingFace `config.json` -> ModelSpec, for the Llama, Mistral/Mixtral, Qwen2, Qwen3(-MoE) and
DeepSeek-V3 families. Key names and their meaning follow each family's `modeling_*.py` in
HuggingFace transformers; every family here uses RMSNorm and a gated (SwiGLU) MLP."""

from __future__ import annotations

from typing import Any

from autopar.errors import InputError, quoted
from autopar.spec.model import MLASpec, ModelSpec, MoESpec

#: the longest sequence a converted config trains at by default (long-context models advertise
#: far more positions than anyone pre-trains with)
DEFAULT_SEQ_LEN_CAP = 8192

_FAMILY_BY_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
SUPPORTED_MODEL_TYPES = tuple(_FAMILY_BY_ARCH.values())
_MISSING = object()


class _Reader:
    """Typed access to config keys, with errors that name the file, key and family."""

    def __init__(self, cfg: dict, family: str, source: str) -> None:
        self.cfg, self.family, self.source = cfg, family, source

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1) -> Any:
        """An integer >= minimum; `default` when absent or null (required when no default)."""
        v = self.cfg.get(key)
        if v is None:
            if default is _MISSING:
                raise InputError(
                    f"{self.source}: missing '{key}' (required for a {self.family} model); add it to the file"
                )
            return default
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise InputError(f"{self.source}: '{key}' must be {kind}, got {quoted(v)}; fix the value")
        return v

    def number(self, key: str) -> float | None:
        """A positive number, or None when absent or null (ModelSpec checks the range)."""
        v = self.cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise InputError(f"{self.source}: '{key}' must be a positive number, got {quoted(v)}; fix the value")
        return None if v is None else float(v)

    def bool(self, key: str, default: bool = False) -> bool:
        """A true/false flag; `default` when absent or null."""
        v = self.cfg.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InputError(f"{self.source}: '{key}' must be true or false, got {quoted(v)}; fix the value")
        return v


def _family(cfg: dict, source: str) -> str:
    """The model family, from `model_type` or else `architectures`."""
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    model_type = cfg.get("model_type")
    if model_type is not None:
        if isinstance(model_type, str) and model_type in SUPPORTED_MODEL_TYPES:
            return model_type
        raise InputError(
            f"{source}: model_type {quoted(model_type)} is not supported (supported: "
            f"{supported}); write an autopar model file (YAML) for other models"
        )
    archs = cfg.get("architectures") or []
    for arch in archs if isinstance(archs, list) else []:
        if isinstance(arch, str) and arch in _FAMILY_BY_ARCH:
            return _FAMILY_BY_ARCH[arch]
    raise InputError(
        f"{source}: cannot tell the model family (model_type missing, architectures "
        f"{quoted(archs)}); supported model_type values: {supported}; add 'model_type' "
        f"or write an autopar model file (YAML)"
    )


def _leading_dense_block(cfg: dict, num_layers: int, source: str) -> int:
    """Qwen3-MoE `mlp_only_layers`: how many leading layers are dense (only a leading block)."""
    layers = cfg.get("mlp_only_layers") or []
    if (
        not isinstance(layers, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
        or sorted(layers) != list(range(len(layers)))
        or len(layers) > num_layers
    ):
        raise InputError(
            f"{source}: 'mlp_only_layers' = {quoted(layers)} is not supported: autopar "
            f"models only a leading block of dense layers ([] or [0, 1, ..., k-1]); "
            f"write an autopar model file (YAML) instead"
        )
    return len(layers)


def _biases(r: _Reader) -> dict[str, bool]:
    """Bias flags. Qwen2 always biases q/k/v; Llama's attention_bias+mlp_bias = every linear."""
    if r.family == "qwen2":
        return {"qkv_bias": True}
    attn = r.family in ("llama", "qwen3", "qwen3_moe", "deepseek_v3") and r.bool("attention_bias")
    mlp = r.family == "llama" and r.bool("mlp_bias")
    if attn and mlp:
        return {"linear_bias": True}
    if attn or mlp:
        key = "attention_bias" if attn else "mlp_bias"
        raise InputError(
            f"{r.source}: '{key}: true' alone is not supported: autopar models q/k/v "
            f"biases (qkv_bias) or a bias on every linear layer (linear_bias); "
            f"write an autopar model file (YAML) instead"
        )
    return {}


def _moe(r: _Reader, num_layers: int) -> MoESpec | None:
    """The MoE block, mapped onto MoESpec's `first_k_dense` + `layer_freq` layer pattern."""
    if r.family == "mixtral":
        return MoESpec(
            num_experts=r.int("num_local_experts"),
            top_k=r.int("num_experts_per_tok"),
            expert_ffn_hidden_size=r.int("intermediate_size"),
        )
    if r.family == "qwen3_moe":
        # HF: layer i is MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
        step = r.int("decoder_sparse_step", default=1)
        dense = _leading_dense_block(r.cfg, num_layers, r.source)
        first = -(-(dense + 1) // step) * step - 1  # first i >= dense with (i + 1) % step == 0
        return MoESpec(
            num_experts=r.int("num_experts"),
            top_k=r.int("num_experts_per_tok"),
            expert_ffn_hidden_size=r.int("moe_intermediate_size"),
            first_k_dense=min(first, num_layers),
            layer_freq=step,
        )
    if r.family == "deepseek_v3":
        # HF: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0
        freq = r.int("moe_layer_freq", default=1)
        first = -(-r.int("first_k_dense_replace", default=0, minimum=0) // freq) * freq
        ffn = r.int("moe_intermediate_size")
        shared = r.int("n_shared_experts", default=0, minimum=0)
        return MoESpec(
            num_experts=r.int("n_routed_experts"),
            top_k=r.int("num_experts_per_tok"),
            expert_ffn_hidden_size=ffn,
            num_shared_experts=shared,
            shared_expert_ffn_hidden_size=shared * ffn,
            first_k_dense=min(first, num_layers),
            layer_freq=freq,
            router_bias=r.cfg.get("topk_method") == "noaux_tc",
            # node-limited routing: n_group groups of experts, topk_group of them per token
            router_groups=r.int("n_group", default=1),
            router_group_topk=r.int("topk_group", default=1),
        )
    return None


def model_from_hf_config(cfg: dict, name: str, source: str = "config.json") -> ModelSpec:
    """Convert a HuggingFace config.json dict; `source` names the file in error messages."""
    if not isinstance(cfg, dict):
        raise InputError(
            f"{source}: expected a JSON object of config keys, got {type(cfg).__name__}; pass the model's config.json"
        )
    r = _Reader(cfg, _family(cfg, source), source)
    num_layers, hidden, heads = r.int("num_hidden_layers"), r.int("hidden_size"), r.int("num_attention_heads")
    mla = None
    if r.family == "deepseek_v3":
        mla = MLASpec(
            q_lora_rank=r.int("q_lora_rank", default=None),
            kv_lora_rank=r.int("kv_lora_rank"),
            qk_nope_head_dim=r.int("qk_nope_head_dim"),
            qk_rope_head_dim=r.int("qk_rope_head_dim"),
            v_head_dim=r.int("v_head_dim"),
        )
    # MLA's per-head widths live in `mla`; head_dim then records the value head width
    head_dim = mla.v_head_dim if mla else r.int("head_dim", default=hidden // heads or None)
    if head_dim is None:
        raise InputError(
            f"{source}: hidden_size ({hidden}) is smaller than num_attention_heads "
            f"({heads}) and 'head_dim' is missing; add 'head_dim'"
        )
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden,
        ffn_hidden_size=r.int("intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", default=heads),
        head_dim=head_dim,
        vocab_size=r.int("vocab_size"),
        seq_len=min(r.int("max_position_embeddings"), DEFAULT_SEQ_LEN_CAP),
        tied_embeddings=r.bool("tie_word_embeddings"),
        norm="rmsnorm",
        qk_norm=r.family in ("qwen3", "qwen3_moe"),
        moe=_moe(r, num_layers),
        mla=mla,
        rope_theta=r.number("rope_theta"),
        norm_epsilon=r.number("rms_norm_eps"),
        source=f"HuggingFace {r.family} config ({source})",
        **_biases(r),
    )
