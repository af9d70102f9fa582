"""How sure an answer is, as the user sees it (issue 23): the intervals and the support in
`estimate --json` and in `search --json`'s top and per-trainer plans, the answer lines, `--rank-by
p80`, the terminal tables at 120 columns, and `validate --json`'s coverage."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

FIELDS = ("tokens_per_s_per_gpu_interval", "step_time_s_interval", "peak_memory_bytes_interval")


def _check_fields(d: dict) -> None:
    assert d["interval_level"] == 0.8
    assert d["support"] in ("calibrated", "extrapolated") and d["support_reason"]
    for f in FIELDS:
        lo, hi = d[f]
        central = d[f.removesuffix("_interval")]
        assert lo <= central <= hi, (f, lo, central, hi)
    # step time and throughput are one figure: the same relative band, mirrored
    t_lo, t_hi = d["step_time_s_interval"]
    k_lo, k_hi = d["tokens_per_s_per_gpu_interval"]
    assert d["step_time_s"] / t_hi == pytest.approx(k_lo / d["tokens_per_s_per_gpu"])
    assert d["step_time_s"] / t_lo == pytest.approx(k_hi / d["tokens_per_s_per_gpu"])


def test_estimate_json_has_intervals_and_support(cli_run):
    r = cli_run("estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    _check_fields(d)
    assert d["support"] == "calibrated"  # Megatron-LM's own README runs are this layout's neighbours
    # ZeRO-3 over 256 data-parallel ranks: no published Megatron run shards that wide
    r = cli_run("estimate", "--model", "70b", "--gpus", "256", "--zero", "3", "--recompute", "full", "--json")
    d = json.loads(r.stdout)
    _check_fields(d)
    assert d["support"] == "extrapolated" and "ZeRO-3 beyond dp" in d["support_reason"]


def test_a_plan_at_the_edge_of_memory_is_tight_not_ruled_out(cli_run):
    """NVIDIA's Llama 3.1 405B recipe (tp8 pp8 vpp8 cp2 on 512 H100, published running) is priced a
    little above the GPU's memory; the memory interval's low end is below it, so the answer says
    tight and asks for a measurement, reading both figures from the estimate's own JSON."""
    args = ("estimate", "--model", "405b", "--gpus", "512", "--tp", "8", "--pp", "8", "--vpp", "8", "--cp", "2")
    args += ("--gbs", "512", "--seq-len", "8192", "--tp-comm-overlap")
    d = json.loads(cli_run(*args, "--json").stdout)
    low, high = d["peak_memory_bytes_interval"]
    assert not d["fits"] and low <= d["memory_capacity_bytes"] < d["peak_memory_bytes"]
    text = " ".join(cli_run(*args).stdout.split())
    assert f"tight, not ruled out: the interval's low end ({low / 2**30:.1f} GiB)" in text


@pytest.fixture(scope="module")
def search70(tmp_path_factory):
    from tests.cli.conftest import _run_in_process

    run = tmp_path_factory.mktemp("s70") / "run"
    r = _run_in_process("search", "--model", "70b", "--gpus", "256", "--json", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), run


def test_search_json_top_and_per_trainer_carry_intervals(search70):
    out, run = search70
    for d in out["top"] + [t for t in out["per_trainer"].values() if t]:
        _check_fields(d)
    every = pd.read_parquet(run / "plans.parquet")
    fit = every[every["fits"]]
    assert (fit["step_time_s_low"] <= fit["step_time_s"]).all() and (
        fit["step_time_s"] <= fit["step_time_s_high"]
    ).all()
    top = out["top"][0]
    row = every[every["plan_index"] == top["plan_index"]].iloc[0]
    assert [row["step_time_s_low"], row["step_time_s_high"]] == pytest.approx(top["step_time_s_interval"])


