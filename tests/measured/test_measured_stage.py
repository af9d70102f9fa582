"""The measured stage of `autopar search --trials` with a stand-in measurement (no launches): seeded
top-K first, failures recorded as data, budget honoured, winner = fastest that ran, trial files the
report reads."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from autopar.measured.order import diverse, unresolved_first
from autopar.measured.results import acceptance
from autopar.measured.trials import STUDY, candidates, run_measured
from autopar.report.run_data import load_trials
from autopar.search.run import SearchOptions, run_search
from autopar.search.scenarios import global_batch
from autopar.search.space import load_space
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question

pytestmark = [pytest.mark.slow]


def _result(tmp_path):
    space = load_space("local")
    q = Question(
        model=get_preset("tiny"),
        num_gpus=2,
        cluster=default_cluster("local"),
        seq_len=128,
        global_batch_size=global_batch(space, 128, None),
    )
    return run_search(q, SearchOptions(space=space, run_dir=tmp_path / "run"))


def test_seeded_failures_budget_winner(local_env, tmp_path):
    result = _result(tmp_path)
    cands = candidates(result)
    seeded = unresolved_first(diverse(list(cands), cands), cands)[:4]
    calls = []

    def measure(plan, predicted, on_step):
        i = len(calls)
        calls.append(plan)
        status = {1: "crash", 2: "oom"}.get(i, "ok")
        t = predicted["step_time_s"] * (1.1 + 0.01 * i)
        m = (
            {}
            if status != "ok"
            else {
                "step_time_s": t,
                "step_times_s": [t, t * 1.01, t],
                "peak_memory_bytes": predicted["peak_memory_bytes"] * 1.05,
            }
        )
        return {
            "name": "x",
            "plan": plan,
            "predicted": predicted,
            "status": status,
            "outcome": status,
            "reasons": [] if status == "ok" else [f"{status} for the test"],
            "measured": m,
        }

    stage = run_measured(result, measure, k=4, budget=6, log=lambda s: None)
    from autopar.measured.claims import measured
    from autopar.measured.trials import plan_key

    assert [plan_key(p) for p in calls[:4]] == seeded  # the analytic top-K, in seeding order, first
    assert len(calls) == 6 and len(stage.order) == 6  # budget: 2 more proposed by the sampler
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{result.run_dir / 'trials.db'}")
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert {t.user_attrs["failure"]["status"] for t in failed} == {"crash", "oom"}
    # measured trials carry their result; a sampled plan another trial holds is pruned as a duplicate
    done = [t for t in study.trials if measured(t) and t.state != TrialState.FAIL]
    assert len(done) == 4 and all("measured" in t.user_attrs["result"] for t in done)
    assert all(t.user_attrs.get("duplicate") or t.user_attrs.get("surplus") for t in study.trials if not measured(t))
    figs = acceptance(result, stage)
    assert figs["failed"] == 2 and figs["succeeded"] == 4
    ok = [d for d in stage.docs.values() if d["status"] == "ok"]
    assert figs["winner"]["key"] == min(ok, key=lambda d: d["measured"]["step_time_s"])["key"]
    assert "spearman_calibrated" in figs and abs(figs["memory_error_max_abs"] - 0.05 / 1.05) < 1e-6
    # intervals after calibration: the calibrated prediction x exp(+-h), h the ceil(5 x 0.8) = 4th
    # smallest of the 4 trials' |ln(measured / calibrated)| (split conformal), by hand
    import math

    res = figs["time_residuals_calibrated"]  # calibrated / measured - 1
    h = max(abs(math.log(1 + v)) for v in res.values())
    iv = figs["intervals"]
    assert iv["trials"] == 4 and iv["half_width_log"] == pytest.approx(h)
    for key, plan in iv["plans"].items():
        t = plan["calibrated_step_time_s"]
        assert plan["after"] == pytest.approx([t * math.exp(-h), t * math.exp(h)])
        lo, hi = plan["before"]
        assert plan["after"][1] - plan["after"][0] < hi - lo  # the trials narrowed what was measured
    trials, problems = load_trials(result.run_dir)
    assert len(trials) == 6 and not problems
    # a rerun keeps everything and measures nothing new
    again = run_measured(
        result, lambda p, q, s: (_ for _ in ()).throw(AssertionError("re-measured")), k=4, budget=6, log=lambda s: None
    )
    assert again.order == stage.order
    assert json.loads((result.run_dir / "trials" / f"{stage.order[0]}.json").read_text())["key"] == stage.order[0]


def test_calibrate_cli(local_env, tmp_path, cli):
    """`autopar calibrate RUN_DIR` on a run whose trials the cost model itself 'measured' with other
    constants: fitted values and residuals printed, a loadable profile, the untried re-ranked."""
    from dataclasses import replace

    from autopar.calibration.calibrate import predict
    from autopar.spec.hardware import load_cluster_file
    from autopar.spec.plan import ParallelPlan

    result = _result(tmp_path)
    c = result.question.cluster
    truth = c.with_constants(replace(c.constants, gemm_efficiency=0.25, layer_overhead_us=2000.0))

    def measure(plan, predicted, on_step):
        t, mem = predict([ParallelPlan.from_dict(plan)], result.question.model, truth, 2, 128)
        m = {"step_time_s": float(t[0]), "step_times_s": [float(t[0])] * 3, "peak_memory_bytes": float(mem[0])}
        return {"plan": plan, "predicted": predicted, "status": "ok", "outcome": "ok", "reasons": [], "measured": m}

    stage = run_measured(result, measure, k=5, log=lambda s: None)
    r = cli(["calibrate", str(result.run_dir), "--top", "3"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "gemm_efficiency" in r.stdout and "Residuals" in r.stdout and "Untried plans" in r.stdout
    fitted = load_cluster_file(result.run_dir / "calibrated.yaml")
    plans = [ParallelPlan.from_dict(stage.docs[k]["plan"]) for k in stage.order]
    want = predict(plans, result.question.model, truth, 2, 128)[0]
    got = predict(plans, result.question.model, fitted, 2, 128)[0]
    assert max(abs(got / want - 1)) < 0.05  # (efficiency and half-size trade off: compare predictions)
