"""nanotron's ZeRO-1 slices every parameter over the data-parallel ranks and moves the slices with
host-launched copies (nanotron/optim/zero.py, nanotron/distributed.py): after the optimizer step
one copy per rank per parameter tensor, and per gradient bucket one flatten per rank. On 64 nodes
(dp 128) that is tens of thousands of launches a step, which is what made its 3.57B run on 512
GPUs (row 251) 2.4x slower than its compute and NCCL time. Counts derived by hand below."""

from __future__ import annotations

import csv
from importlib import resources
from types import SimpleNamespace

import numpy as np
import pytest

from autopar.calibration.case_batch import case_cluster, prime_inputs
from autopar.calibration.run_cases import build_cases
from autopar.cost.compute import RawCompute
from autopar.cost.profiles import profiles
from autopar.cost.step import zero1_copy_seconds


def _rows(*ids: str) -> list[dict]:
    data = resources.files("autopar.calibration").joinpath("data/calibration_runs_2.csv").read_text()
    return [r for r in csv.DictReader(data.splitlines()) if r["row_id"] in ids]


def _case(row_id: str):
    cases, skipped = build_cases(_rows(row_id))
    assert not skipped and len(cases) == 1
    prime_inputs(cases)
    return cases[0]


def test_nanotron_zero1_launch_counts_on_64_nodes() -> None:
    # row 251: 3.57B (28 layers, tied embeddings), tp4 dp128, ZeRO-1, one rank holds every layer.
    # Tensors per rank: 28 x 6 (qkv, o, gate-up, down, two norms) + embedding + final norm = 170.
    # Gathering: 128 ranks x (170 copies + 1 flatten + 1 PyTorch copy-out) = 22,016 launches.
    case = _case("251")
    assert case.plan.zero_stage == 1 and case.plan.dp == 128 and case.model.tied_embeddings
    inp = case.inputs
    assert float(inp.zero1_gather_launches[0, 0]) == 128 * (28 * 6 + 1 + 1 + 2)
    # Reducing: DDP's 25 MiB buckets of bf16 gradients (13,107,200 each) over the rank's
    # parameters, 2 launches per rank per bucket
    params = 3.57e9 / 4
    buckets = float(inp.zero1_reduce_launches[0, 0]) / (2 * 128)
    assert buckets == pytest.approx(np.ceil(params / 13_107_200), abs=2)


def test_zero0_and_flat_buffer_trainers_launch_none() -> None:
    # row 258 runs ZeRO-0: nanotron all-reduces coalesced buckets, one flatten per bucket
    inp = _case("258").inputs
    assert float(inp.zero1_gather_launches[0, 0]) == 0.0 and float(inp.zero1_reduce_launches[0, 0]) == 0.0
    # the profiles of trainers with flat buckets (Megatron's distributed optimizer, DeepSpeed, FSDP)
    for name in ("megatron", "torchtitan", "deepspeed"):
        assert profiles()[name].constants.zero1_rank_copies == 0.0
    assert profiles()["nanotron"].constants.zero1_rank_copies == 1.0
    assert case_cluster(_case("251")).constants.zero1_rank_copies == 1.0


def _raw(gemm, host_kernels_s):
    z = np.zeros((1, 1))
    # GEMM seconds, and layer passes whose kernels (80 a pass) take `host_kernels_s` at 10 us each
    return RawCompute(**{f: z.copy() for f in RawCompute._fields})._replace(
        gemm_bf16=np.array([[gemm]]), layer_passes=np.array([[host_kernels_s / 10e-6 / 80]])
    )


def test_gathering_is_exposed_and_the_hooks_only_beyond_the_backwards_slack() -> None:
    # 10,000 gathering copies and 30,000 hook launches at 10 us: 0.1 s and 0.3 s of host time.
    # The micro-batch: 0.6 s of GEMMs (backward 2/3: 0.4 s) launched in 0.12 s of host time
    # (2/3 in the backward: 0.08 s), so the backward leaves 0.32 s of slack: 0.3 s of hooks hide.
    k = SimpleNamespace(
        zero1_rank_copies=1.0,
        host_launch_us=10.0,
        gemm_efficiency=1.0,
        fp8_gemm_efficiency=1.0,
        expert_gemm_efficiency=1.0,
        attention_efficiency=1.0,
        elementwise_traffic_factor=1.0,
        layer_overhead_us=0.0,
        moe_layer_overhead_us=0.0,
        expert_launch_us=0.0,
        per_expert_gemms=1.0,
        expert_host_launch_us=3.0,
    )
    inp = SimpleNamespace(
        raw=_raw(0.6, 0.12),
        forward_share=np.array([[1 / 3]]),
        zero1_gather_launches=np.array([[10_000.0]]),
        zero1_reduce_launches=np.array([[30_000.0]]),
    )
    gather, reduce = zero1_copy_seconds(inp, k)
    assert float(gather[0, 0]) == pytest.approx(0.1, rel=1e-12)
    assert float(reduce[0, 0]) == pytest.approx(0.0, abs=1e-12)
    # 60,000 hook launches (0.6 s): 0.28 s beyond the slack
    inp.zero1_reduce_launches = np.array([[60_000.0]])
    assert float(zero1_copy_seconds(inp, k)[1][0, 0]) == pytest.approx(0.6 - 0.32, rel=1e-12)
    # a trainer with flat buffers: nothing
    k.zero1_rank_copies = 0.0
    assert float(zero1_copy_seconds(inp, k)[0][0, 0]) == 0.0
