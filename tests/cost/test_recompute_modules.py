"""Megatron-Core's selective recompute modules as a plan knob (--recompute selective
--recompute-modules ...): what each module drops from the stored activations and the forward FLOPs it
runs again, derived here by hand from Korthikanti et al. 2022 (arXiv:2205.05198) Table 2's tensor
count at 16-bit activations and from the module's GEMM shapes (2 FLOPs per weight per token), against
`autopar estimate`'s figures. The modules' meaning is Megatron-Core 0.16's
(megatron/core/transformer/transformer_config.py `recompute_modules`)."""

from __future__ import annotations

import pytest

from autopar.calibration.estimate import estimate
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan, PlanError
from autopar.spec.presets import resolve_model

H100 = default_cluster("h100-sxm")
SEQ = 4096


def _estimate(model_name: str, **plan):
    model = resolve_model(model_name)
    p = ParallelPlan(**(dict(micro_batch_size=1, recompute="selective") | plan))
    return estimate(p, model, H100, num_gpus=p.num_gpus, seq_len=SEQ)


def _activations(e) -> float:
    return e.memory_bytes["activations"]


def _recomputed_flops_per_step(e) -> float:
    """The hardware FLOPs beyond the model's, per step over every GPU: (HFU - MFU) x step x GPUs x
    peak (autopar.cost.columns: HFU counts the recomputed forwards, MFU does not)."""
    return (e.hfu - e.mfu) * e.step_time_s * e.plan.num_gpus * H100.gpu.bf16_tflops * 1e12


# ---- a dense model: layernorm and mlp ---------------------------------------------------------------


def test_dense_layernorm_drops_the_two_norm_outputs_and_adds_no_gemm() -> None:
    # Llama 3 8B (h 4096), tp 1, one microbatch of 4096 tokens in flight (pp 1): "layernorm"
    # discards the outputs of the input and pre-MLP norms, the QKV and fc1 inputs of Korthikanti's
    # count (2 x 2h bytes per token), and rebuilds them before the backward: elementwise work, no
    # GEMM, which reads each norm's input and writes its output once more (2 x 2 x h x 2 bytes per
    # token and layer) over the 8 microbatches of a step
    from autopar.cost.kernels import hbm_rate

    base = _estimate("llama3-8b", dp=8, global_batch_size=64)
    norm = _estimate("llama3-8b", dp=8, global_batch_size=64, recompute_modules="core_attn,layernorm")
    per_token_layer = 2 * (2 * 4096)
    assert _activations(base) - _activations(norm) == pytest.approx(per_token_layer * SEQ * 32, rel=1e-12)
    assert _recomputed_flops_per_step(norm) == pytest.approx(_recomputed_flops_per_step(base), rel=1e-9)
    rebuilt = (norm.time_s["compute"] - base.time_s["compute"]) * hbm_rate(H100)
    assert rebuilt == pytest.approx(8 * 32 * SEQ * (2 * 2 * 4096 * 2), rel=1e-9)


def test_dense_mlp_drops_its_hidden_tensors_and_runs_its_forward_again() -> None:
    # "mlp" checkpoints the dense MLP: it keeps its input (the pre-MLP norm output, still counted)
    # and drops SwiGLU's fc1 output (2F at 2 bytes) and the fc2 input (F at 2 bytes): 6F bytes per
    # token and layer; its forward, 3 GEMMs of h x F at 2 FLOPs per weight, runs once more
    base = _estimate("llama3-8b", dp=8, global_batch_size=64)
    mlp = _estimate("llama3-8b", dp=8, global_batch_size=64, recompute_modules="core_attn,mlp")
    h, f, layers, gpus, microbatches = 4096, 14336, 32, 8, 8
    assert _activations(base) - _activations(mlp) == pytest.approx(6 * f * SEQ * layers, rel=1e-12)
    extra = 2 * 3 * h * f * SEQ * layers * microbatches * gpus
    assert _recomputed_flops_per_step(mlp) - _recomputed_flops_per_step(base) == pytest.approx(extra, rel=1e-9)
    assert mlp.step_time_s > base.step_time_s
    assert mlp.mfu < base.mfu  # the same model FLOPs in a longer step