def test_answer_says_whether_the_winner_is_calibrated_and_the_margin_holds(search70):
    """The runner-up's line: its margin over the winner against the paired model's 80 % interval for
    plans that many layout knobs apart (autopar.calibration.margin), the knobs counted here by hand
    from the two plans."""
    from autopar.calibration.margin import PairedMargin
    from autopar.calibration.stored_figures import stored_figures

    out, _ = search70
    lines = out["sureness"]
    w, r = out["top"][0], out["top"][1]
    assert lines[0].startswith(f"The winner {w['plan_name']} is {w['support']}")
    model = PairedMargin(**stored_figures()["uncertainty"]["paired_margin"])
    fields = ("tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch_size", "zero_stage", "dtype")
    apart = sum(w["plan"][f] != r["plan"][f] for f in fields)
    recompute = [tuple(x["plan"][f] for f in ("recompute", "recompute_modules", "recompute_layers")) for x in (w, r)]
    apart += recompute[0] != recompute[1]  # what is recomputed: one knob
    half = model.half_width(apart)
    ratio = math.log(r["step_time_s"] / w["step_time_s"])
    assert f"{apart} layout knob{'' if apart == 1 else 's'} apart" in lines[1]
    lo, hi = 100 * math.expm1(ratio - half), 100 * math.expm1(ratio + half)
    assert f"the 80 % interval of the difference is {lo:+.1f} % to {hi:+.1f} %" in lines[1]
    assert ("cannot tell them apart" in lines[1]) == (abs(ratio) <= half)
    assert ("the ranking holds" in lines[1]) == (abs(ratio) > half)


def test_the_winner_fits_at_the_top_of_its_memory_interval_or_nothing_near_does(search70):
    """The headroom rule on the main job, recomputed from the plans it kept: either the winner's
    memory interval stays inside the GPU less the space's headroom, or no fitting plan within the
    space's headroom_trade of the fastest does."""
    out, run = search70
    search = json.loads((run / "search.json").read_text())
    cons = search["space"]["constraints"]
    w = out["top"][0]
    usable = w["memory_capacity_bytes"] - cons["memory_headroom_gib"] * 2**30
    if w["peak_memory_bytes_interval"][1] <= usable:
        fastest = min(t["step_time_s"] for t in out["top"])
        assert w["step_time_s"] <= fastest * (1 + cons["headroom_trade"])
        if w["step_time_s"] > fastest:
            assert "is ranked first for headroom" in out["why"]
        return
    every = pd.read_parquet(run / "plans.parquet")
    fit = every[every["fits"]]
    near = fit[fit["step_time_s"] <= w["step_time_s"] * (1 + cons["headroom_trade"])]
    assert not (near["peak_memory_bytes_high"] <= usable).any()


