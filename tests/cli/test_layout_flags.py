"""The settings that decide a plan's time and that its name does not show are in its layout cell,
each with a legend entry: TP overlap (+tpo), and with expert parallelism the DeepEP dispatcher
(+deepep) and the EP all-to-all overlap (+epo)."""

from __future__ import annotations

import json

import pandas as pd

from autopar.cli.render_search import FLAG_LEGEND, flags_legend, layout_cell


def _row(**kw) -> pd.Series:
    base = {"plan_name": "dp64.ep16", "ep": 16, "tp_comm_overlap": False, "moe_dispatcher": "alltoall"}
    return pd.Series(base | {"ep_comm_overlap": False} | kw)


def test_flags_by_hand():
    assert layout_cell(_row()) == "dp64.ep16"
    assert layout_cell(_row(moe_dispatcher="deepep", ep_comm_overlap=True)) == "dp64.ep16 +deepep +epo"
    assert layout_cell(_row(plan_name="tp8.pp2", ep=1, tp_comm_overlap=True)) == "tp8.pp2 +tpo"
    # without expert parallelism there is nothing to dispatch: the MoE settings mean nothing
    dense = _row(plan_name="tp8", ep=1, moe_dispatcher="deepep", ep_comm_overlap=True)
    assert layout_cell(dense) == "tp8"
    assert flags_legend([dense]) == ""
    assert flags_legend([_row(moe_dispatcher="deepep"), _row(tp_comm_overlap=True)]) == (
        f"+tpo: {FLAG_LEGEND['+tpo']}, +deepep: {FLAG_LEGEND['+deepep']}"
    )


def test_the_moe_answer_shows_the_winners_dispatcher_and_overlap(cli_run, tmp_path):
    r = cli_run("search", "--model", "qwen3-30b-a3b", "--gpus", "64", "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "run" / "top.json").read_text())["top"][0]["plan"]
    line = next(x for x in r.stdout.splitlines() if x.lstrip().startswith("1 "))
    assert ("+deepep" in line) == (plan["moe_dispatcher"] == "deepep")
    assert ("+epo" in line) == plan["ep_comm_overlap"]
    for flag in ("+deepep", "+epo"):
        if flag in line:
            assert f"{flag}: {FLAG_LEGEND[flag]}" in " ".join(r.stdout.split())
