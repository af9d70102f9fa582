"""Issue 26 section 3: exports that submit as-is. The model facts (RoPE base, norm epsilon,
vocabulary padding) come from the model spec and reach each trainer's own config class; Megatron-
FSDP plans carry Megatron-FSDP's requirements; the checkpoint interval is the goodput model's
Young/Daly interval in steps, derived here by hand from the reliability defaults.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
from export_cases import CASES, CLUSTER

from autopar.export import get_exporter
from autopar.export.bash import read_bash_array
from autopar.export.bridge import parse_bridge_overrides
from autopar.export.megatron_parse import parse_megatron_args
from autopar.spec.presets import get_preset
from autopar.spec.resolve import resolve_plan

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")

REFS = Path(sys.prefix) / "trainer-refs"


def render(case, name: str):
    return get_exporter(name).render(case.plan, case.spec, case.cluster, case.options({}))


def megatron_ns(bundle):
    return parse_megatron_args(read_bash_array(bundle.text("megatron_args.sh"), "AUTOPAR_ARGS"))


def megatron_padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM `_vocab_size_with_padding` (megatron/training/tokenizer/tokenizer.py): round up to
    a multiple of make_vocab_size_divisible_by x tp."""
    multiple = divisible_by * tp
    return ((vocab + multiple - 1) // multiple) * multiple


# ---- the presets' facts are config.json's ----------------------------------------------------------


def test_presets_carry_config_json_rope_theta_and_norm_epsilon() -> None:
    # config.json `rope_theta` / `rms_norm_eps`: Meta-Llama-3-70B 500000 / 1e-5, Qwen3-30B-A3B
    # 1000000 / 1e-6, DeepSeek-V3 10000 / 1e-6, Mixtral-8x7B 1000000 / 1e-5; GPT-3 has learned positions
    expected = {
        "llama3-70b": (500000.0, 1e-5),
        "qwen3-30b-a3b": (1e6, 1e-6),
        "deepseek-v3": (10000.0, 1e-6),
        "mixtral-8x7b": (1e6, 1e-5),
        "gpt3-175b": (None, 1e-5),
    }
    for name, (theta, eps) in expected.items():
        m = get_preset(name)
        assert (m.rope_theta, m.norm_epsilon) == (theta, eps), name


def test_hf_config_reads_rope_theta_and_rms_norm_eps() -> None:
    from autopar.errors import InputError
    from autopar.spec.hf_config import model_from_hf_config

    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "vocab_size": 1000,
        "max_position_embeddings": 256,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    }
    m = model_from_hf_config(cfg, "x")
    assert (m.rope_theta, m.norm_epsilon) == (500000.0, 1e-5)
    with pytest.raises(InputError, match="rope_theta"):
        model_from_hf_config(cfg | {"rope_theta": -1}, "x")


# ---- Megatron-LM -----------------------------------------------------------------------------------

MEGATRON_CASES = [c for c in CASES if "megatron" not in c.refuse]


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=[c.id for c in MEGATRON_CASES])
def test_megatron_model_facts_reach_megatron_core(case) -> None:
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    from autopar.cost.flops import padded_vocab

    spec, p = case.spec, case.plan
    ns = megatron_ns(render(case, "megatron"))
    assert ns.rotary_base == (None if spec.learned_position_embeddings else spec.rope_theta)
    assert ns.norm_epsilon == spec.norm_epsilon
    # the vocabulary Megatron-LM builds is the one the cost model priced
    assert megatron_padded_vocab(spec.vocab_size, ns.make_vocab_size_divisible_by, p.tp) == int(
        padded_vocab(spec, p.tp)
    )
    if ns.norm_epsilon is not None:  # Megatron-LM hands --norm-epsilon to layernorm_epsilon
        kw = dict(num_layers=2, hidden_size=64, num_attention_heads=4, layernorm_epsilon=ns.norm_epsilon)
        if ns.rotary_base is not None:  # MLA's config holds the base (GPTModel reads config.rotary_base)
            kw["rotary_base"] = ns.rotary_base
        cfg = MLATransformerConfig(**kw)
        assert cfg.layernorm_epsilon == spec.norm_epsilon


def test_megatron_fsdp_plans_follow_megatron_fsdp_requirements() -> None:
    fsdp = [c for c in MEGATRON_CASES if c.plan.zero_stage >= 2]
    other = [c for c in MEGATRON_CASES if c.plan.zero_stage < 2]
    assert fsdp and other
    for case in fsdp:
        b = render(case, "megatron")
        ns = megatron_ns(b)
        assert ns.use_megatron_fsdp and ns.ckpt_format == "fsdp_dtensor", case.id
        assert ns.gradient_accumulation_fusion is False, case.id
        for script in ("launch_torchrun.sh", "launch_slurm.sbatch"):
            text = b.text(script)
            assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in text and "CUDA_DEVICE_MAX_CONNECTIONS=" not in text
    for case in other:
        ns = megatron_ns(render(case, "megatron"))
        assert ns.ckpt_format is None and ns.gradient_accumulation_fusion is True, case.id


def test_connections_follow_megatron_bridge_rule() -> None:
    """run_plugins.py: Hopper with TP/CP talking and no EP overlap -> 1; DeepEP -> 32; else CUDA's 8 (unset)."""
    by_id = {c.id: c for c in MEGATRON_CASES}
    text = render(by_id["tp-pp-1f1b"], "megatron").text("launch_torchrun.sh")  # tp 8, ZeRO-1, H100
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" in text
    assert "export NVTE_FWD_LAYERNORM_SM_MARGIN=16" in text and "export TORCH_NCCL_HIGH_PRIORITY=1" in text


