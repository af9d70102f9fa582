"""Time to train, GPU-hours, cost and goodput (autopar.cost.goodput), derived by hand."""

from __future__ import annotations

import math

import pytest

from autopar.cost.goodput import checkpoint_bytes, run_time, young_daly_interval
from autopar.spec.presets import get_preset
from autopar.spec.training_run import DEFAULT_INTERRUPTIONS_PER_GPU_HOUR, Reliability


def test_young_daly_interval_by_hand() -> None:
    # a 60 s checkpoint, one interruption a day: sqrt(2 x 60 x 86,400) = sqrt(10,368,000) s
    assert young_daly_interval(60.0, 86_400.0) == pytest.approx(3219.937887, rel=1e-9)


def test_goodput_worked_example() -> None:
    """1,000 GPUs, a 14 TB checkpoint (1e12 parameters x (2 + 12) bytes) written at 14 TB / 60 s, one
    interruption a day, a 600 s restart."""
    rel = Reliability(
        interruptions_per_gpu_hour=3600 / (86_400 * 1000),
        checkpoint_gbps_per_gpu=14e12 / 60 / 1000 / 1e9,
        restart_s=600.0,
    )
    r = run_time(1e12, 1e6, 1000, 1e12, fp32=False, rel=rel)
    assert float(r.checkpoint_bytes) == 14e12
    assert float(r.write_s) == pytest.approx(60.0, rel=1e-12)
    assert float(r.mtbf_s) == pytest.approx(86_400.0, rel=1e-12)
    t = math.sqrt(2 * 60 * 86_400)  # 3219.94 s between checkpoints
    period = t + 60  # 3279.94 s of wall time per checkpoint period
    checkpoints = 60 / period  # 1.829 % of the time writing
    rework = period / 2 / 86_400  # half a period redone per interruption: 1.898 %
    restarts = (600 + 60) / 86_400  # restart + read per interruption: 0.764 %
    good = (1 - checkpoints) * (1 - rework - restarts)  # 0.95557
    assert float(r.interval_s) == pytest.approx(t, rel=1e-12)
    assert float(r.goodput) == pytest.approx(good, rel=1e-12)
    assert float(r.goodput) == pytest.approx(0.955574, abs=1e-6)
    lost = float(r.lost_to_checkpoints + r.lost_to_rework + r.lost_to_restarts)
    assert lost + float(r.goodput) == pytest.approx(1.0, abs=1e-12)  # the terms account for every second
    assert float(r.wall_s) == pytest.approx(1e6 / good, rel=1e-12)


def test_llama3_scale_keeps_above_90_percent() -> None:
    """405B on 16,384 H100 with the defaults (the Llama 3 paper's interruption rate and storage):
    above the paper's "higher than 90 % effective training time", and not implausibly close to 1."""
    model = get_preset("llama3.1-405b")
    r = run_time(15e12, 3.0e6, 16_384, model.params_total)
    # by hand: 5.7 TB checkpoint at 2 TB/s = 2.8 s; MTBF 3,600 / (419 / (54 x 24 x 16,384) x 16,384) h
    # = 11,136 s; interval sqrt(2 x 2.8 x 11,136) = 250 s
    assert float(r.mtbf_s) == pytest.approx(54 * 24 * 3600 / 419, rel=1e-12)
    assert float(r.write_s) == pytest.approx(model.params_total * 14 / 2e12, rel=1e-12)
    assert 0.90 < float(r.goodput) < 0.96, float(r.goodput)
    assert DEFAULT_INTERRUPTIONS_PER_GPU_HOUR == pytest.approx(1.973e-5, rel=1e-3)


def test_hours_and_cost_arithmetic() -> None:
    """15T tokens at 1M tokens/s on 2,048 GPUs without interruptions: 1.5e7 s (173.6 days),
    2,048 x 1.5e7 / 3,600 = 8,533,333 GPU-hours, $21.3M at $2.50."""
    r = run_time(15e12, 1e6, 2048, 70e9, rel=Reliability(interruptions_per_gpu_hour=0.0), price_per_gpu_hour=2.5)
    assert float(r.goodput) == pytest.approx(1.0 - float(r.lost_to_checkpoints))  # checkpoints still cost
    assert float(r.lost_to_checkpoints) == 0.0  # no interruption: no checkpoint interval to pay for
    assert float(r.train_s) == 1.5e7 and float(r.days) == pytest.approx(1.5e7 / 86_400)
    assert float(r.gpu_hours) == pytest.approx(2048 * 1.5e7 / 3600)
    assert float(r.cost) == pytest.approx(2.5 * 2048 * 1.5e7 / 3600)


def test_fp32_checkpoints_hold_twelve_bytes_a_parameter() -> None:
    assert float(checkpoint_bytes(1e9, True)) == 12e9 and float(checkpoint_bytes(1e9, False)) == 14e9