def test_without_core_attn_the_attention_core_is_kept_and_not_recomputed() -> None:
    # Megatron's list replaces its default ["core_attn"]: "layernorm" alone recomputes no attention.
    # With flash attention the core keeps no score matrix (Korthikanti's 5as/h is gone), so the
    # memory equals the default's minus the norm outputs; the time is no recompute's
    none = _estimate("llama3-8b", dp=8, global_batch_size=64, recompute="none")
    norm_only = _estimate("llama3-8b", dp=8, global_batch_size=64, recompute_modules="layernorm")
    assert _recomputed_flops_per_step(norm_only) == pytest.approx(_recomputed_flops_per_step(none), abs=1e3)
    assert _activations(none) - _activations(norm_only) == pytest.approx(2 * (2 * 4096) * SEQ * 32, rel=1e-12)


# ---- an MoE model: moe_act and moe -----------------------------------------------------------------------


def test_moe_act_drops_the_expert_activation_output() -> None:
    # Qwen3-30B-A3B (48 MoE layers, 128 experts of F_e 768, top-8, h 2048), tp 1, ep 8: "moe_act"
    # discards each routed copy's fc2 input (the SwiGLU output, F_e at 2 bytes) and rebuilds it from
    # the kept fc1 output before the backward: elementwise, no GEMM
    kw = dict(dp=16, ep=8, global_batch_size=64)
    base = _estimate("qwen3-30b-a3b", **kw)
    act = _estimate("qwen3-30b-a3b", **kw, recompute_modules="core_attn,moe_act")
    assert _activations(base) - _activations(act) == pytest.approx(8 * 768 * 2 * SEQ * 48, rel=1e-12)
    assert _recomputed_flops_per_step(act) == pytest.approx(_recomputed_flops_per_step(base), rel=1e-9)
    # rebuilding it reads the fc1 output (2 F_e) and writes F_e per routed copy, at 2 bytes, over the
    # 4 microbatches (balanced routing: the estimate's default)
    from autopar.cost.kernels import hbm_rate

    rebuilt = (act.time_s["compute"] - base.time_s["compute"]) * hbm_rate(H100)
    assert rebuilt == pytest.approx(4 * 48 * SEQ * 8 * (3 * 768) * 2, rel=1e-9)


def test_moe_keeps_only_the_layers_input_and_runs_the_experts_again() -> None:
    # "moe" checkpoints the whole MoE layer (moe/moe_layer.py: router, dispatch, experts, combine):
    # per token it drops the fp32 router logits (4 x 128 bytes) and per routed copy the expert input
    # (h at 2 bytes), the fc1 output (2 F_e) and fc2 input (F_e) at 2 bytes; the experts' forward
    # (3 GEMMs of h x F_e per routed copy) runs once more
    kw = dict(dp=16, ep=8, global_batch_size=64)
    base = _estimate("qwen3-30b-a3b", **kw)
    moe = _estimate("qwen3-30b-a3b", **kw, recompute_modules="core_attn,moe")
    h, fe, k, layers = 2048, 768, 8, 48
    per_token_layer = 4 * 128 + k * (2 * h + 2 * 2 * fe + 2 * fe)
    assert _activations(base) - _activations(moe) == pytest.approx(per_token_layer * SEQ * layers, rel=1e-12)
    microbatches, gpus = 64 // 16, 16
    extra = 2 * 3 * h * fe * k * SEQ * layers * microbatches * gpus
    assert _recomputed_flops_per_step(moe) - _recomputed_flops_per_step(base) == pytest.approx(extra, rel=1e-9)
    assert moe.time_s["ep"] > base.time_s["ep"]  # the dispatch and combine run again


# ---- an MLA model: mla_up_proj ---------------------------------------------------------------------------


def test_mla_up_proj_keeps_the_latents_instead_of_q_k_v() -> None:
    # DeepSeek-V3 (61 layers, 128 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128), tp 1:
    # "mla_up_proj" discards the up-projections' outputs Q (128 x 192), K (128 x 192) and V
    # (128 x 128) and keeps their inputs, the query and key/value latents and the RoPE key
    # (1536 + 512 + 64), all at 2 bytes; the up-projections (1536 x 128 x 192 and 512 x 128 x 256
    # weights) run their forward again in every layer
    kw = dict(dp=64, ep=64, global_batch_size=64)
    base = _estimate("deepseek-v3", **kw)
    up = _estimate("deepseek-v3", **kw, recompute_modules="core_attn,mla_up_proj")
    qkv = (128 * 192 + 128 * 192 + 128 * 128) * 2
    latents = (1536 + 512 + 64) * 2
    assert _activations(base) - _activations(up) == pytest.approx((qkv - latents) * SEQ * 61, rel=1e-12)
    up_weights = 1536 * 128 * 192 + 512 * 128 * (128 + 128)
    extra = 2 * up_weights * SEQ * 61 * 1 * 64  # one microbatch per GPU, 64 GPUs
    assert _recomputed_flops_per_step(up) - _recomputed_flops_per_step(base) == pytest.approx(extra, rel=1e-9)


