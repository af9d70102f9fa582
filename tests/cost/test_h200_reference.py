"""A single-GPU reference run on a real H200 (benchmarks/gpu_probe_check.sh, 2026-12-04, torch 2.11,
CUDA 13.0): `autopar probe --device cuda` measured the GPU (data/h200-probed.yaml, raw figures in
its comments) and benchmarks/gpu_check.py trained the built-in model, a 4-layer llama2-7b slice
(1.07B parameters), seq 4096, micro-batch 2, 4 micro-batches, bf16 autocast, AdamW, one GPU
(data/h200-gpu-check.json). The cost model, recomputed here on the probed cluster, must predict that
run's step time and peak memory within 10 %; and the probe's own figures must agree with the
published ones it replaces where both measure the same kernel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.cost.estimate import estimate
from autopar.spec.behaviour import behaviour_of
from autopar.spec.hardware import GIB, get_gpu, load_cluster_file
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def run():
    measured = json.loads((DATA / "h200-gpu-check.json").read_text())
    model = get_preset("llama2-7b").scaled(num_layers=4)
    plan = ParallelPlan(micro_batch_size=2, global_batch_size=8, dtype="bf16", zero_stage=0, trainer="autopar")
    cluster = load_cluster_file(DATA / "h200-probed.yaml")
    return measured, estimate(plan, model, cluster, num_gpus=1, seq_len=measured["seq_len"])


def test_the_slice_is_the_one_measured(run):
    measured, est = run
    assert est.params_total == measured["params"]
    assert est.num_microbatches == 4


def test_step_time_within_10_percent(run):
    measured, est = run
    error = est.step_time_s / measured["mean_step_time_s"] - 1
    assert abs(error) <= 0.10, f"predicted {est.step_time_s:.4f} s, measured {measured['mean_step_time_s']:.4f} s"


def test_peak_memory_within_10_percent(run):
    """Measured: torch.cuda.max_memory_allocated; predicted: the tensors plus the CUDA context and the
    allocator's allowance (the profile's runtime_reserved_gib, allocator_overhead_fraction)."""
    measured, est = run
    error = est.peak_memory_bytes / GIB / measured["peak_memory_gib"] - 1
    assert abs(error) <= 0.10, (
        f"predicted {est.peak_memory_bytes / GIB:.2f} GiB, measured {measured['peak_memory_gib']:.2f}"
    )


def test_probed_kernels_agree_with_the_published_stand_ins():
    """The H200 has no published attention or copy figure: the H100's stand in (the same GH100 die).
    The probe's cuDNN causal forward at 4096 (519.5 TFLOP/s) is within 1 % of the published H100 cuDNN
    figure (518, FA3 README table); its copy reaches 0.89 of the 4.8 TB/s datasheet, the published
    memory-bound fraction's neighbourhood (0.9, Dao-AILab/quack); its BF16 MAMF (the best of five large
    shapes: a lower bound of the MAMF finder's sweep) is within 10 % of the published 794.5."""
    m = load_cluster_file(DATA / "h200-probed.yaml").measured
    assert m.attention_seq is not None and m.attention_fwd_tflops is not None and m.hbm_gbps is not None
    fwd_4096 = dict(zip(m.attention_seq, m.attention_fwd_tflops))[4096.0]
    assert fwd_4096 == pytest.approx(518.0, rel=0.01)
    published = behaviour_of(get_gpu("h200"))
    assert m.hbm_gbps / get_gpu("h200").hbm_gbps == pytest.approx(published.hbm_fraction, abs=0.03)
    assert m.bf16_tflops == pytest.approx(published.gemm.bf16_flops / 1e12, rel=0.10)
