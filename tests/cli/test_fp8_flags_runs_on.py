"""One Megatron-Core answer for FP8: Megatron-LM, NeMo 2 and Megatron-Bridge differ in what an FP8
plan does by default (Bridge's recipes gather FP8 parameters, Megatron-LM does not unless told), so
a plan that fits on Bridge's defaults may not on Megatron-LM's. The search says which trainers run
it once its FP8 settings are named as its own trainer runs them, and with which flags; the check
here is an independent estimate of the same plan under Megatron-LM, without and with the flags."""

from __future__ import annotations

import json

from autopar.calibration.estimate import estimate_table
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import resolve_model
from autopar.spec.resolve import resolve_cluster
from autopar.spec.table import PlanTable


def test_a_bridge_only_fp8_plan_runs_on_megatron_with_its_flags_named(cli_run, tmp_path):
    r = cli_run(
        "search", "--model", "70b", "--gpus", "256", "--dtype", "fp8", "--top-k", "3", "--run-dir", tmp_path / "run"
    )
    assert r.returncode == 0, r.stderr
    top = json.loads((tmp_path / "run" / "top.json").read_text())["top"]
    flagged = [e for e in top if e.get("trainers_with_flags")]
    assert flagged, [e["trainers"] for e in top]
    entry = flagged[0]
    assert "megatron" not in entry["trainers"] and "megatron" in entry["trainers_with_flags"]
    model, cluster = resolve_model("llama3-70b"), resolve_cluster("h100-sxm")
    plan = ParallelPlan.from_dict(entry["plan"])
    # the flags name what the plan's own trainer runs by default (Bridge: its recipe's FP8 choices)
    recipe, gather = entry["fp8_flags"].removeprefix("--fp8-recipe ").split(" --fp8-param-gather ")
    plain = plan.with_(trainer="megatron")
    named = plain.with_(fp8_recipe=recipe, fp8_param_gather=gather)
    table = PlanTable.from_plans([plain, named, plan])
    # with the 2 GiB the default space keeps free (search_spaces/default.yaml memory_headroom_gib)
    est = estimate_table(table, model, cluster, num_gpus=256, seq_len=8192, headroom_gib=2.0)
    assert not bool(est["fits"][0]) and bool(est["fits"][1])
    # without the gather Megatron-LM holds the BF16 copies of the parameters too
    assert float(est["peak_memory_bytes"][0]) > float(est["peak_memory_bytes"][1])
    # named as Bridge runs it, Megatron-LM's plan is Bridge's plan: the same memory and step time
    assert float(est["peak_memory_bytes"][1]) == float(est["peak_memory_bytes"][2])
    assert float(est["step_time_s"][1]) == float(est["step_time_s"][2])
    # the terminal says it where the best plan per trainer is slower than the flagged one
    rank = top.index(entry) + 1
    assert (
        f"Megatron-LM runs #{rank} {entry['plan_name']} ({entry['step_time_s']:.3f} s) with {entry['fp8_flags']}"
        in r.stdout
    )
    assert "M*" in r.stdout and f"({entry['fp8_flags']})" in r.stdout
