"""GPUs under a power limit (`--power-limit`, a cluster file's `power_limit_w`): the compute-bound
kernels at (limit / TDP)^0.5 of their rates, memory-bound ones unchanged, and the GPUs' energy priced
at the limit (hand derivations below)."""

from __future__ import annotations

import json
import math

import pytest

from autopar.calibration.estimate import estimate
from autopar.cost.kernels import gpu_behaviour, hbm_rate
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.resolve import resolve_cluster, resolve_plan


def test_the_limit_slows_compute_not_memory():
    full, capped = default_cluster("h100-sxm"), resolve_cluster("h100-sxm", power_limit_w=500)
    assert capped.power_limit_w == 500 and capped.operating_gpu.power_limit_w == 500
    assert gpu_behaviour(capped).gemm.bf16_flops == pytest.approx(
        gpu_behaviour(full).gemm.bf16_flops * math.sqrt(5 / 7)
    )
    assert hbm_rate(capped) == hbm_rate(full)
    # a compute-bound step slows by at most 1 / sqrt(5/7) = 1.183x, and does slow
    model = get_preset("llama3-8b")
    plan = resolve_plan(model, 8, 8192)
    fast = estimate(plan, model, full, num_gpus=8).step_time_s
    slow = estimate(plan, model, capped, num_gpus=8).step_time_s
    assert fast < slow <= fast / math.sqrt(5 / 7) * (1 + 1e-9)


def test_energy_per_step_and_per_run(cli_run):
    out = json.loads(
        cli_run("estimate", "--model", "8b", "--gpus", "8", "--power-limit", "600", "--tokens", "1B", "--json").stdout
    )
    assert out["power_w_per_gpu"] == 600
    assert out["energy_kwh_per_step"] == pytest.approx(out["step_time_s"] * 8 * 600 / 3.6e6)
    run = out["run"]
    assert run["energy_mwh"] == pytest.approx(run["gpu_hours"] * 600 / 1e6)
    # no limit given: the preset's TDP (H100 SXM, 700 W)
    plain = json.loads(cli_run("estimate", "--model", "8b", "--gpus", "8", "--json").stdout)
    assert plain["power_w_per_gpu"] == 700


def test_a_cluster_file_sets_the_limit(cli_run, tmp_path):
    path = tmp_path / "capped.yaml"
    path.write_text("gpu: h100-sxm\npower_limit_w: 450\n")
    out = json.loads(cli_run("estimate", "--model", "8b", "--gpus", "8", "--cluster", str(path), "--json").stdout)
    assert out["power_w_per_gpu"] == 450


@pytest.mark.parametrize("value", ["0", "-5", "1e9"])
def test_a_bad_limit_is_one_line(cli_run, one_line_error, value):
    r = cli_run("estimate", "--model", "8b", "--gpus", "8", "--power-limit", value)
    one_line_error(r, "--power-limit")


def test_a_search_keeps_its_limit_in_the_run_directory(cli_run, tmp_path):
    run = tmp_path / "run"
    r = cli_run("search", "--model", "8b", "--gpus", "8", "--top-k", "2", "--power-limit", "500", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    cluster = json.loads((run / "search.json").read_text())["question"]["cluster"]
    assert cluster["power_limit_w"] == 500
    assert cli_run("report", run).returncode == 0
    out = tmp_path / "export"
    assert cli_run("export", "--run", run, "--rank", "1", "--to", "megatron", "--out", out).returncode == 0
