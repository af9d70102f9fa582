"""Time to train, GPU-hours, cost and goodput of whole runs (--tokens, --deadline,
--price-per-gpu-hour, --budget) on search, estimate and the what-if; figures checked by hand
against the run's own tokens/s (autopar.cost.goodput, whose formulas tests/cost/test_goodput.py
derives)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from autopar.search.training import choose
from autopar.spec.training_run import (
    DEFAULT_INTERRUPTIONS_PER_GPU_HOUR,
    TrainingRun,
    parse_budget,
    parse_duration,
    parse_prices,
    parse_tokens,
    training_run,
)

MODEL = ["--model", "llama3-8b", "--gpus", "16"]


def test_parsers_by_hand() -> None:
    assert parse_tokens("15T") == 15e12 and parse_tokens("300B") == 300e9 and parse_tokens("2.5e12") == 2.5e12
    assert parse_tokens("500m") == 500e6
    assert parse_duration("60d") == 60 * 86_400 and parse_duration("36h") == 36 * 3600
    assert parse_duration("8w") == 8 * 7 * 86_400 and parse_duration("90min") == 5400
    assert parse_prices("2.5") == (2.5, {})
    assert parse_prices("h100=2.5,b200=4") == (None, {"h100-sxm": 2.5, "b200": 4.0})
    assert parse_budget("$2.5M") == 2.5e6 and parse_budget("750000") == 750_000
    assert training_run(None) is None


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--tokens", "-3T"], ["--tokens", "-3T", "above 0"]),
        (["--tokens", "lots"], ["--tokens", "lots", "15T"]),
        (["--tokens", "1T", "--deadline", "60"], ["--deadline", "unit"]),
        (["--tokens", "1T", "--deadline", "-2d"], ["--deadline", "above 0"]),
        (["--price-per-gpu-hour", "2.5"], ["--price-per-gpu-hour", "needs --tokens"]),
        (["--deadline", "30d"], ["--deadline", "needs --tokens"]),
        (["--tokens", "1T", "--budget", "5M"], ["--budget", "--price-per-gpu-hour"]),
        (["--tokens", "1T", "--price-per-gpu-hour", "free"], ["--price-per-gpu-hour", "free"]),
        (["--tokens", "1T", "--price-per-gpu-hour", "b200=4"], ["no price for", "h100-sxm"]),
    ],
)
def test_bad_run_flags_one_line(cli_run, one_line_error, args, needles) -> None:
    for command in ("search", "estimate"):
        plan = ["--tp", "2"] if command == "estimate" else ["--run-dir", "/nonexistent/never-written"]
        one_line_error(cli_run(command, *MODEL, *plan, *args), needles)


def test_search_days_gpu_hours_and_cost_by_hand(cli_run, tmp_path) -> None:
    r = cli_run(
        "search",
        *MODEL,
        "--tokens",
        "1T",
        "--price-per-gpu-hour",
        "2.5",
        "--top-k",
        "3",
        "--run-dir",
        tmp_path / "run",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    top = json.loads((tmp_path / "run" / "top.json").read_text())["top"]
    assert len(top) == 3
    for row in top:
        run = row["run"]
        # 1e12 tokens at the plan's tokens/s, over the goodput; 16 GPUs; 2.5 per GPU-hour
        train_s = 1e12 / row["tokens_per_s"]
        assert run["train_days"] == pytest.approx(train_s / 86_400, rel=1e-12)
        assert run["days"] == pytest.approx(train_s / run["goodput"] / 86_400, rel=1e-12)
        assert run["gpu_hours"] == pytest.approx(run["days"] * 24 * 16, rel=1e-12)
        assert run["cost"] == pytest.approx(run["gpu_hours"] * 2.5, rel=1e-12)
        # one checkpoint: 8.03B parameters x (2 + 12) bytes
        assert run["checkpoint_gib"] == pytest.approx(8.03e9 * 14 / 2**30, rel=1e-2)
        lost = run["lost_to_checkpoints"] + run["lost_to_rework"] + run["lost_to_restarts"]
        assert run["goodput"] + lost == pytest.approx(1.0, abs=1e-12)
    # every plan of plans.parquet carries its days, goodput, GPU-hours and cost too
    plans = pd.read_parquet(tmp_path / "run" / "plans.parquet").set_index("plan_index")
    for row in top:
        for col in ("days", "goodput", "gpu_hours", "cost"):
            assert plans.loc[row["plan_index"], col] == pytest.approx(row["run"][col], rel=1e-12)
    valid = plans[plans["valid"]]
    assert valid["days"].notna().all()
    assert np.allclose(valid["cost"], valid["gpu_hours"] * 2.5, rtol=1e-12)
    assert out["answers"][0].startswith("Training 1T tokens with ")
    html = (tmp_path / "run" / "report.html").read_text()
    assert "Time and cost of the whole run" in html and "fig-run" in html
    assert "1T tokens, at 2.5 per GPU-hour" in html  # the question, as asked


def test_unmeetable_deadline_says_what_the_fastest_needs(cli_run, one_line_error, tmp_path) -> None:
    ok = cli_run("search", *MODEL, "--tokens", "1T", "--run-dir", tmp_path / "a", "--json")
    days = json.loads(ok.stdout)["scenarios"][0]["top"][0]["run"]["days"]
    short = max(1, math.floor(days / 2))
    # an answer, not bad input: one line on stdout, exit 1
    line = unmet_goal(
        cli_run("search", *MODEL, "--tokens", "1T", "--deadline", f"{short}d", "--run-dir", tmp_path / "b"),
        ["no plan meets", f"{days:.1f} days", "--gpus 16,32,64"],
    )
    assert f"the {short}-day deadline" in line
    late = cli_run(
        "search", *MODEL, "--tokens", "1T", "--deadline", f"{math.ceil(days) + 1}d", "--run-dir", tmp_path / "c"
    )
    assert late.returncode == 0 and "days to spare" in late.stdout
    unmet_goal(
        cli_run("estimate", *MODEL, "--tokens", "1T", "--deadline", "1d"), ["past the 1-day deadline", "autopar search"]
    )
    unmet_goal(
        cli_run("estimate", *MODEL, "--tokens", "1T", "--price-per-gpu-hour", "2", "--budget", "1"),
        ["over the budget of 1.00", "raise --budget"],
    )


def unmet_goal(r, needles) -> str:
    """The contract of a deadline or budget no plan meets: exit 1, one line `autopar: ...` on
    stdout holding every needle, nothing on stderr. Returns the line."""
    assert r.returncode == 1, (r.returncode, r.stderr, r.stdout[-500:])
    assert r.stderr == "" and len(r.stdout.splitlines()) == 1 and r.stdout.startswith("autopar: "), r
    for word in needles:
        assert word in r.stdout, (word, r.stdout)
    return r.stdout.strip()


@pytest.mark.slow
def test_whatif_cheapest_by_deadline_and_fastest_within_budget(cli_run, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a what-if writes reports/<scenario>/ here
    args = [
        "search",
        "--model",
        "llama3-8b",
        "--gpus",
        "16,32,64",
        "--tokens",
        "1T",
        "--price-per-gpu-hour",
        "2",
        "--json",
    ]
    r = cli_run(*args)
    assert r.returncode == 0, r.stderr
    scen = json.loads(r.stdout)["scenarios"]
    days = [s["top"][0]["run"]["days"] for s in scen]
    cost = [s["top"][0]["run"]["cost"] for s in scen]
    assert days == sorted(days, reverse=True)  # more GPUs, sooner
    # a deadline between the fastest and the slowest, and a budget between the cheapest and the dearest
    deadline = (days[0] + days[-1]) / 2
    budget = (min(cost) + max(cost)) / 2
    r = cli_run(*args, "--deadline", f"{deadline * 24:.6f}h", "--budget", f"{budget:.2f}")
    assert r.returncode == 0, r.stderr
    picks = json.loads(r.stdout)["picks"]
    meets = [i for i, d in enumerate(days) if d * 86_400 <= round(deadline * 24, 6) * 3600]
    within = [i for i, c in enumerate(cost) if c <= round(budget, 2)]
    assert picks["cheapest_by_deadline"] == min(meets, key=lambda i: cost[i])
    assert picks["fastest_within_budget"] == min(within, key=lambda i: days[i])
    text = (tmp_path / scen[0]["report"]).read_text()
    assert "fig-whatif-run" in text and "Cheapest by the" in text


def test_choose_by_hand() -> None:
    run = TrainingRun(tokens=1e12, deadline_s=100 * 86_400, price_per_gpu_hour=1.0, budget=50.0)
    days = np.array([150.0, 90.0, 60.0, np.nan, 40.0])
    cost = np.array([30.0, 35.0, 45.0, 1.0, 60.0])
    c = choose(days, cost, run)
    assert c["fastest"] == 4 and c["cheapest"] == 0
    assert c["cheapest_by_deadline"] == 1  # 90 and 60 days meet it; 35 < 45
    assert c["fastest_within_budget"] == 2  # 30, 35, 45 are within 50; 60 days is the fastest of them
    assert c["both"] == 1
    c = choose(days, cost, TrainingRun(tokens=1e12, deadline_s=10 * 86_400))
    assert c["cheapest_by_deadline"] is None


def test_cluster_reliability(cli_run, one_line_error, tmp_path) -> None:
    """A cluster that never fails loses only its checkpoint writes; an unknown key is one line."""
    calm = tmp_path / "calm.yaml"
    calm.write_text("gpu: h100-sxm\nreliability:\n  interruptions_per_gpu_hour: 0\n  restart_s: 60\n")
    r = cli_run("estimate", "--model", "llama3-8b", "--gpus", "16", "--cluster", calm, "--tokens", "1T", "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)["run"]
    assert run["lost_to_rework"] == 0 and run["lost_to_restarts"] == 0 and run["goodput"] == 1.0
    r = cli_run("estimate", "--model", "llama3-8b", "--gpus", "16", "--tokens", "1T", "--json")
    run = json.loads(r.stdout)["run"]
    assert run["mtbf_s"] == pytest.approx(3600 / (DEFAULT_INTERRUPTIONS_PER_GPU_HOUR * 16), rel=1e-12)
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: h100-sxm\nreliability:\n  mtbf: 3\n")
    one_line_error(
        cli_run("estimate", "--model", "llama3-8b", "--gpus", "16", "--cluster", bad), ["reliability", "mtbf"]
    )
    bad.write_text("gpu: h100-sxm\nreliability:\n  restart_s: -5\n")
    one_line_error(cli_run("estimate", "--model", "llama3-8b", "--gpus", "16", "--cluster", bad), ["restart_s"])
