"""The host's kernel issue as a bound on a microbatch (autopar.cost.compute: a layer pass cannot run
faster than the host issues its kernels), derived here by hand.

Once the host is the bound, a step's compute is the host's issue time alone: microbatches x layer
passes x kernels per pass x `host_launch_us`. So between two host-bound values of the constant the
compute moves by exactly the kernel count times their difference, and below the GPU's own time the
constant changes nothing (the host runs ahead of the GPU). Kernel counts per pass (forward +
backward): 80 per layer, 160 more per MoE layer, 9 per local expert (the DeepSeek-V3 training trace
in deepseek-ai/profile-data: 963 kernels over 4 forward and 4 backward MoE layers, a third of them a
dense layer's; Transformer Engine's GroupedLinear: 3 forward and 6 backward GEMMs per expert, issued
from its C++ loop at `expert_host_launch_us` each)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.calibration.estimate import estimate
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import resolve_model

H100 = default_cluster("h100-sxm")
MICROBATCHES = 4


def _compute_s(model: str, host_us: float, **plan) -> float:
    cluster = H100.with_constants(replace(H100.constants, host_launch_us=host_us))
    dp = plan.get("dp", 1)
    p = ParallelPlan(**(dict(micro_batch_size=1, global_batch_size=MICROBATCHES * dp) | plan))
    return estimate(p, resolve_model(model), cluster, num_gpus=p.num_gpus, seq_len=256).time_s["compute"]


def test_a_host_bound_dense_step_costs_its_kernels() -> None:
    # Llama 3 8B, 256 tokens a microbatch: 32 layers x 80 kernels x 4 microbatches
    kernels = MICROBATCHES * 32 * 80
    slope = (_compute_s("llama3-8b", 200.0) - _compute_s("llama3-8b", 100.0)) / 100e-6
    assert slope == pytest.approx(kernels, rel=1e-9)


def test_a_host_bound_moe_step_counts_its_router_and_experts() -> None:
    # Mixtral 8x7B on EP 8: 32 MoE layers x (80 + 160) kernels x 4 microbatches through the
    # framework's dispatch; its 9 x 1 local expert's GEMMs come from Transformer Engine's C++ loop
    # (expert_host_launch_us, not this constant)
    kernels = MICROBATCHES * 32 * (80 + 160)
    hi = _compute_s("mixtral-8x7b", 400.0, dp=8, ep=8)
    lo = _compute_s("mixtral-8x7b", 300.0, dp=8, ep=8)
    assert (hi - lo) / 100e-6 == pytest.approx(kernels, rel=1e-9)


def test_a_host_faster_than_the_gpu_costs_nothing() -> None:
    # 70B layers at tp 8: milliseconds of GPU work per layer pass against ~0.1 ms of issue
    assert _compute_s("70b", 1.0, tp=8) == _compute_s("70b", 0.0, tp=8)
