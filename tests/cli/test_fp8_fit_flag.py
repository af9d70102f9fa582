"""One Megatron-Core answer for FP8: a Megatron-LM FP8 plan that does not fit because Megatron-LM's
delayed scaling keeps BF16 parameters says which flag fits it (--fp8-param-gather on, what
Megatron-Bridge's recipes turn on), with the peak that flag gives, as `estimate` prices it alone."""

from __future__ import annotations

import json

PLAN = ["--model", "70b", "--gpus", "256", "--tp", "4", "--pp", "2", "--cp", "2", "--dtype", "fp8", "--json"]


def _estimate(cli_run, *extra) -> dict:
    r = cli_run("estimate", *PLAN, *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_flag_that_fits_is_named_with_its_peak(cli_run):
    out = _estimate(cli_run, "--trainer", "megatron")
    alone = _estimate(cli_run, "--trainer", "megatron", "--fp8-param-gather", "on")
    assert out["fits"] is False and alone["fits"] is True
    assert out["fits_with"] == {"flags": "--fp8-param-gather on", "peak_memory_bytes": alone["peak_memory_bytes"]}


def test_no_flag_where_the_plan_fits_or_already_gathers_fp8(cli_run):
    assert "fits_with" not in _estimate(cli_run, "--trainer", "bridge")  # Bridge's delayed recipe gathers FP8
    assert "fits_with" not in _estimate(cli_run, "--trainer", "megatron", "--fp8-param-gather", "off")
    deeper = ["--model", "70b", "--gpus", "256", "--tp", "4", "--pp", "4", "--cp", "2", "--dtype", "fp8", "--json"]
    fits = json.loads(cli_run("estimate", *deeper, "--trainer", "megatron").stdout)
    assert fits["fits"] is True and "fits_with" not in fits


def test_the_table_says_it(cli_run):
    r = cli_run("estimate", *PLAN[:-1], "--trainer", "megatron")
    assert "DOES NOT FIT" in r.stdout and "Fits with --fp8-param-gather on: peak" in r.stdout
