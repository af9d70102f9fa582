"""Calibration without launches: the local profile, the probe -> profile step, the bounded fit
recovering known constants, plan keys and the diverse seeding order."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import yaml

from autopar.calibration.calibrate import calibrate, predict, profile_dict, profile_from_probe
from autopar.spec.hardware import default_cluster, load_cluster_file
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset

TINY = get_preset("tiny")
PLANS = [
    ParallelPlan(
        tp=t,
        pp=p,
        dp=2 // (t * p),
        vpp=v,
        pp_schedule=s,
        micro_batch_size=mb,
        global_batch_size=8,
        zero_stage=z,
        dtype="fp32",
        sequence_parallel=t > 1,
    )
    for t, p, v, s in (
        (1, 1, 1, "1f1b"),
        (2, 1, 1, "1f1b"),
        (1, 2, 1, "1f1b"),
        (1, 2, 1, "gpipe"),
        (1, 2, 2, "interleaved-1f1b"),
    )
    for mb in (1, 4)
    for z in (0, 1)
]


def test_local_profile_defaults_and_file(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOPAR_LOCAL_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # a machine never probed: no ~/.autopar/local.yaml
    c = default_cluster("local")
    assert c.gpu.key == "local" and c.constants.runtime_reserved_gib == 0.0
    probe = {
        "threads": 1,
        "memory_bytes_per_s": 5e9,
        "gemm": [{"m": s, "n": s, "k": s, "flops_per_s": 1e11 * s / (s + 8)} for s in (16, 64, 256, 1024)],
    }
    colls = [
        {
            "world_size": 2,
            "all_reduce": [
                {"bytes": 1024, "seconds": 1e-4, "busbw_gbps": 0.01},
                {"bytes": 1 << 22, "seconds": 4e-3, "busbw_gbps": 1.0},
            ],
        }
    ]
    prof = profile_from_probe(probe, colls, 2, 8 * 2**30)
    assert prof["gpu"]["bf16_tflops"] * 0.9 / 2 == pytest.approx(0.1, rel=0.05)  # fp32 peak recovered
    assert prof["behaviour"]["gemm_half_dim"] == pytest.approx(8, rel=0.1)
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(prof))
    monkeypatch.setenv("AUTOPAR_LOCAL_PROFILE", str(path))
    c = default_cluster("local", gpus_per_node=2)
    assert c.gpus_per_node == 2 and c.intra_node_gbps == 1.0 and c.intra_node_latency_us == pytest.approx(50)
    # a calibrated cluster round-trips through profile_dict
    path.write_text(yaml.safe_dump(profile_dict(c)))
    assert load_cluster_file(path).constants == c.constants


@pytest.mark.slow
def test_fit_recovers_known_constants():
    """Measurements made by the cost model itself with other constants: the fit must rank them right
    and get within a few percent."""
    base = default_cluster("local")
    truth = replace(
        base,
        constants=replace(
            base.constants, gemm_efficiency=0.3, layer_overhead_us=3000.0, allocator_overhead_fraction=0.2
        ),
    )
    meas_t, meas_m = predict(PLANS, TINY, truth, 2, 128)
    cal = calibrate(PLANS, meas_t, meas_m, TINY, base, 2, 128)
    assert cal.spearman_after >= 0.95
    assert np.max(np.abs(cal.time_fit.residuals)) < 0.05
    assert np.max(np.abs(cal.memory_fit.residuals)) < 0.02


def test_plan_key_and_diverse_order():
    from autopar.measured.order import diverse
    from autopar.measured.trials import plan_key

    keys = {plan_key(p.to_dict()): {"plan": p.to_dict()} for p in PLANS}
    assert len(keys) == len(PLANS)  # distinct plans, distinct keys
    order = diverse(list(keys), keys)
    first = {
        (keys[k]["plan"]["tp"], keys[k]["plan"]["pp"], keys[k]["plan"]["vpp"], keys[k]["plan"]["pp_schedule"])
        for k in order[:5]
    }
    assert len(first) == 5  # the first five span the five layouts


def test_the_measured_stage_runs_first_what_the_model_cannot_separate():
    """The leader first; then the plans whose step-time interval overlaps the leader's, the
    extrapolated before the calibrated; the plans the leader's interval excludes last."""
    from autopar.measured.order import unresolved_first

    def cand(t, lo, hi, support):
        return {"predicted": {"step_time_s": t, "step_time_s_interval": [lo, hi], "support": support}}

    cands = {
        "lead": cand(10.0, 9.0, 11.0, "calibrated"),
        "close-calibrated": cand(10.2, 9.2, 11.4, "calibrated"),
        "close-extrapolated": cand(10.5, 9.5, 12.0, "extrapolated"),
        "far-extrapolated": cand(13.0, 11.5, 15.0, "extrapolated"),
        "far": cand(12.5, 11.2, 13.5, "calibrated"),
        "close-extrapolated-2": cand(10.9, 10.8, 13.0, "extrapolated"),
    }
    ranking = list(cands)
    assert unresolved_first(ranking, cands) == [
        "lead",
        "close-extrapolated",
        "close-extrapolated-2",
        "close-calibrated",
        "far-extrapolated",
        "far",
    ]


def test_with_their_plans_the_margin_decides_what_is_unresolved():
    """Candidates with their plans: the paired margin (autopar.search.margins) decides, not the
    intervals. A margin model of +-ln(1.05) at 0 knobs apart and +-ln(1.05) * sqrt(2) at one knob
    (base = per_knob = ln(1.05), scale 1): 4 % slower at 0 knobs is unresolved, 6 % is separated,
    6 % one knob apart (7.1 %) is unresolved again; the overlapping intervals would call all three
    unresolved."""
    from autopar.calibration.margin import PairedMargin
    from autopar.measured.order import unresolved_first

    model = PairedMargin(base=math.log(1.05), per_knob=math.log(1.05), scale=1.0, pairs=100)
    plan = {"trainer": "megatron", "tp": 4, "pp": 4, "vpp": 1, "cp": 1, "ep": 1, "dp": 16, "micro_batch_size": 1}
    plan |= {"recompute": "none", "recompute_modules": None, "recompute_layers": None, "zero_stage": 1}

    def cand(t, **knobs):
        p = {"step_time_s": t, "step_time_s_interval": [0.8 * t, 1.2 * t], "support": "calibrated"}
        return {"plan": plan | knobs, "predicted": p}

    cands = {"lead": cand(10.0), "six-0": cand(10.6), "four-0": cand(10.4), "six-1": cand(10.6, tp=8)}
    assert unresolved_first(list(cands), cands, model) == ["lead", "four-0", "six-1", "six-0"]
