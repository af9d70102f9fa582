"""What an FP8 recipe costs (autopar.spec.fp8_recipes, priced in autopar.cost.compute), derived here
by hand: the quantizing kernels' HBM bytes per FP8 GEMM input element, and the weight-gradient GEMMs
that torchao's rowwise_with_gw_hp runs in BF16.

Llama 3 8B (h 4096, q 4096, k = v 1024, SwiGLU ffn 14336, 32 layers), tp 1, 4096 tokens per
microbatch, 8 microbatches per GPU, no recompute. The FP8 GEMM inputs per token and layer are the
forward activations (QKV: h, attention out-projection: q, fc1: h, fc2: ffn) and the backward's
output gradients (QKV: q + k + v, out-projection: h, fc1: 2 ffn, fc2: h)."""

from __future__ import annotations

import pytest

from autopar.cost.estimate import estimate
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