def test_rank_by_p80_ranks_by_the_pessimistic_end(cli_run, tmp_path):
    r = cli_run(
        "search", "--model", "70b", "--gpus", "256", "--rank-by", "p80", "--json", "--run-dir", tmp_path / "run"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    highs = [d["step_time_s_interval"][1] for d in out["top"]]
    # the plan the headroom rule ranks first leads; the others follow by the pessimistic end
    rest = highs[1:] if "is ranked first for headroom" in out["why"] else highs
    assert rest == sorted(rest)
    every = pd.read_parquet(tmp_path / "run" / "plans.parquet")
    assert min(highs) == pytest.approx(every[every["fits"]]["step_time_s_high"].min())
    assert out["rank_by"] == "p80"


def test_rank_by_unknown_is_one_line(cli_run, one_line_error):
    one_line_error(cli_run("search", "--model", "70b", "--gpus", "256", "--rank-by", "p95"), ["--rank-by", "p80"])


@pytest.mark.parametrize(
    "args",
    [
        ["search", "--model", "70b", "--gpus", "256"],
        ["search", "--model", "qwen3-30b-a3b", "--gpus", "64"],
        ["estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4"],
    ],
    ids=["search-70b", "search-moe", "estimate"],
)
def test_tables_fit_120_columns_and_keep_plan_names_whole(cli_run, args, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    extra = ["--run-dir", tmp_path / "run"] if args[0] == "search" else []
    r = cli_run(*args, *extra)
    assert r.returncode == 0, r.stderr
    long = [line for line in r.stdout.splitlines() if len(line) > 120]
    assert not long, long
    if args[0] == "search":
        top = json.loads((tmp_path / "run" / "top.json").read_text())
        for d in top["top"]:
            assert d["plan_name"] in r.stdout  # not cut to "tp4.p…"
        assert "…" not in r.stdout


#: splits whose intervals hold more than 90 % of a category's runs, with why (the tests fail when one
#: comes back under 90 %: then drop it here)
OVER_COVERED = {
    ("leave one source out", "MoE"): "the new-source widening (one draw per source) is set by the two small "
    "sources the model misses most (the GB200 DeepSeek-V3 baseline, Mixtral under MCore v0.8's real router): "
    "41 of 44 runs inside, 82.5 % of the sources",
    ("chronological", "MoE"): "the intervals fitted on the sources before 2025-07-01 are as wide as their few "
    "MoE sources' spread (median 99 % of the estimate), wider than the later runs need: 28 of 29 inside",
    ("chronological", "all rows"): "its MoE runs, 29 of its 40 (above)",
}


def test_validate_json_reports_coverage_per_category(cli_run):
    r = cli_run("validate", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["interval_level"] == 0.8
    cov = out["coverage"]
    for category, v in cov.items():
        if v["rows"] >= 10 and category != "peak memory":
            if ("leave one source out", category) in OVER_COVERED:
                assert v["covered"] > 0.90 and 0.70 <= v["covered_by_source"] <= 0.90, (category, v)
            else:
                assert 0.70 <= v["covered"] <= 0.90, (category, v)
    assert {"dense Megatron-family", "FSDP-family", "MoE", "long context"} <= set(cov)
    assert not math.isnan(cov["peak memory"]["covered"])


def test_validate_prints_coverage_per_category_for_each_split_and_the_median_width(cli_run, monkeypatch):
    """The terminal table holds, per category, the --json coverage of leave one source out, leave
    one group out and the chronological split, and the median width of the first; the new-ground
    splits stay within 70-90 % where they hold 10 runs or more (issue 43's acceptance)."""
    import re

    out = json.loads(cli_run("validate", "--json").stdout)
    monkeypatch.setenv("COLUMNS", "200")
    text = cli_run("validate").stdout
    splits = [out["coverage"], *(out["coverage_on_new_ground"][k] for k in ("leave one group out", "chronological"))]
    for category in ("all rows", "dense Megatron-family", "FSDP-family", "MoE", "long context"):
        want = [
            f"{100 * c[category]['covered']:.1f}% ({c[category]['rows']})" if category in c else "-" for c in splits
        ]
        first = out["coverage"][category]
        want.insert(1, f"{100 * first['covered_by_source']:.1f}% ({first['sources']})")
        want.append(f"{100 * first['median_width']:.1f}%")
        table = text[text.index("Runs inside their 80 % interval") :].splitlines()
        line = next(ln for ln in table if re.match(rf"│ {re.escape(category)} +│ +\d", ln))
        assert [cell.strip() for cell in line.strip("│ ").split("│")][1:] == want, line
        for name, c in zip(("leave one group out", "chronological"), splits[1:], strict=True):
            got = c.get(category, {})
            if got.get("rows", 0) < 10:
                continue
            if (name, category) in OVER_COVERED:
                assert got["covered"] > 0.90, f"{name} {category} no longer over-covers: drop it from OVER_COVERED"
            else:
                assert 0.70 <= got["covered"] <= 0.90, (name, category, got)
    assert 0 < out["coverage"]["MoE"]["median_width"] < 1.5  # MoE: the widest, yet not unbounded


def test_compare_shows_each_layouts_support_and_interval(cli_run):
    r = cli_run("compare", "--model", "70b", "--gpus", "256", "--tp 8 --pp 4", "--zero 3 --recompute full", "--json")
    assert r.returncode == 0, r.stderr
    a, b = json.loads(r.stdout)["layouts"]
    _check_fields(a)
    _check_fields(b)
    assert (a["support"], b["support"]) == ("calibrated", "extrapolated")


def test_validate_runs_of_ones_own_reports_their_coverage_by_the_shipped_intervals(cli_run, tmp_path):
    """A set of runs the model is judged on (e.g. runs kept aside): priced with the shipped profiles,
    each inside or outside the interval the shipped support gives it."""
    from importlib import resources

    from autopar.calibration.run_rows import BUNDLED

    path = tmp_path / "mine.csv"
    path.write_text(resources.files("autopar.calibration").joinpath(f"data/{BUNDLED[0]}").read_text())
    r = cli_run("validate", "--runs", path, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["coverage"]["all rows"]["rows"] == out["evaluated"]
    assert 0.0 < out["coverage"]["all rows"]["covered"] <= 1.0
    assert set(out["by_category"]) <= set(out["coverage"])


def test_a_gpu_without_a_stated_generation_reads_as_words(cli_run):
    """The machine's own profile (`--gpu local`) states no architecture: the support line says so
    in words ("on this GPU (its generation is not stated)"), not "on a this GPU's (not stated) GPU"."""
    r = cli_run("estimate", "--model", "tiny", "--gpus", "2", "--gpu", "local", "--trainer", "deepspeed", "--json")
    assert r.returncode == 0, r.stderr
    why = json.loads(r.stdout)["support_reason"]
    assert "run on this GPU (its generation is not stated)" in why
    assert "a this GPU" not in why
