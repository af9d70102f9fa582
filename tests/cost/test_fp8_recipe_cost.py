"""What an FP8 recipe costs (autopar.spec.fp8_recipes, priced in autopar.cost.compute), derived here
by hand: the quantizing kernels' HBM bytes per FP8 GEMM input element, and the weight-gradient GEMMs
that torchao's rowwise_with_gw_hp runs in BF16.

Llama 3 8B (h 4096, q 4096, k = v 1024, SwiGLU ffn 14336, 32 layers), tp 1, 4096 tokens per
microbatch, 8 microbatches per GPU, no recompute. The FP8 GEMM inputs per token and layer are the
forward activations (QKV: h, attention out-projection: q, fc1: h, fc2: ffn) and the backward's
output gradients (QKV: q + k + v, out-projection: h, fc1: 2 ffn, fc2: h)."""

from __future__ import annotations

import pytest

from autopar.calibration.estimate import estimate
from autopar.cost.kernels import hbm_rate
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import resolve_model

H100 = default_cluster("h100-sxm")
SEQ, LAYERS, MICROBATCHES = 4096, 32, 8
H, Q, KV, FFN = 4096, 4096, 1024, 14336
ELEMENTS_PER_TOKEN_LAYER = (H + Q + H + FFN) + (Q + 2 * KV + H + 2 * FFN + H)
#: quantized elements per GPU and step
ELEMENTS = ELEMENTS_PER_TOKEN_LAYER * SEQ * LAYERS * MICROBATCHES


def _compute_s(**plan) -> float:
    p = ParallelPlan(**(dict(dp=8, micro_batch_size=1, global_batch_size=64) | plan))
    return estimate(p, resolve_model("llama3-8b"), H100, num_gpus=8, seq_len=SEQ).time_s["compute"]


def test_the_element_count() -> None:
    assert ELEMENTS_PER_TOKEN_LAYER == 69632


def test_current_scaling_reads_every_input_once_more_for_its_amax() -> None:
    # tensorwise: 6 bytes per element against delayed scaling's 4 (the amax pass reads 2 more)
    extra = _compute_s(dtype="fp8", fp8_recipe="tensorwise") - _compute_s(dtype="fp8", fp8_recipe="delayed")
    assert extra == pytest.approx(2 * ELEMENTS / hbm_rate(H100), rel=1e-9)


def test_block_scaling_writes_a_scale_per_128_elements_of_each_copy() -> None:
    # blockwise: 4 + 2 x 4 / 128 bytes per element (an fp32 scale per 128-element block, two copies)
    extra = _compute_s(dtype="fp8", fp8_recipe="blockwise") - _compute_s(dtype="fp8", fp8_recipe="delayed")
    assert extra == pytest.approx(ELEMENTS / 16 / hbm_rate(H100), rel=1e-9)


def test_bf16_weight_gradients_move_a_third_of_the_gemms_to_the_bf16_rate() -> None:
    # Of a linear layer's three GEMM passes (forward, data gradient, weight gradient) the weight
    # gradient runs in BF16: its GEMM time is 2/3 of the rowwise plan's plus 1/3 of the BF16 plan's,
    # and everything but GEMMs and casts is the same in the three plans. Its casts are 3 bytes per
    # element (no transposed copy) against rowwise's 6, so
    #   gw_hp - (2/3 rowwise + 1/3 bf16) = (3 - 2/3 x 6) x elements / HBM rate = -elements / HBM rate
    titan = dict(trainer="torchtitan", zero_stage=3)
    bf16 = _compute_s(**titan)
    rowwise = _compute_s(dtype="fp8", **titan)  # torchtitan's default recipe
    gw_hp = _compute_s(dtype="fp8", fp8_recipe="rowwise_with_gw_hp", **titan)
    assert rowwise == pytest.approx(_compute_s(dtype="fp8", fp8_recipe="rowwise", **titan), rel=1e-12)
    assert gw_hp - (2 / 3 * rowwise + 1 / 3 * bf16) == pytest.approx(-ELEMENTS / hbm_rate(H100), rel=1e-9)
    assert rowwise < gw_hp < bf16


# ---- FP8 parameter gather (--fp8-param-gather) ------------------------------------------------------
# Llama 3 8B on 8 GPUs, tp 1, ZeRO-1: every GPU holds all 8,030,261,248 parameters, of which the
# untied embedding and LM head are 2 x 128,256 x 4,096 = 1,050,673,152 rows (no FP8 GEMM reads them)
PARAMS, VOCAB_ROWS = 8_030_261_248, 2 * 128_256 * 4096


def _fp8_estimate(gather: str):
    p = ParallelPlan(dp=8, zero_stage=1, micro_batch_size=1, global_batch_size=64, dtype="fp8", fp8_param_gather=gather)
    return estimate(p, resolve_model("llama3-8b"), H100, num_gpus=8, seq_len=SEQ)


def test_fp8_parameters_drop_transformer_engines_cached_fp8_copy() -> None:
    # without: BF16 weights (2 B) + TE's cached FP8 weight and its transpose (1 + 1 B) per linear
    # weight; with: the FP8 parameter and its transpose (1 + 1 B), nothing cached beside it
    off, on = _fp8_estimate("off"), _fp8_estimate("on")
    assert resolve_model("llama3-8b").params_total == PARAMS
    assert off.memory_bytes["weights"] - on.memory_bytes["weights"] == pytest.approx(2 * (PARAMS - VOCAB_ROWS))


def test_fp8_parameters_are_all_gathered_in_one_byte() -> None:
    # the distributed optimizer's one all-gather per step: each GPU hands in its 1/8 shard, 2 bytes per
    # parameter in BF16, 1 byte per linear weight in FP8 (the embedding and head rows stay BF16)
    off, on = _fp8_estimate("off"), _fp8_estimate("on")
    saved = off.comm_bytes_per_gpu["dp"] - on.comm_bytes_per_gpu["dp"]
    assert saved == pytest.approx((PARAMS - VOCAB_ROWS) * (2 - 1) / 8)
    assert on.time_s["dp"] < off.time_s["dp"]


def test_megatron_gathers_bf16_parameters_unless_told() -> None:
    assert _fp8_estimate("default").memory_bytes == _fp8_estimate("off").memory_bytes
