"""Model specs: derived parameter counts against model cards, HF config.json conversion, and the
autopar model-file loader."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autopar.errors import InputError
from autopar.spec.hf_config import model_from_hf_config
from autopar.spec.model import ModelSpec
from autopar.spec.presets import get_preset, preset_names, published_counts, resolve_model

PUBLISHED = [n for n in preset_names() if published_counts(n)[0] is not None]


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds(name: str) -> None:
    m = get_preset(name)
    assert m.params_total > 0 and 0 < m.params_active <= m.params_total


@pytest.mark.parametrize("name", PUBLISHED)
def test_preset_params_match_model_card(name: str) -> None:
    total, active = published_counts(name)
    m = get_preset(name)
    assert m.params_total == pytest.approx(total, rel=0.01)
    if active is not None:
        assert m.params_active == pytest.approx(active, rel=0.03)


# Targets typed here, independent of models.toml, so an edit there cannot move them.
@pytest.mark.parametrize(
    "name,total,active",
    [("llama3-70b", 70.6e9, None), ("llama3.1-405b", 405.9e9, None), ("mixtral-8x7b", 46.7e9, 12.9e9)],
)
def test_known_targets(name: str, total: float, active: float | None) -> None:
    m = get_preset(name)
    assert m.params_total == pytest.approx(total, rel=0.01)
    assert m.params_active == pytest.approx(active or total, rel=0.01)


def test_llama2_7b_hand_derivation() -> None:
    h, ffn, layers, vocab = 4096, 11008, 32, 32000
    # per layer: q,k,v,o (4h^2) + gate,up,down (3*h*ffn) + two RMSNorms; embedding + LM head; final norm
    expected = layers * (4 * h**2 + 3 * h * ffn + 2 * h) + 2 * vocab * h + h
    assert expected == 6_738_415_616
    assert get_preset("llama2-7b").params_total == expected


# ---- HuggingFace config.json ---------------------------------------------------------------------

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1e6,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.37.2",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}


def _write(tmp_path: Path, data: object, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    "cfg,preset",
    [
        (LLAMA3_8B, "llama3-8b"),
        (MIXTRAL_8X7B, "mixtral-8x7b"),
        (QWEN3_30B_A3B, "qwen3-30b-a3b"),
        (DEEPSEEK_V3, "deepseek-v3"),
    ],
)
def test_hf_config_matches_preset(tmp_path: Path, cfg: dict, preset: str) -> None:
    m = resolve_model(_write(tmp_path, cfg))
    p = get_preset(preset)
    assert (m.params_total, m.params_active) == (p.params_total, p.params_active)
    # every shape field agrees; only the training length differs (the preset may pick a shorter one)
    assert replace(m, name=p.name, seq_len=p.seq_len) == p
    assert m.seq_len == min(cfg["max_position_embeddings"], 8192)


def test_hf_config_qwen2_7b(tmp_path: Path) -> None:
    m = resolve_model(_write(tmp_path, QWEN2_7B))
    assert m.qkv_bias and not m.linear_bias and not m.qk_norm
    assert m.params_total == pytest.approx(7.62e9, rel=0.01)
    h, ffn, q, kv = 3584, 18944, 28 * 128, 4 * 128
    per_layer = h * (q + 2 * kv) + q * h + (q + 2 * kv) + 3 * h * ffn + 2 * h
    assert m.params_total == 28 * per_layer + 2 * 152064 * h + h == 7_615_616_512


def test_hf_config_name_is_folder_of_config_json(tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    assert resolve_model(_write(folder, LLAMA3_8B)).name == "Meta-Llama-3-8B"
    assert resolve_model(_write(tmp_path, LLAMA3_8B, "llama.json")).name == "llama"


def test_hf_config_architecture_without_model_type() -> None:
    cfg = {k: v for k, v in LLAMA3_8B.items() if k != "model_type"}
    assert model_from_hf_config(cfg, "x").params_total == get_preset("llama3-8b").params_total


def _hf_moe_layers_qwen3(n: int, step: int, mlp_only: list[int]) -> tuple[bool, ...]:
    """transformers Qwen3MoeDecoderLayer's rule."""
    return tuple(i not in mlp_only and (i + 1) % step == 0 for i in range(n))


@pytest.mark.parametrize(
    "step,mlp_only", [(1, []), (2, []), (3, []), (1, [0, 1]), (2, [0, 1, 2]), (3, [0]), (4, [0, 1, 2, 3, 4])]
)
def test_qwen3_moe_layer_pattern(step: int, mlp_only: list[int]) -> None:
    cfg = dict(QWEN3_30B_A3B, num_hidden_layers=12, decoder_sparse_step=step, mlp_only_layers=mlp_only)
    m = model_from_hf_config(cfg, "q")
    assert m.moe_layer_mask == _hf_moe_layers_qwen3(12, step, mlp_only)


@pytest.mark.parametrize("freq,first_k", [(1, 0), (1, 3), (2, 0), (2, 3), (3, 1), (3, 6)])
def test_deepseek_moe_layer_pattern(freq: int, first_k: int) -> None:
    cfg = dict(DEEPSEEK_V3, num_hidden_layers=12, moe_layer_freq=freq, first_k_dense_replace=first_k)
    m = model_from_hf_config(cfg, "d")
    # transformers DeepseekV3DecoderLayer's rule
    assert m.moe_layer_mask == tuple(i >= first_k and i % freq == 0 for i in range(12))


