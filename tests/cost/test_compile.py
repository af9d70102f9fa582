"""torch.compile as a plan knob (--compile): Inductor fuses the elementwise ops, so a layer keeps
and moves fewer tensors. Every figure is a hand count of the tensors torchtitan's Llama keeps, eager
(torchtitan models/norms.py RMSNorm: the fp32 copy the square saves, the normalised output and the
fp32 1/rms; SwiGLU's w1 x, w3 x, silu and product; the attention output and its contiguous copy)
and compiled (the norm input, the two projections, one attention output), for Llama 3 8B
(h 4096, ffn 14336, 32 query heads and 8 KV heads of 128, 32 layers) at seq 8192 on one GPU of
TP 1, bf16 (2 bytes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar.calibration.estimate import estimate
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import bundled_runs
from autopar.cost.compute import raw_compute
from autopar.cost.kernels import hbm_rate
from autopar.cost.price import prepare
from autopar.cost.profiles import profiles
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.table import PlanTable

MODEL = get_preset("llama3-8b")
SEQ, LAYERS, H, F, HEADS = 8192, 32, 4096, 14336, 32
# per token of one layer, bytes (autopar.cost.stack_activations terms, counted by hand)
EAGER_NORMS = 2 * (4 * H + 2 * H + 4)  # two RMSNorms: fp32 copy 4h, bf16 output 2h, fp32 1/rms
FUSED_NORMS = 2 * (2 * H)  # compiled: each norm's input
LINEAR_INPUTS = 2 * (2 * H)  # the QKV and MLP inputs (DTensor saves the gathered copy; tp 1)
QKV = 2 * (4096 + 4 * (1024 + 1024))  # Q, and K, V repeated to the 32 query heads (repeat_kv)
LSE = 4 * HEADS  # SDPA's fp32 log-sum-exp per head
EAGER_LAYER = EAGER_NORMS + LINEAR_INPUTS + QKV + 2 * (2 * 4096) + LSE + 4 * (2 * F)
FUSED_LAYER = FUSED_NORMS + LINEAR_INPUTS + QKV + 1 * (2 * 4096) + LSE + 2 * (2 * F)
# the last stage's final norm (eager 4h + 2h + 4, compiled 2h)
HEAD_NORM_SAVED = (4 * H + 2 * H + 4) - 2 * H
# Korthikanti et al. 2022 Table 2 (16-bit, flash attention, no dropout), generalised to GQA and
# SwiGLU: norm inputs 4h, QKV and MLP inputs 4h, Q/K/V 2(4096 + 1024 + 1024), attention output
# 2 x 4096, fc1 output 2 x 2F and fc2 input 2F: the bytes the elementwise term is priced from
KORTHIKANTI_LAYER = 4 * H + 4 * H + 2 * (4096 + 1024 + 1024) + 2 * 4096 + 6 * F


@pytest.fixture(scope="module")
def cluster():
    return default_cluster("h100-sxm")


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=8, zero_stage=3, micro_batch_size=1, global_batch_size=8, trainer="torchtitan")
    return ParallelPlan(**(base | kw))


def test_hand_counts() -> None:
    assert EAGER_LAYER == 221_320 and FUSED_LAYER == 123_008 and KORTHIKANTI_LAYER == 139_264


def test_compiled_activations_drop_the_eager_copies(cluster) -> None:
    """One microbatch in flight on the single stage: 32 layers and the final norm each keep
    EAGER - FUSED fewer bytes per token; weights, gradients and optimizer do not move."""
    eager = estimate(_plan(), MODEL, cluster, num_gpus=8, seq_len=SEQ)
    fused = estimate(_plan(compile=True), MODEL, cluster, num_gpus=8, seq_len=SEQ)
    saved = SEQ * (LAYERS * (EAGER_LAYER - FUSED_LAYER) + HEAD_NORM_SAVED)
    assert eager.memory_bytes["activations"] - fused.memory_bytes["activations"] == pytest.approx(saved, rel=1e-12)
    for term in ("weights", "gradients", "optimizer"):
        assert fused.memory_bytes[term] == eager.memory_bytes[term]


def _raw(plan: ParallelPlan, cluster):
    p = prepare(PlanTable.from_plans([plan]), MODEL, cluster, num_gpus=8, seq_len=SEQ, every_rank=True)
    return raw_compute(p.x, MODEL, cluster, p.layer_act.rank_layers)


def test_elementwise_seconds_follow_the_materialised_tensors(cluster) -> None:
    """Eager: Korthikanti's bytes of the 32 layers over the achieved HBM bandwidth; compiled: the
    same times the tensors a compiled layer materialises over an eager one's (123,008 / 221,320)."""
    tt = replace(cluster, training_stack=profiles()["torchtitan"].memory_stack)
    eager = _raw(_plan(), tt).elementwise
    fused = _raw(_plan(compile=True), tt).elementwise
    by_hand = LAYERS * SEQ * KORTHIKANTI_LAYER / hbm_rate(tt)
    assert float(np.max(eager)) == pytest.approx(by_hand, rel=1e-12)
    assert float(np.max(fused)) == pytest.approx(by_hand * FUSED_LAYER / EAGER_LAYER, rel=1e-12)