# ---- the plan, its rules and the trainers ---------------------------------------------------------------


def test_the_default_list_is_plain_selective() -> None:
    # Megatron-Core's recompute_modules default is ["core_attn"]: one plan, one spelling
    plan = ParallelPlan(recompute="selective", recompute_modules="core_attn")
    assert plan.recompute_modules is None and plan == ParallelPlan(recompute="selective")
    assert plan.selective_modules == ("core_attn",)
    assert ParallelPlan(recompute="selective", recompute_modules="moe_act, layernorm").recompute_modules == (
        "layernorm",
        "moe_act",
    )


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(recompute="full", recompute_modules="mlp"), "need --recompute selective"),
        (dict(recompute_modules="mlp"), "need --recompute selective"),
        (dict(recompute="selective", recompute_modules="attn"), "unknown module 'attn'"),
        (dict(recompute="selective", recompute_modules=""), "use --recompute none"),
    ],
)
def test_malformed_module_lists_are_refused(kw, words) -> None:
    with pytest.raises(PlanError, match=words):
        ParallelPlan(**kw)


@pytest.mark.parametrize(
    "model,modules,words",
    [
        ("llama3-8b", "moe_act", "moe_act needs a mixture-of-experts model"),
        ("llama3-8b", "moe", "moe needs a mixture-of-experts model"),
        ("llama3-8b", "mla_up_proj", "mla_up_proj needs multi-latent attention"),
        ("qwen3-30b-a3b", "shared_experts", "shared_experts needs MoE layers with shared experts"),
        ("qwen3-30b-a3b", "mlp", "mlp needs dense (non-MoE) layers"),
    ],
)
def test_modules_the_model_lacks_are_rejected_with_the_reason(model, modules, words) -> None:
    m = resolve_model(model)
    plan = ParallelPlan(dp=8, recompute="selective", recompute_modules=modules, global_batch_size=8)
    problems = plan.problems(m, num_gpus=8)
    assert any(words in p and "drop it from --recompute-modules" in p for p in problems), problems


@pytest.mark.parametrize("trainer", ["torchtitan", "deepspeed", "autopar"])
def test_trainers_without_the_modules_refuse_them(trainer) -> None:
    m = resolve_model("llama3-8b")
    plan = ParallelPlan(
        dp=8, zero_stage=3, recompute="selective", recompute_modules="mlp", global_batch_size=8, trainer=trainer
    )
    problems = plan.problems(m, num_gpus=8)
    assert any("selective recompute of mlp" in p and "--recompute-modules" in p for p in problems), problems
    # plain selective (the attention core) is each one's own selective recompute
    assert all("recompute of" not in p for p in plan.with_(recompute_modules=None).problems(m, num_gpus=8))


def test_megatron_refuses_norm_and_act_recompute_under_fp8_delayed_scaling() -> None:
    # transformer_config.py: "Delayed scaling does not support moe_act and layernorm recompute for
    # fp8"; delayed scaling is their default recipe, and other recipes may recompute them
    m = resolve_model("llama3-8b")
    for trainer in ("megatron", "nemo", "bridge"):
        fp8 = ParallelPlan(dp=8, dtype="fp8", recompute="selective", recompute_modules="layernorm", trainer=trainer)
        assert any("under FP8 delayed scaling" in p for p in fp8.problems(m, num_gpus=8, cluster=H100))
        mlp = fp8.with_(recompute_modules=("mlp",))
        assert not any("recompute" in p for p in mlp.problems(m, num_gpus=8, cluster=H100))
        current = fp8.with_(fp8_recipe="tensorwise")
        assert not any("recompute" in p for p in current.problems(m, num_gpus=8, cluster=H100))


def test_a_changed_recompute_drops_the_modules_of_the_ranked_plan() -> None:
    # autopar export --run ... --recompute full: the modules followed the recompute they were for
    from autopar.spec.resolve import PlanRequest, rebase_plan

    m = resolve_model("llama3-8b")
    base = ParallelPlan(dp=8, recompute="selective", recompute_modules="layernorm", global_batch_size=8)
    assert rebase_plan(base, PlanRequest(recompute="full"), m, 8, SEQ).recompute_modules is None
    assert rebase_plan(base, PlanRequest(zero=0), m, 8, SEQ).recompute_modules == ("layernorm",)
