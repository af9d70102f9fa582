"""Tables fit the terminal (issue 26, section 4): piped output at COLUMNS=120 has no line over 120
characters and cuts no cell, narrower terminals drop the least important columns (saying which)
and keep the layout, step time and MFU whole; the top-k shows structurally different layouts and
folds their variants (mbs, ZeRO, stage layout, flags) under them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from autopar.cli.render import PIPED_WIDTH, Col, console, fitted_table
from autopar.figures import TIME_TERMS
from autopar.search.results import STRUCTURE_KEY, dominant_costs, top_plans, variant_plans, why_winner

COMPARE = [
    "compare",
    "--model",
    "70b",
    "--gpus",
    "256",
    "--tp 8 --pp 4",
    "--tp 4 --pp 8 --recompute full",
    "--tp 4 --cp 2 --pp 2",
    "--tp 8 --pp 8 --vpp 2",
    "--tp 2 --pp 8 --recompute full",
    "--tp 8 --pp 2 --cp 2",
]
#: the seven table commands, with arguments that run in seconds
COMMANDS = {
    "search": ["search", "--model", "llama3-8b", "--gpus", "16", "--top-k", "5"],
    "estimate": ["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--pp", "16", "--ep", "64"],
    "compare": COMPARE,
    "trainers": ["trainers"],
    "trainers-one": ["trainers", "--trainer", "torchtitan"],
    "validate": ["validate"],
    "models": ["models"],
    "hardware": ["hardware"],
}


def _run(cli_run, args: list[str], tmp_path, monkeypatch) -> str:
    # a short run directory: a path is one word, which no width can wrap
    monkeypatch.chdir(tmp_path)
    extra = ["--run-dir", "run"] if args[0] == "search" else []
    r = cli_run(*args, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_line_fits_120_columns_and_no_cell_is_cut(name, cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    out = _run(cli_run, COMMANDS[name], tmp_path, monkeypatch)
    long = [line for line in out.splitlines() if len(line) > 120]
    assert not long, long
    assert "…" not in out  # rich's ellipsis: a cell cut short
    padded = [line for line in out.splitlines() if line.endswith(" ")]
    assert not padded, padded[:3]  # no line padded with trailing blanks


def test_piped_output_without_columns_is_120_wide(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert PIPED_WIDTH == 120
    assert console().width == 120  # pytest's stdout is not a terminal


def test_the_trainer_table_spells_out_the_schedules_it_abbreviates(cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    out = _run(cli_run, ["trainers"], tmp_path, monkeypatch)
    assert "interleaved-1f1b" not in out.split("schedules:")[0]  # abbreviated in the table
    assert "schedules: i-1f1b interleaved-1f1b, zb zero-bubble" in out


def test_compare_splits_layouts_that_do_not_fit_side_by_side(cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    out = _run(cli_run, COMPARE, tmp_path, monkeypatch)
    assert "part 1 of 2" in out and "part 2 of 2" in out
    for label in ("#1 tp8.pp4.dp8", "#6 tp8.cp2.pp2.dp8"):
        assert label in out


@pytest.mark.parametrize("width", [100, 80])
def test_a_narrow_terminal_keeps_the_layout_step_time_and_mfu_whole(width, cli_run, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    out = _run(cli_run, COMMANDS["search"], tmp_path, monkeypatch)
    assert not [line for line in out.splitlines() if len(line) > width]
    assert "…" not in out
    top = json.loads((tmp_path / "run" / "top.json").read_text())
    head = next(line for line in out.splitlines() if line.startswith(" #  layout"))
    assert "step s" in head and "MFU" in head
    for i, d in enumerate(top["top"], start=1):
        row = next(line for line in out.splitlines() if line.startswith(f" {i}  "))
        assert row.split()[1] == d["plan_name"]  # whole, not "tp4.p…"
        assert f"{d['step_time_s']:.3f}" in row and f"{100 * d['mfu']:.1f}%" in row
    # the interval and the support stay; what goes is named with the value a constant column held
    assert "80% range" in head and "support" in head
    dropped = out.split("not shown at this width: ")[1].split("(a wider terminal")[0]
    monkeypatch.setenv("COLUMNS", "400")
    (tmp_path / "wide").mkdir()
    wide = _run(cli_run, COMMANDS["search"], tmp_path / "wide", monkeypatch)
    every = next(line for line in wide.splitlines() if line.startswith(" #  layout"))
    for header in ("sched", "stages", "recomp", "ZeRO", "mbs", "mem GiB", "tokens/s", "runs on"):
        if header in every:
            assert header in head or header in " ".join(dropped.split()), header


def test_a_fitted_table_drops_the_lowest_drop_first_and_wraps_at_words():
    cols = (Col("name", left=True), Col("a", drop=2), Col("b", drop=1), Col("note", left=True, wraps=True))
    rows = [("layout-whole", "1" * 10, "2" * 10, "one two three four")]
    # natural: 12 + 10 + 10 + 18, 2 spaces between the 4 columns and an edge on either side = 58
    t, dropped = fitted_table("t", cols, rows, 58)
    assert dropped == [] and [c.header for c in t.columns] == ["name", "a", "b", "note"]
    # at 50 the note wraps (its longest word, 'three', is 5): 12 + 10 + 10 + 5 + 8 = 45 fits
    t, dropped = fitted_table("t", cols, rows, 50)
    assert dropped == [] and t.columns[3].width == 50 - 40
    # at 40: b (drop 1) goes first, then 12 + 10 + 5 + 6 = 33 fits
    t, dropped = fitted_table("t", cols, rows, 40)
    assert dropped == ["b"] and [c.header for c in t.columns] == ["name", "a", "note"]
    t, dropped = fitted_table("t", cols, rows, 20)
    assert dropped == ["a", "b"]  # name and note are never dropped


# ---- folding: structurally different plans, their variants -------------------------------------


def _plans() -> pd.DataFrame:
    """Six priced plans by hand: B and D are A with another ZeRO stage and micro-batch, F A
    recomputing (variants), E is A on another trainer (the same plan), C another grid."""
    rows = [
        # name, tp, pp, recompute, zero, mbs, trainer, step s
        ("A", 4, 2, "none", 1, 1, "megatron", 10.0),
        ("B", 4, 2, "none", 3, 1, "megatron", 10.5),
        ("C", 8, 1, "none", 1, 1, "megatron", 11.0),
        ("D", 4, 2, "none", 1, 2, "megatron", 12.0),
        ("E", 4, 2, "none", 1, 1, "torchtitan", 13.0),
        ("F", 4, 2, "full", 1, 1, "megatron", 14.0),
    ]
    df = pd.DataFrame(
        rows, columns=["plan_name", "tp", "pp", "recompute", "zero_stage", "micro_batch_size", "trainer", "step_time_s"]
    )
    return df.assign(fits=True, peak_memory_bytes=1.0, pp_schedule="1f1b", dp=8, dtype="bf16")


def test_the_top_k_holds_structurally_different_plans_with_their_variants_counted():
    top = top_plans(_plans(), 2)
    assert top["plan_name"].tolist() == ["A", "C"]  # B, D and F fold under A; E is A on torchtitan
    assert top["variants"].tolist() == [3, 0]
    assert top["trainers"].tolist()[0] == "megatron, torchtitan"
    # recompute is a variant: the runner-up is the next different layout, never A recomputing
    assert top_plans(_plans(), 3)["plan_name"].tolist() == ["A", "C"]
    v = variant_plans(_plans(), 2)
    assert v["plan_name"].tolist() == ["B", "D", "F"] and v["variant_of"].tolist() == [1, 1, 1]
    assert {"tp", "pp", "cp", "vpp", "dp", "ep", "etp", "pp_schedule", "dtype"} <= set(STRUCTURE_KEY)
    assert not {"micro_batch_size", "zero_stage", "layout_id", "recompute", "recompute_modules"} & set(STRUCTURE_KEY)


def test_the_why_line_compares_the_winner_with_the_best_other_structure():
    df = _plans()
    for t in TIME_TERMS:
        df[f"time_{t}"] = 0.0
    df["time_compute"] = df["step_time_s"]
    top = top_plans(df, 2)
    line = why_winner(top.iloc[0], top.iloc[1])
    assert line.startswith("A beats the runner-up, C, by 10.0% per step")  # 11 / 10 - 1, not B's 5 %


def test_dominant_cost_is_named_only_from_a_fifth_of_the_step():
    terms = {"tp": [1.9, 2.0, 2.5, 0.0], "bubble": [0.0, 0.0, 3.0, 0.0]}
    df = pd.DataFrame({f"time_{t}": terms.get(t, [0.0] * 4) for t in ("tp", "cp", "ep", "pp", "dp", "bubble")})
    df["step_time_s"] = 10.0
    # 1.9 s of 10 is 19 %: none dominates; 2.0 s is 20 %; of 2.5 and 3.0 s the larger; nothing at all
    assert dominant_costs(df).tolist() == ["", "tp", "bubble", ""]
    assert np.asarray(dominant_costs(df.iloc[:0])).tolist() == []
