"""`autopar search --dtype` (a what-if over precisions), a space file that sets only dtype, the
space chosen without --space, the winner on a bound of the space, and what MFU is against."""

from __future__ import annotations

import json

import pandas as pd
import pytest

#: the question of the issue's acceptance line: llama3-70b on 64 H100s, Megatron-Bridge, gbs 128
QUESTION = ["--model", "70b", "--gpus", "64", "--trainer", "bridge", "--gbs", "128", "--top-k", "3"]
#: the knobs of a plan (plans.parquet), without the row's index
PLAN_KEYS = ["tp", "pp", "vpp", "cp", "dp", "ep", "zero_stage", "micro_batch_size", "recompute", "pp_schedule"]
PLAN_KEYS += ["dtype", "layout_id", "trainer", "fits", "step_time_s"]


def _search(cli_run, tmp_path, name, *extra):
    run_dir = tmp_path / name
    r = cli_run("search", *QUESTION, "--run-dir", run_dir, "--json", *extra)
    assert r.returncode == 0, r.stderr[-2000:]
    plans = pd.read_parquet(run_dir / "plans.parquet")[PLAN_KEYS]
    return json.loads(r.stdout), plans.sort_values(PLAN_KEYS).reset_index(drop=True)


@pytest.fixture(scope="module")
def fp8_runs(tmp_path_factory):
    from tests.cli.conftest import _run_in_process

    tmp = tmp_path_factory.mktemp("fp8")
    space = tmp / "only-fp8.yaml"
    space.write_text("knobs:\n  dtype: [fp8]\n")
    flag = _search(_run_in_process, tmp, "flag", "--dtype", "fp8")
    file = _search(_run_in_process, tmp, "file", "--space", space)
    return flag, file


def test_dtype_fp8_acceptance(fp8_runs):
    (doc, plans), _ = fp8_runs
    assert doc["space"] == "default+fp8" and doc["plans_fit"] > 0
    assert set(plans["dtype"]) == {"fp8"}
    assert doc["top"][0]["trainers"] == ["bridge"]


def test_space_file_of_only_dtype_gives_the_default_space_with_fp8(fp8_runs):
    (flag_doc, flag_plans), (file_doc, file_plans) = fp8_runs
    # before inheritance this file gave 5 plans (every other knob at its plan default) and none fit
    assert len(file_plans) == len(flag_plans) > 1000
    pd.testing.assert_frame_equal(file_plans, flag_plans)
    assert [t["plan"] for t in file_doc["top"]] == [t["plan"] for t in flag_doc["top"]]


def test_dtype_what_if_has_a_scenario_per_precision(cli_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a what-if writes its run directories under ./reports
    r = cli_run("search", *QUESTION, "--dtype", "bf16,fp8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    docs = json.loads(r.stdout)
    assert [d["space"] for d in docs] == ["default+bf16", "default+fp8"]
    assert [d["top"][0]["plan"]["dtype"] for d in docs] == ["bf16", "fp8"]
    assert len({d["run_dir"] for d in docs}) == 2  # each precision its own run directory
    # FP8 GEMMs run faster than BF16 on an H100 (989 vs 1,979 TF/s dense peaks): the fp8 winner is faster
    assert docs[1]["top"][0]["step_time_s"] < docs[0]["top"][0]["step_time_s"]


def test_bad_dtype_is_one_line(cli_run, one_line_error):
    one_line_error(cli_run("search", *QUESTION, "--dtype", "fp4"), ["--dtype", "fp4", "bf16, fp8, fp32"])
    one_line_error(cli_run("search", *QUESTION, "--dtype", "bf16,"), ["--dtype", "empty item"])


def test_the_chosen_space_is_said(cli_run, tmp_path):
    r = cli_run("search", *QUESTION, "--run-dir", tmp_path / "d")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Space: default (chosen for a dense model below seq 32,768); pass --space to choose another" in r.stdout
    named = cli_run("search", *QUESTION, "--space", "default", "--run-dir", tmp_path / "n", "--json")
    assert json.loads(named.stdout)["space_chosen"] is None


def test_winner_on_a_bound_of_the_space(cli_run, tmp_path):
    """The knobs where the winner sits on the default space's largest choice (search_spaces/
    default.yaml: tp 8, pp 16, vpp 10, cp 4, mbs 4) are each named with the shipped space that
    reaches further (dense-large: vpp up to 16), and no other."""
    args = [a if a != "64" else "256" for a in QUESTION]
    r = cli_run("search", *args, "--run-dir", tmp_path / "bound", "--json", "--dtype", "fp8", "--seq-len", "16384")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    # the winner, and the fastest plan where the headroom rule ranked another first
    plans = [doc["top"][0]["plan"], min(doc["top"], key=lambda t: t["step_time_s"])["plan"]]
    maxima = {"tp": 8, "pp": 16, "vpp": 10, "cp": 4, "micro_batch_size": 4}
    # tp 8 fills the node (tp within a node): a bound of the GPUs, not of the space
    on_bound = [k for k, top in maxima.items() if k != "tp" and any(p[k] == top for p in plans)]
    # 70B FP8 on 256 H100 at 16K tokens, batch 128: the model's fastest interleaves 10 stages a rank
    assert on_bound == ["vpp"], plans
    assert doc["space_bounds"] == ["vpp hit the space's maximum 10: try --space dense-large (vpp up to 16)"]


def test_mfu_legend_names_the_peak(cli_run, tmp_path):
    r = cli_run("search", *QUESTION, "--dtype", "fp8", "--run-dir", tmp_path / "m")
    # H100 SXM dense BF16 peak 989.4 TF/s (NVIDIA H100 datasheet); MFU of fp8 plans is against it too
    assert "MFU vs the dense bf16 peak 989 TF/s (h100-sxm), fp8 plans too (not the fp8 peak)" in r.stdout