def test_deepseek_router_bias_follows_topk_method() -> None:
    assert model_from_hf_config(DEEPSEEK_V3, "d").moe.router_bias
    assert not model_from_hf_config(dict(DEEPSEEK_V3, topk_method="greedy"), "d").moe.router_bias


def test_qwen3_dense_has_qk_norm() -> None:
    cfg = dict(LLAMA3_8B, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=128)
    m = model_from_hf_config(cfg, "q")
    assert m.qk_norm and m.moe is None


def test_llama_attention_and_mlp_bias_is_linear_bias() -> None:
    m = model_from_hf_config(dict(LLAMA3_8B, attention_bias=True, mlp_bias=True), "b")
    assert m.linear_bias
    with pytest.raises(InputError, match="attention_bias"):
        model_from_hf_config(dict(LLAMA3_8B, attention_bias=True), "b")


@pytest.mark.parametrize(
    "cfg,pattern",
    [
        (dict(LLAMA3_8B, model_type="gpt2"), r"'gpt2' is not supported.*llama.*deepseek_v3"),
        (
            {k: v for k, v in LLAMA3_8B.items() if k not in ("model_type", "architectures")},
            "cannot tell the model family",
        ),
        (
            {k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"},
            r"config.json: missing 'hidden_size' \(required for a llama model\)",
        ),
        ({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"}, "'num_local_experts'"),
        (dict(LLAMA3_8B, hidden_size=4096.0), r"'hidden_size' must be a positive integer, got 4096.0"),
        (dict(LLAMA3_8B, num_hidden_layers=-2), "'num_hidden_layers' must be a positive integer"),
        (dict(LLAMA3_8B, vocab_size="128256"), "'vocab_size' must be a positive integer"),
        (dict(LLAMA3_8B, tie_word_embeddings="no"), "'tie_word_embeddings' must be true or false"),
        (dict(LLAMA3_8B, num_key_value_heads=5), r"must be a multiple of num_kv_heads \(5\)"),
        (dict(QWEN3_30B_A3B, mlp_only_layers=[3, 7]), "'mlp_only_layers'"),
        (dict(QWEN3_30B_A3B, mlp_only_layers=[1, 2]), "'mlp_only_layers'"),
        (dict(DEEPSEEK_V3, first_k_dense_replace=-1), "'first_k_dense_replace' must be an integer >= 0"),
    ],
)
def test_hf_config_errors(cfg: dict, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern) as e:
        model_from_hf_config(cfg, "x")
    assert "\n" not in str(e.value)


# ---- autopar model files -------------------------------------------------------------------------

TINY_YAML = """\
name: my-tiny
num_layers: 4
hidden_size: 128
ffn_hidden_size: 352
num_attention_heads: 4
num_kv_heads: 2
head_dim: 32
vocab_size: 512
seq_len: 128
"""


def test_yaml_model_file(tmp_path: Path) -> None:
    m = resolve_model(_write(tmp_path, TINY_YAML, "tiny.yaml"))
    assert m.name == "my-tiny"
    assert replace(m, name="tiny") == get_preset("tiny")


def test_yaml_model_file_with_moe_and_default_name(tmp_path: Path) -> None:
    text = TINY_YAML.replace("name: my-tiny\n", "") + (
        "moe:\n  num_experts: 4\n  top_k: 2\n  expert_ffn_hidden_size: 256\n"
    )
    m = resolve_model(_write(tmp_path, text, "small-moe.yml"))
    assert m.name == "small-moe"
    assert replace(m, name="tiny-moe") == get_preset("tiny-moe")


def test_json_model_file_round_trips_to_dict(tmp_path: Path) -> None:
    p = get_preset("deepseek-v3")
    m = resolve_model(_write(tmp_path, dict(p.to_dict(), name="dsv3"), "dsv3.json"))
    assert replace(m, name=p.name) == p
    assert m.params_total == p.params_total


@pytest.mark.parametrize(
    "name,text,pattern",
    [
        ("bad.yaml", TINY_YAML + "num_layerz: 3\n", "num_layerz"),
        ("bad.yaml", TINY_YAML + "moe:\n  num_experts: 4\n  top_k: 2\n  expert_ffn: 256\n", "expert_ffn"),
        ("bad.yaml", TINY_YAML + "moe: [4, 2]\n", "'moe' must be a mapping"),
        (
            "bad.yaml",
            "num_layers: 4\nhidden_size: [128\nfoo: 1\n",
            r"model file 'bad.yaml' is not valid YAML \(line \d+, column \d+\): .*; fix the syntax",
        ),
        ("bad.yaml", "- 1\n- 2\n", "must hold a mapping.*got a list"),
        ("empty.yaml", "", "must hold a mapping.*got nothing"),
        ("bad.json", '{"num_layers": 4,}', r"model file 'bad.json' is not valid JSON \(line 1, column 18\)"),
        ("bad.json", "[1, 2]", "must hold a mapping"),
    ],
)
def test_model_file_errors(tmp_path: Path, name: str, text: str, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern) as e:
        resolve_model(_write(tmp_path, text, name))
    assert "\n" not in str(e.value)


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.yaml"))


def test_unknown_preset_suggests() -> None:
    with pytest.raises(InputError, match="did you mean 'llama3-70b'"):
        resolve_model("lama3-70b")


def test_model_spec_rejects_bad_shape() -> None:
    with pytest.raises(InputError, match="num_kv_heads"):
        replace(get_preset("tiny"), num_kv_heads=3)
    assert isinstance(get_preset("tiny"), ModelSpec)
