"""The report's data step (autopar/report/top_tables.py, scatter_tables.py, answer_text.py,
trial_tables.py, compare_tables.py): its numbers are the estimates of the run directory
(scatter.parquet, top.json, search.json; plans.parquet for every plan), exactly; the Pareto front is
a Pareto front; the predicted-vs-measured errors are right; what-if and compare frames carry the
right plans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.figures import AXES, MEMORY_TERMS, TIME_TERMS
from autopar.report import answer_text as A
from autopar.report import compare_tables as C
from autopar.report import run_data as D
from autopar.report import scatter_tables as S
from autopar.report import top_tables as T
from autopar.report import trial_tables as X
from autopar.search import run_dir as run_files
from autopar.search.results import pareto_front

GIB = 2**30


@pytest.fixture(scope="module")
def run(run70) -> D.RunData:
    return D.load_run(run70)


def top_json(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "top.json").read_text())["top"]


# ---- top-k and breakdowns equal the estimates -----------------------------------------------------


def test_top_table_rows_are_the_ranked_rows_of_plans_parquet(run, run70):
    every = pd.read_parquet(run70 / "plans.parquet")  # every plan, key figures
    fit = every[every["fits"]].sort_values(["step_time_s", "peak_memory_bytes", "plan_index"], kind="stable")
    # the fastest of each structure: the grid, the schedule, the precision
    structure = ["tp", "pp", "vpp", "cp", "dp", "ep", "etp", "pp_schedule", "dtype"]
    entries = top_json(run70)
    why = json.loads((run70 / "top.json").read_text())["why"]
    if "is ranked first for headroom" in why:  # the headroom rule's pick leads (autopar.search.margins)
        first = fit[fit["plan_index"] == entries[0]["plan_index"]]
        rest = fit[~(fit[structure] == first[structure].iloc[0]).all(axis=1)]
        best = pd.concat([first, rest.drop_duplicates(structure)]).head(len(entries))
    else:
        best = fit.drop_duplicates(structure).head(len(entries))
    top = T.top_table(run)
    assert T.top_rows(run)["plan_index"].tolist() == best["plan_index"].tolist()
    kept = run.plans.set_index("plan_index", drop=False)
    expected = kept.loc[best["plan_index"]]  # the same plans' every column, from scatter.parquet
    assert len(top) == len(expected) == 10
    assert (expected["step_time_s"].to_numpy() == best["step_time_s"].to_numpy()).all()
    for col in (
        "plan_name",
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "bubble_fraction",
        "peak_memory_bytes",
        "pp_schedule",
        "recompute",
        "zero_stage",
        "micro_batch_size",
        "dominant_cost",
        "layout_text",
        "tp",
        "cp",
        "pp",
        "vpp",
        "dp",
        "ep",
    ):
        assert top[col].tolist() == expected[col].tolist(), col  # exact, not approximate
    assert top["rank"].tolist() == list(range(1, 11))
    assert (top["memory_gib"] == expected["peak_memory_bytes"].to_numpy() / GIB).all()
    assert (top["memory_capacity_gib"] == expected["memory_capacity_bytes"].to_numpy() / GIB).all()


def test_top_table_equals_top_json(run, run70):
    top, entries = T.top_table(run), top_json(run70)
    for (_, row), e in zip(top.iterrows(), entries):
        assert row["rank"] == e["rank"]
        assert row["plan_name"] == e["plan_name"]
        for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "bubble_fraction", "peak_memory_bytes"):
            assert row[k] == e[k], k
        assert row["layout_text"] == e["layout"] and row["dominant_cost"] == e["dominant_cost"]
        assert row["pp_schedule"] == e["plan"]["pp_schedule"] and row["recompute"] == e["plan"]["recompute"]


def test_time_breakdown_equals_the_estimates_and_sums_to_the_step(run, run70):
    rows = T.top_rows(run)
    tb = T.time_breakdown(rows)
    assert list(tb.index) == [f"#{i} {e['plan_name']}" for i, e in enumerate(top_json(run70), start=1)]
    for (label, r), e in zip(tb.iterrows(), top_json(run70)):
        assert {t: r[t] for t in TIME_TERMS} == e["time_s"], label
        assert r["step_time_s"] == e["step_time_s"]
        assert math.isclose(sum(r[t] for t in TIME_TERMS), r["step_time_s"], rel_tol=1e-9)


def test_memory_breakdown_equals_the_estimates_and_sums_to_the_peak(run, run70):
    mb = T.memory_breakdown(T.top_rows(run))
    for (label, r), e in zip(mb.iterrows(), top_json(run70)):
        assert {t: r[t] for t in MEMORY_TERMS} == e["memory_bytes"], label
        assert r["peak_memory_bytes"] == e["peak_memory_bytes"]
        assert r["memory_capacity_bytes"] == e["memory_capacity_bytes"]
        assert math.isclose(sum(r[t] for t in MEMORY_TERMS), r["peak_memory_bytes"], rel_tol=1e-9)
        assert r["peak_memory_bytes"] <= r["memory_capacity_bytes"]  # the top-k fit


# ---- every evaluated plan --------------------------------------------------------------------------


def test_scatter_has_every_kept_plan_with_its_estimate(run):
    plans = run.plans
    sc = S.scatter_frame(plans, max_points=len(plans))
    assert sc.attrs["total"] == len(plans) and sc.attrs["without_estimate"] == 0
    assert sc["n_plans"].sum() == len(plans) == sc.attrs["plotted_plans"]
    # each point is a plan of plans.parquet (its index) with that plan's numbers, exactly
    src = plans.loc[sc.index]
    assert (sc["tokens_per_s"].to_numpy() == src["tokens_per_s"].to_numpy()).all()
    assert (sc["memory_gib"].to_numpy() == src["peak_memory_bytes"].to_numpy() / GIB).all()
    assert (sc["plan_name"].to_numpy() == src["plan_name"].to_numpy()).all()
    # plans merged into a point have the same estimate and class; every plan is in exactly one point
    key = lambda df, cat: list(zip(df["peak_memory_bytes"], df["tokens_per_s"], cat))  # noqa: E731
    cats = S.categories(plans)
    counts = pd.Series(key(plans, cats)).value_counts()
    assert len(counts) == len(sc)
    assert sorted(counts.tolist()) == sorted(sc["n_plans"].tolist())
    assert set(key(plans, cats)) == set(key(src, sc["category"]))


def test_scatter_colours_fits_and_rejection_reasons(run):
    plans = run.plans
    cats = S.categories(plans)
    assert ((cats == "fits") == plans["fits"]).all()
    rejected = plans[~plans["fits"]]
    first = rejected["rejected_by"].str.split(", ").str[0]
    named = cats[rejected.index] != "other rules"  # the rarest reasons share one colour
    assert (cats[rejected.index][named] == first[named]).all()
    assert set(cats) - {"other rules"} <= {"fits"} | set(first) and {"fits", "memory"} <= set(cats)
    assert len(set(cats)) <= S.MAX_CATEGORIES
    assert S.category_order(cats)[:2] == ["fits", "memory"]
    hover = S.hover_text(plans)
    i = plans.index[~plans["fits"]][0]
    assert plans.loc[i, "plan_name"] in hover[i] and plans.loc[i, "layout_text"] in hover[i]
    assert "rejected: " + plans.loc[i, "rejected_by"] in hover[i]


def test_rare_rejection_reasons_share_one_colour():
    df = pd.DataFrame(
        {"fits": [True] + [False] * 12, "rejected_by": [""] + [f"rule{i}" for i in range(11)] + ["rule0, rule3"]}
    )
    cats = S.categories(df)
    assert cats.nunique() <= S.MAX_CATEGORIES
    assert "other rules" in set(cats) and cats.iloc[-1] == cats.iloc[1] == "rule0"


def test_scatter_sample_keeps_the_front_and_the_top_k(run):
    keep = T.top_rows(run).index
    sc = S.scatter_frame(run.plans, keep=keep, max_points=300)
    full = S.scatter_frame(run.plans, max_points=len(run.plans))
    assert len(sc) == 300 and sc.attrs["points"] == len(full) and sc.attrs["plotted"] == 300
    assert set(full.index[full["pareto"]]) <= set(sc.index)
    assert set(keep) & set(full.index) <= set(sc.index)
    again = S.scatter_frame(run.plans, keep=keep, max_points=300)
    assert sc.index.equals(again.index)  # deterministic


# ---- Pareto front ----------------------------------------------------------------------------------


def _dominates(a_tput, a_mem, b_tput, b_mem) -> bool:
    return a_tput >= b_tput and a_mem <= b_mem and (a_tput > b_tput or a_mem < b_mem)


def check_front(tput: np.ndarray, mem: np.ndarray, mask: np.ndarray) -> None:
    front = np.flatnonzero(mask)
    for i in front:  # no front point dominates another (or duplicates it)
        for j in front:
            if i != j:
                assert not _dominates(tput[i], mem[i], tput[j], mem[j])
                assert (tput[i], mem[i]) != (tput[j], mem[j])
    for k in np.flatnonzero(~mask):  # every other point is dominated by, or equal to, a front point
        assert any(
            _dominates(tput[i], mem[i], tput[k], mem[k]) or (tput[i], mem[i]) == (tput[k], mem[k]) for i in front
        ), k


def test_pareto_front_of_the_run(run, run70):
    fit = run.plans[run.plans["fits"]]
    mask = S.pareto_mask(fit["tokens_per_s"].to_numpy(), fit["peak_memory_bytes"].to_numpy())
    check_front(fit["tokens_per_s"].to_numpy(), fit["peak_memory_bytes"].to_numpy(), mask)
    table = S.pareto_table(run.plans)
    assert set(table.index) == set(fit.index[mask])
    assert table["peak_memory_bytes"].is_monotonic_increasing and table["tokens_per_s"].is_monotonic_increasing
    # the same front the search wrote into top.json (it ranks by step time; one batch size here)
    written = json.loads((run70 / "top.json").read_text())["pareto"]
    assert set(table["plan_index"]) == {e["plan_index"] for e in written}
    assert set(table.index) == set(pareto_front(run.plans).index)
    # the winner (fastest) is on it
    assert T.winner(run).name in set(table.index)


def test_pareto_mask_by_hand():
    tput = np.array([10, 9, 10, 8, 10, 7, 11])
    mem = np.array([5, 4, 5, 4, 6, 1, 9])
    #               front, front, dup of 0, dominated by 1, dominated by 0, front, front
    assert S.pareto_mask(tput, mem).tolist() == [True, True, False, False, False, True, True]
    assert S.pareto_mask(np.array([]), np.array([])).tolist() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=40))
def test_pareto_mask_property(points):
    tput = np.array([p[0] for p in points], float)
    mem = np.array([p[1] for p in points], float)
    check_front(tput, mem, S.pareto_mask(tput, mem))


# ---- Optuna history ---------------------------------------------------------------------------------


def test_optuna_history_is_search_json_history(run_optuna):
    r = D.load_run(run_optuna)
    h = X.optuna_history(r)
    hist = json.loads((run_optuna / "search.json").read_text())["history"]
    assert len(h) == len(hist) == 20
    assert h["number"].tolist() == [x["number"] for x in hist]
    assert h["step_time_s"].tolist() == [x["step_time_s"] for x in hist]
    assert h["feasible"].tolist() == [x["feasible"] for x in hist]
    best = h["best_so_far"].dropna()
    assert best.is_monotonic_decreasing
    assert math.isclose(best.iloc[-1], h.loc[h["feasible"], "step_time_s"].min())


def test_exhaustive_run_has_no_history(run):
    assert X.optuna_history(run).empty


# ---- trials: predicted vs measured ---------------------------------------------------------------

PLAN = {"tp": 8, "pp": 4, "dp": 8, "global_batch_size": 512}


def test_predicted_vs_measured_error_arithmetic(tmp_path, trials):
    trials.write(
        tmp_path,
        [
            (
                PLAN,
                {"step_time_s": 11.0, "peak_memory_bytes": 40 * GIB},
                {"step_time_s": 10.0, "peak_memory_bytes": 50 * GIB},
            ),
            (
                PLAN | {"tp": 4, "pp": 8},
                {"step_time_s": 9.0, "peak_memory_bytes": 30 * GIB},
                {"step_time_s": 12.0, "peak_memory_bytes": 30 * GIB},
            ),
            (PLAN, {"step_time_s": 5.0, "peak_memory_bytes": 1 * GIB}, {"step_time_s": None, "peak_memory_bytes": 0}),
        ],
    )
    data, problems = D.load_trials(tmp_path)
    assert problems == [] and len(data) == 3
    df = X.trials_table(data)
    assert df["plan_name"].tolist() == ["tp8.pp4.dp8", "tp4.pp8.dp8", "tp8.pp4.dp8"]
    assert df["step_time_error_s"].iloc[:2].tolist() == pytest.approx([1.0, -3.0])
    assert df["step_time_error"].iloc[:2].tolist() == pytest.approx([0.1, -0.25])
    assert df["memory_error_gib"].iloc[:2].tolist() == pytest.approx([-10.0, 0.0])
    assert df["memory_error"].iloc[:2].tolist() == pytest.approx([-0.2, 0.0])
    assert df["predicted_memory_gib"].iloc[0] == 40 and df["measured_memory_gib"].iloc[0] == 50
    # a failed measurement (None) and a zero denominator give no error, not inf
    assert math.isnan(df["step_time_error"].iloc[2]) and math.isnan(df["step_time_error_s"].iloc[2])
    assert math.isnan(df["memory_error"].iloc[2])
    s = X.trials_summary(df)
    assert s["trials"] == 3
    assert s["step_time_mape"] == pytest.approx((0.1 + 0.25) / 2)
    assert s["memory_mape"] == pytest.approx((0.2 + 0.0) / 2)


def test_bad_trial_files_are_skipped_and_named(tmp_path, trials):
    trials.write(tmp_path, [(PLAN, {"step_time_s": 1.0}, {"step_time_s": 1.0})])
    (tmp_path / "trials" / "broken.json").write_text("{not json")
    (tmp_path / "trials" / "partial.json").write_text(json.dumps({"plan": PLAN, "predicted": {}}))
    data, problems = D.load_trials(tmp_path)
    assert [d["_file"] for d in data] == ["trial00.json"]
    assert (
        len(problems) == 2 and any("broken.json" in p for p in problems) and any("partial.json" in p for p in problems)
    )


def test_no_trials_directory_means_no_trials(run):
    assert run.trials == [] and run.trial_problems == []


# ---- what-if ------------------------------------------------------------------------------------------


def test_whatif_best_plan_per_scenario(run70, run70_128):
    runs = [D.load_run(run70_128), D.load_run(run70)]
    wt = X.whatif_table(runs, current=run70)
    assert wt["num_gpus"].tolist() == [128, 256]
    assert wt["current"].tolist() == [False, True]
    for (_, row), d in zip(wt.iterrows(), (run70_128, run70)):
        best = top_json(d)[0]
        assert row["plan_name"] == best["plan_name"]
        for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_bytes"):
            assert row[k] == best[k], k
        assert row["plans_fit"] == json.loads((d / "search.json").read_text())["plans_fit"]


def test_scenarios_round_trip_through_whatif_json(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    run_files.write_scenarios(a, [a, b])
    assert [p.resolve() for p in run_files.read_scenarios(a)] == [a.resolve(), b.resolve()]
    assert json.loads((a / "whatif.json").read_text())["scenarios"] == [".", "../b"]  # relative: moves with them


# ---- question and answer --------------------------------------------------------------------------


def test_question_and_answer(run, run70):
    q = dict(zip(*A.question_rows(run).to_dict("list").values()))
    assert "llama3-70b" in q["model"] and "256 x h100-sxm" in q["GPUs"]
    assert q["global batch"].startswith("512 sequences x 8192 tokens")
    p = pd.read_parquet(run70 / "plans.parquet")  # every plan
    assert q["plans"] == f"{len(p):,} evaluated, {int(p['valid'].sum()):,} valid, {int(p['fits'].sum()):,} fit"
    assert q["rejected by"].startswith("memory (")
    w = top_json(run70)[0]
    ans = A.answer(run)
    assert ans.count(".") >= 1 and ans.startswith("On 256 x h100-sxm, llama3-70b trains fastest with " + w["plan_name"])
    assert f"{w['step_time_s']:.3f} s per step" in ans and f"{w['tokens_per_s']:,.0f} tokens/s" in ans


# ---- compare -------------------------------------------------------------------------------------------


def _estimates():
    from autopar.calibration.estimate import estimate
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import get_preset
    from autopar.spec.resolve import resolve_plan

    m, c = get_preset("llama3-70b"), default_cluster("h100-sxm")
    plans = [resolve_plan(m, 256, 8192, tp=8, pp=4), resolve_plan(m, 256, 8192, tp=4, pp=8, recompute="full")]
    return [estimate(p, m, c, num_gpus=256, seq_len=8192).to_dict() | {"name": p.describe()} for p in plans]


def test_compare_table_aligns_every_breakdown():
    ests = _estimates()
    labels = ["#1 a", "#2 b"]
    t = C.compare_table(labels, ests).set_index("key")
    for e, lab in zip(ests, labels):
        assert t.loc["step_time_s", lab] == e["step_time_s"]
        for term in TIME_TERMS:
            assert t.loc[f"time_s.{term}", lab] == e["time_s"][term]
        for term in MEMORY_TERMS:
            assert t.loc[f"memory_bytes.{term}", lab] == e["memory_bytes"][term]
        for a in AXES:
            assert t.loc[f"comm_bytes_per_gpu.{a}", lab] == e["comm_bytes_per_gpu"][a]
        assert t.loc["headroom_bytes", lab] == e["memory_capacity_bytes"] - e["peak_memory_bytes"]
        assert t.loc["plan.tp", lab] == e["plan"]["tp"]
    assert t.loc["plan.tp", "differs"] and t.loc["plan.recompute", "differs"]
    assert not t.loc["plan.cp", "differs"] and not t.loc["memory_capacity_bytes", "differs"]
    faster = labels[int(np.argmin([e["step_time_s"] for e in ests]))]
    assert t.loc["step_time_s", "best"] == faster and t.loc["tokens_per_s", "best"] == faster
    smaller = labels[int(np.argmin([e["peak_memory_bytes"] for e in ests]))]
    assert t.loc["peak_memory_bytes", "best"] == smaller
    assert t.loc["plan.tp", "best"] == ""  # layout rows are not ranked
    rows = C.estimate_rows(labels, ests)
    assert T.time_breakdown(rows, labels).loc["#2 b", "compute"] == ests[1]["time_s"]["compute"]
    assert T.memory_breakdown(rows, labels).loc["#1 a", "activations"] == ests[0]["memory_bytes"]["activations"]


def test_trials_table_has_the_intervals_before_and_after_calibration(tmp_path, trials):
    """Before: the trial file's predicted interval; after: search.json's measured.intervals, by key."""
    trials.write(
        tmp_path,
        [
            (
                PLAN,
                {"step_time_s": 11.0, "peak_memory_bytes": 40 * GIB, "step_time_s_interval": [9.5, 12.0]},
                {"step_time_s": 10.0, "peak_memory_bytes": 50 * GIB},
            ),
            (PLAN | {"tp": 4, "pp": 8}, {"step_time_s": 9.0, "peak_memory_bytes": 30 * GIB}, {"step_time_s": 12.0}),
        ],
    )
    data, _ = D.load_trials(tmp_path)
    key = str(data[0]["_file"]).removesuffix(".json")
    df = X.trials_table(data, {key: {"after": [10.1, 10.4]}})
    first = df.iloc[0]
    assert (first["interval_before_low"], first["interval_before_high"]) == (9.5, 12.0)
    assert (first["interval_after_low"], first["interval_after_high"]) == (10.1, 10.4)
    assert df[["interval_before_low", "interval_after_high"]].iloc[1].isna().all()  # none recorded
    assert X.trials_table(data, {key: "junk"})["interval_after_low"].isna().all()


# ---- variants and the trainers with no plan -------------------------------------------------------


def test_variants_table_lists_top_json_variants_under_their_leaders(run, run70):
    doc = json.loads((run70 / "top.json").read_text())
    top, variants = doc["top"], doc["variants"]
    assert variants, "the 70B / 256 search folds variants under its top plans"
    table = T.variant_table(run)
    assert len(table) == len(variants)
    assert list(table["variant_of"]) == sorted(table["variant_of"])  # grouped under rank 1, 2, ...
    # the table's order: by leader, then step time, ties in top.json's order (two stage layouts with
    # the same slowest stage run at the same pace)
    ordered = sorted(variants, key=lambda v: (v["variant_of"], v["step_time_s"]))
    for (_, row), v in zip(table.iterrows(), ordered, strict=True):
        assert (row["variant_of"], row["plan_name"], row["step_time_s"]) == (
            v["variant_of"],
            v["plan_name"],
            v["step_time_s"],
        )
        lead = top[row["variant_of"] - 1]
        assert row["vs_leader"] == pytest.approx(v["step_time_s"] / lead["step_time_s"] - 1, rel=1e-12)
        assert row["memory_gib"] == pytest.approx(v["peak_memory_bytes"] / GIB, rel=1e-12)
        differing = {k for k in v["plan"] if v["plan"][k] != lead["plan"][k]} - {"num_microbatches", "trainer"}
        named = {"mbs": "micro_batch_size", "ZeRO": "zero_stage", "stages": "layout", "SP": "sequence_parallel"}
        for word, key in named.items():  # each change the table names is a field that differs, and back
            assert (f"{word} " in row["changes"]) == (key in differing), (word, row["changes"], differing)
    rows = T.top_rows(run)
    assert list(rows["variants"]) == [sum(v["variant_of"] == e["rank"] for v in variants) for e in top]


def test_dropped_trainers_say_why():
    ruled = "DeepSpeed cannot run qwen3-30b-a3b (moe) (its MoE source); use --trainer megatron"
    run = D.RunData(
        run_dir=Path("."),
        plans=pd.DataFrame(),
        top={"per_trainer": {"megatron": {"plan_name": "dp64"}, "deepspeed": None, "torchtitan": None}},
        search={"question": {"trainers": ["megatron", "deepspeed", "torchtitan"]}},
    )
    run.top["trainers_ruled_out"] = {"deepspeed": ruled}
    table = T.dropped_trainers(run)
    assert table.to_dict("records") == [
        {"trainer": "deepspeed", "why": ruled},
        {"trainer": "torchtitan", "why": "no plan of the space fits in memory with this trainer"},
    ]
