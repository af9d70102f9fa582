"""MoE routing as a user trains: a real router's imbalance by default (autopar.spec.routing), forced
balance only when asked (`--routing-imbalance 1`), capped at the plan's ep (the busiest of ep ranks
holds at most ep times the mean)."""

from __future__ import annotations

import json

import pytest

from autopar.calibration.estimate import estimate
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.resolve import resolve_plan
from autopar.spec.routing import REAL_ROUTER_IMBALANCE


def test_estimate_prices_a_real_router_unless_told(cli_run):
    args = ("estimate", "--model", "qwen3-30b-a3b", "--gpus", "64", "--ep", "8", "--json")
    real = json.loads(cli_run(*args).stdout)
    forced = json.loads(cli_run(*args, "--routing-imbalance", "1").stdout)
    assert real["routing_imbalance"] == REAL_ROUTER_IMBALANCE and forced["routing_imbalance"] == 1
    assert real["step_time_s"] > forced["step_time_s"]


def test_the_imbalance_is_capped_at_ep():
    """Without expert parallelism every rank holds every expert: the load is the mean, whatever the
    router; with ep 2 the busiest rank holds at most twice the mean."""
    model, cluster = get_preset("qwen3-30b-a3b"), default_cluster("h100-sxm")
    plan = resolve_plan(model, 8, 4096)
    assert plan.ep == 1
    one = estimate(plan, model, cluster, num_gpus=8, routing_imbalance=1.0).step_time_s
    assert estimate(plan, model, cluster, num_gpus=8, routing_imbalance=3.0).step_time_s == pytest.approx(one)
    ep2 = plan.with_(ep=2)
    at2 = estimate(ep2, model, cluster, num_gpus=8, routing_imbalance=2.0).step_time_s
    assert estimate(ep2, model, cluster, num_gpus=8, routing_imbalance=5.0).step_time_s == pytest.approx(at2)


def test_search_says_which_routing_it_priced(cli_run, tmp_path):
    args = ("search", "--model", "qwen3-30b-a3b", "--gpus", "8", "--top-k", "2")
    real = cli_run(*args, "--run-dir", tmp_path / "a").stdout
    assert "MoE routing: a real router, the busiest expert rank 1.79x the mean" in real
    forced = cli_run(*args, "--routing-imbalance", "1", "--run-dir", tmp_path / "b").stdout
    assert "MoE routing: forced balance" in forced
    saved = json.loads((tmp_path / "b" / "search.json").read_text())["question"]
    assert saved["routing_imbalance"] == 1.0
    dense = cli_run("search", "--model", "8b", "--gpus", "8", "--run-dir", tmp_path / "c").stdout
    assert "MoE routing" not in dense
