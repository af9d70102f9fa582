"""FSDP2's copies into and out of its collectives' buffers (autopar.cost.comm_terms.fsdp_copy_bytes),
derived here by hand from torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: every all-gather
output is copied out into the unit's parameters (split_with_sizes_copy) and every reduction's
unsharded gradients are copied into the reduce-scatter input (chunk_cat), a read and a write of the
whole unsharded buffer each. Megatron-Core gathers and reduces in place, so only the profiles with
the fact (torchtitan, the built-in model) pay them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.calibration.estimate import estimate
from autopar.cost.kernels import hbm_rate
from autopar.cost.profiles import priced_cluster
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import resolve_model

H100 = default_cluster("h100-sxm")
MICROBATCHES = 4


def _compute_s(copies: float, trainer: str = "torchtitan") -> float:
    cluster = priced_cluster(H100, trainer)
    cluster = cluster.with_constants(replace(cluster.constants, fsdp_copy_traffic=copies))
    plan = ParallelPlan(dp=8, zero_stage=3, micro_batch_size=1, global_batch_size=8 * MICROBATCHES, trainer=trainer)
    return estimate(plan, resolve_model("llama3-8b"), cluster, num_gpus=8, seq_len=4096).time_s["compute"]


def test_fsdp2_copies_every_gathered_and_reduced_buffer_once_each_way() -> None:
    # Llama 3 8B on 8 GPUs, ZeRO-3, no pipelining, 4 microbatches: each microbatch gathers every unit
    # twice (forward, and again in the backward after resharding) in bf16 (2 bytes) and reduce-
    # scatters its gradients once in fp32 (torchtitan's mixed_precision_reduce default, 4 bytes)
    params = resolve_model("llama3-8b").params_total
    assert params == 8_030_261_248
    gathered = 2 * MICROBATCHES * params * 2
    reduced = MICROBATCHES * params * 4
    hand = 2 * (gathered + reduced)  # a read and a write of each
    extra = (_compute_s(1.0) - _compute_s(0.0)) * hbm_rate(H100)
    assert extra == pytest.approx(hand, rel=1e-9)


def test_megatron_gathers_in_place() -> None:
    assert priced_cluster(H100, "megatron").constants.fsdp_copy_traffic == 0.0
    assert priced_cluster(H100, "torchtitan").constants.fsdp_copy_traffic == 1.0
