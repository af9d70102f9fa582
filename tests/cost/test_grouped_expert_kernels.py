"""Expert GEMMs launched per expert or as one grouped kernel (the `per_expert_gemms` fact): Megatron's
Transformer Engine GroupedLinear runs one cuBLAS GEMM per local expert, torchtitan's torch._grouped_mm
(and NeMo AutoModel's grouped_gemm) one kernel per GEMM for every expert. The fixed time and the host
launches of the expert GEMMs follow: per local expert, or per MoE layer pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar.cost.compute import KERNELS_PER_PASS, RawCompute, assemble_compute
from autopar.cost.profiles import profiles
from autopar.spec.constants import CostConstants


def _raw(moe_layer_passes: float, experts_local: float) -> RawCompute:
    zero = np.zeros(1)
    return RawCompute(**{f: zero.copy() for f in RawCompute._fields})._replace(
        moe_layer_passes=np.array([moe_layer_passes]), expert_passes=np.array([moe_layer_passes * experts_local])
    )


@pytest.mark.parametrize("per_expert", [1.0, 0.0])
def test_expert_launches_follow_the_trainers_kernels(per_expert):
    # 24 MoE layer passes of 16 local experts, no dense layer: by hand, per expert 24 x 16 sets of
    # the 9 expert GEMMs, grouped 24 sets; each set costs expert_launch_us on the GPU and 9 launches
    # on the host, the MoE layer pass its own fixed time and 160 launches either way. Launched
    # expert by expert, from Transformer Engine's C++ loop, a launch costs the host
    # expert_host_launch_us; a grouped kernel goes through the framework's dispatch (host_launch_us)
    k = replace(CostConstants(), per_expert_gemms=per_expert, expert_launch_us=50.0, moe_layer_overhead_us=300.0)
    k = replace(k, host_launch_us=8.0, expert_host_launch_us=3.0)
    terms = assemble_compute(_raw(24, 16), k)
    sets = 24 * 16 if per_expert else 24
    assert terms.launch[0] == pytest.approx((24 * 300.0 + sets * 50.0) * 1e-6)
    per_launch = 3.0 if per_expert else 8.0
    assert terms.host[0] == pytest.approx((24 * KERNELS_PER_PASS["moe_layer"] * 8.0 + sets * 9 * per_launch) * 1e-6)


def test_each_trainer_states_its_expert_kernels():
    # Megatron (TE GroupedLinear) and the built-in model (a loop over its local experts) launch per
    # expert; torchtitan (torch._grouped_mm) one grouped kernel
    shipped = profiles()
    assert shipped["megatron"].constants.per_expert_gemms == 1.0
    assert shipped["autopar"].constants.per_expert_gemms == 1.0
    assert shipped["torchtitan"].constants.per_expert_gemms == 0.0


@pytest.mark.parametrize(("quantize", "per_expert"), [(12.0, 1.0), (4.0, 1.0), (12.0, 0.0)])
def test_per_expert_fp8_quantizations_join_the_expert_launches(quantize, per_expert):
    # 24 MoE layer passes of 16 local experts whose FP8 inputs are quantized expert by expert:
    # current scaling 4 inputs x 3 kernels = 12 more kernels per expert beside its 9 GEMMs, MX or
    # block scaling 4 x 1. By hand, launched per expert: 24 x 16 x (9 + q) kernels, the GPU paying
    # expert_launch_us per 9 of them; a grouped kernel quantizes every expert at once (nothing added)
    k = replace(CostConstants(), per_expert_gemms=per_expert, expert_launch_us=45.0, moe_layer_overhead_us=0.0)
    k = replace(k, host_launch_us=5.0, expert_host_launch_us=2.0)
    raw = _raw(24, 16)._replace(expert_quantize=np.array([quantize]))
    terms = assemble_compute(raw, k)
    kernels = 24 * 16 * (9 + quantize) if per_expert else 24 * 9
    assert terms.launch[0] == pytest.approx(kernels / 9 * 45.0 * 1e-6)
    per_launch = 2.0 if per_expert else 5.0  # TE's C++ loop, or the framework's dispatch
    assert terms.host[0] == pytest.approx((24 * KERNELS_PER_PASS["moe_layer"] * 5.0 + kernels * per_launch) * 1e-6)


def test_the_recipes_quantize_experts_as_transformer_engine_does():
    # TE 2.9 csrc/extensions/cast.cpp multi_tensor_quantize_impl: one fused kernel over every split
    # for delayed scaling only; current scaling amax + scale + cast per split, MX and block scaling
    # one cast per split; four inputs per expert per MoE layer pass (fc1, fc2 inputs; their gradients)
    from autopar.spec.fp8_recipes import RECIPE_CODE, expert_quantize_kernels

    codes = np.array([0] + [RECIPE_CODE[n] for n in ("delayed", "tensorwise", "mxfp8", "blockwise")])
    assert expert_quantize_kernels(codes).tolist() == [0.0, 0.0, 12.0, 4.0, 4.0]