def test_the_step_saves_the_fitted_elementwise_time(cluster) -> None:
    """One microbatch a step (gbs = dp): the compute time drops by the raw seconds saved times the
    torchtitan profile's elementwise traffic factor; nothing else in the step moves."""
    eager = estimate(_plan(), MODEL, cluster, num_gpus=8, seq_len=SEQ)
    fused = estimate(_plan(compile=True), MODEL, cluster, num_gpus=8, seq_len=SEQ)
    factor = profiles()["torchtitan"].constants.elementwise_traffic_factor
    tt = replace(cluster, training_stack=profiles()["torchtitan"].memory_stack)
    raw_saved = LAYERS * SEQ * KORTHIKANTI_LAYER / hbm_rate(tt) * (1 - FUSED_LAYER / EAGER_LAYER)
    assert eager.time_s["compute"] - fused.time_s["compute"] == pytest.approx(raw_saved * factor, rel=1e-9)
    assert fused.time_s["dp"] == pytest.approx(eager.time_s["dp"], rel=1e-12)


def test_only_torchtitan_compiles(cluster) -> None:
    for trainer in ("megatron", "nemo", "bridge", "deepspeed"):
        problems = " ".join(_plan(compile=True, trainer=trainer, zero_stage=1).problems(MODEL, 8, cluster, SEQ))
        assert "torch.compile of the model" in problems, trainer
    assert not _plan(compile=True).problems(MODEL, 8, cluster, SEQ)


def test_async_tp_needs_compile(cluster) -> None:
    """torchtitan 0.3 CompileConfig.__post_init__: 'Async TP requires 'model' in
    --compile.components and --compile.enable'."""
    plan = _plan(tp=2, dp=4, global_batch_size=4, tp_comm_overlap=True)
    assert "without torch.compile" in " ".join(plan.problems(MODEL, 8, cluster, SEQ))
    assert not plan.with_(compile=True).problems(MODEL, 8, cluster, SEQ)


def test_calibration_rows_are_priced_compiled_as_published() -> None:
    """torchtitan's 2024 405B rows (config compile=true) and fms-fsdp's (compile Y) ran compiled;
    the 2024 8B/70B and Llama 2 rows (compile=false) eager."""
    rows = [r for r in bundled_runs() if 229 <= int(r["row_id"]) <= 247]
    cases, _ = build_cases(rows)
    state = {int(c.row_id): c.plan.compile for c in cases}
    assert {r for r, on in state.items() if on} == set(range(229, 232)) | set(range(240, 248))
    assert not any(state[r] for r in range(232, 240))