def _young_daly_steps(params: float, gpus: int, step_s: float) -> int:
    """By hand from autopar/spec/reliability.py's defaults (Llama 3 paper: 419 interruptions in 54
    days on 16,384 GPUs; 2 TB/s of checkpoint bandwidth over 16,384 GPUs): a mixed-precision checkpoint
    is 14 bytes a parameter (bf16 weight, fp32 master, Adam m and v), T = sqrt(2 delta M)."""
    write_s = params * 14 / (2000e9 / 16384 * gpus)
    mtbf_s = 3600 / (419 / (54 * 24 * 16384) * gpus)
    return round(math.sqrt(2 * write_s * mtbf_s) / step_s)


def test_acceptance_70b_256_rank1_plan_carries_rotary_base_and_save_interval() -> None:
    """The #1 plan of `autopar search --model 70b --gpus 256` (tp4.cp2.pp2.dp16, ZeRO-1, 1F1B)."""
    m = get_preset("70b")
    plan = resolve_plan(m, 256, 8192, tp=4, cp=2, pp=2, dp=16, zero=1, sp=True, mbs=1, gbs=512, trainer="megatron")
    b = get_exporter("megatron").render(plan, m, CLUSTER)
    ns = megatron_ns(b)
    assert ns.rotary_base == 500000 and ns.norm_epsilon == 1e-5 and ns.make_vocab_size_divisible_by == 128
    step = b.meta["estimate"].step_time_s
    assert ns.save_interval == _young_daly_steps(m.params_total, 256, step)
    # the step is about 15 s, the interval about 1.9 hours: several hundred steps
    assert 300 < ns.save_interval < 600


def test_acceptance_deepseek_v3_1024_rank1_plan_carries_rotary_base_and_save_interval() -> None:
    """The #1 plan's layout of `autopar search --model deepseek-v3 --gpus 1024` (pp8 vpp4 ep16, full
    recompute, ZeRO-1; here with autopar's default stage split rather than the search's uneven one)."""
    m = get_preset("deepseek-v3")
    plan = resolve_plan(
        m, 1024, 4096, pp=8, vpp=4, dp=128, ep=16, zero=1, mbs=1, gbs=1024, recompute="full", trainer="megatron"
    )
    b = get_exporter("megatron").render(plan, m, CLUSTER)
    ns = megatron_ns(b)
    assert ns.rotary_base == 10000 and ns.norm_epsilon == 1e-6
    assert ns.save_interval == _young_daly_steps(m.params_total, 1024, b.meta["estimate"].step_time_s)


# ---- Megatron-Bridge ---------------------------------------------------------------------------------

BRIDGE_CASES = [c for c in CASES if "bridge" not in c.refuse]


@pytest.mark.parametrize("case", BRIDGE_CASES, ids=[c.id for c in BRIDGE_CASES])
def test_bridge_model_facts_and_checkpoints(case) -> None:
    import ast

    from autopar.cost.flops import padded_vocab

    spec, p = case.spec, case.plan
    ov = parse_bridge_overrides(render(case, "bridge").text("bridge_overrides.txt"))
    assert ov.get("model.rotary_base") == (None if spec.learned_position_embeddings else spec.rope_theta)
    assert ov.get("model.layernorm_epsilon") == spec.norm_epsilon
    assert megatron_padded_vocab(spec.vocab_size, ov["model.make_vocab_size_divisible_by"], p.tp) == int(
        padded_vocab(spec, p.tp)
    )
    assert (ov.get("checkpoint.ckpt_format") == "fsdp_dtensor") == (p.zero_stage >= 2)
    assert isinstance(ov["checkpoint.save_interval"], int) and ov["checkpoint.save_interval"] >= 1
    # the paths exist in Megatron-Bridge 0.3.1: GPTModelProvider and CheckpointConfig fields
    src = (REFS / "megatron/bridge/models/gpt_provider.py").read_text()
    provider = {
        n.target.id
        for c in ast.walk(ast.parse(src))
        if isinstance(c, ast.ClassDef) and c.name == "GPTModelProvider"
        for n in c.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    assert {"rotary_base", "make_vocab_size_divisible_by"} <= provider
    config = (REFS / "megatron/bridge/training/config.py").read_text()
    ckpt = config.split("class CheckpointConfig")[1].split("\nclass ")[0]
    assert "save_interval: Optional[int]" in ckpt and '"fsdp_dtensor"' in ckpt


# ---- DeepSpeed -------------------------------------------------------------------------------------

DS_CASES = [c for c in CASES if "deepspeed" not in c.refuse]


@pytest.mark.parametrize("case", DS_CASES, ids=[c.id for c in DS_CASES])
def test_deepspeed_model_facts_flash_attention_and_checkpoints(case) -> None:
    spec, p = case.spec, case.plan
    argv = read_bash_array(render(case, "deepspeed").text("megatron_deepspeed_args.sh"), "AUTOPAR_ARGS")

    def value(flag):
        return argv[argv.index(flag) + 1] if flag in argv else None

    theta = value("--rope-theta")
    assert (float(theta) if theta else None) == (None if spec.learned_position_embeddings else spec.rope_theta)
    assert float(value("--layernorm-epsilon")) == spec.norm_epsilon
    assert value("--make-vocab-size-divisible-by") == "128"
    assert ("--use-flash-attn-v2" in argv) == (p.dtype != "fp32")
    assert int(value("--save-interval")) >= 1


def test_non_integer_rope_base_is_refused_for_megatron() -> None:
    from autopar.export import ExportRefused

    case = next(c for c in MEGATRON_CASES if c.id == "tp-pp-1f1b")
    spec = dataclasses.replace(case.spec, rope_theta=12345.5)
    with pytest.raises(ExportRefused, match="rotary-base"):
        get_exporter("megatron").render(case.plan, spec, CLUSTER, case.options({}))
