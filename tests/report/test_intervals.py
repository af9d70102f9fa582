"""How sure, in the report (autopar/report/, from autopar.calibration.uncertainty's columns): the error
bars of the step-time breakdown and of the scatter are the run directory's 80 % intervals exactly
(top.json and scatter.parquet read here on their own), the top-plans table shows each plan's
interval and support as top.json has them, the answer shows the search's sureness lines, and a run
directory written before the intervals still renders, without any of it."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from autopar.report import answer_text as A
from autopar.report import run_data as D
from autopar.report import top_tables as T
from autopar.report.html import write_report

GIB = 2**30


def figure(text: str, div_id: str) -> dict:
    """A figure's {data, layout, config} as the page embeds it."""
    return json.loads(re.search(rf'id="{div_id}-json">(.*?)</script>', text, re.S).group(1))


def top_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "top.json").read_text())


@pytest.fixture(scope="module")
def page70(run70, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("intervals") / "report.html"
    return write_report(run70, out=out).read_text(encoding="utf-8")


# ---- error bars ----------------------------------------------------------------------------------


def test_step_time_error_bars_are_top_json_intervals(page70, run70):
    entries = top_json(run70)["top"]
    spec = figure(page70, "fig-time")
    bars = [t for t in spec["data"] if t.get("error_x")]
    assert len(bars) == 1 and bars[0]["name"] == "80 % interval"
    b = bars[0]
    assert b["y"] == [f"#{i} {e['plan_name']}" for i, e in enumerate(entries, start=1)]
    assert b["x"] == [e["step_time_s"] for e in entries]
    assert b["error_x"]["symmetric"] is False and b["error_x"]["type"] == "data"
    lo = [e["step_time_s_interval"][0] for e in entries]
    hi = [e["step_time_s_interval"][1] for e in entries]
    assert b["error_x"]["array"] == [h - e["step_time_s"] for h, e in zip(hi, entries)]
    assert b["error_x"]["arrayminus"] == [e["step_time_s"] - lo_ for lo_, e in zip(lo, entries)]
    assert b["customdata"] == [list(e["step_time_s_interval"]) for e in entries]
    assert all(lo_ < e["step_time_s"] < h for lo_, h, e in zip(lo, hi, entries))  # a real interval
    # the stacked segments carry no error bars of their own
    assert all("error_x" not in t for t in spec["data"] if t["type"] == "bar")


def test_scatter_error_bars_are_scatter_parquet_intervals(page70, run70):
    raw = pd.read_parquet(run70 / "scatter.parquet")
    # every plan at (memory GiB, tokens/s): the (up, down) of its throughput interval
    bars: dict[tuple[float, float], set] = {}
    for m, t, lo, hi in zip(
        raw["peak_memory_bytes"] / GIB, raw["tokens_per_s"], raw["tokens_per_s_low"], raw["tokens_per_s_high"]
    ):
        bars.setdefault((m, t), set()).add((hi - t, t - lo))
    spec = figure(page70, "fig-scatter")
    classes = [t for t in spec["data"] if t["name"].startswith(("fits", "rejected"))]
    assert classes and all("error_y" in t for t in classes)
    drawn = 0
    for t in classes:
        ey = t["error_y"]
        assert ey["symmetric"] is False and ey["type"] == "data"
        assert len(ey["array"]) == len(ey["arrayminus"]) == len(t["y"])
        for x, y, up, down in zip(t["x"], t["y"], ey["array"], ey["arrayminus"]):
            assert (up, down) in bars[(x, y)], (x, y)  # exactly the parquet's interval
            assert up >= 0 and down >= 0
            drawn += 1
    assert drawn > 500
    # the front and the winner are drawn over points that have their bars already
    assert all("error_y" not in t for t in spec["data"] if t not in classes)


# ---- the tables and the answer ---------------------------------------------------------------------


def test_top_table_interval_and_support_are_top_json(run70, page70):
    run = D.load_run(run70)
    entries = top_json(run70)["top"]
    top = T.top_table(run)
    assert len(top) == len(entries) == 10
    for (_, r), e in zip(top.iterrows(), entries):
        assert [r["step_time_s_low"], r["step_time_s_high"]] == e["step_time_s_interval"]
        assert [r["tokens_per_s_low"], r["tokens_per_s_high"]] == e["tokens_per_s_interval"]
        assert [r["peak_memory_bytes_low"], r["peak_memory_bytes_high"]] == e["peak_memory_bytes_interval"]
        assert r["support"] == e["support"] and r["support_reason"] == e["support_reason"]
    # the page: one interval cell (its exact ends) and one support cell (the reason as its title) per row
    table = re.search(r'<h2 id="top">.*?</table>', page70, re.S).group(0)
    assert '<th class="">80 % interval s</th>' in table and '<th class="t">support</th>' in table
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", re.search(r"<tbody>(.*?)</tbody>", table, re.S).group(1), re.S)
    assert len(rows) == len(entries)
    for row, e in zip(rows, entries):
        lo, hi = e["step_time_s_interval"]
        m = re.search(r'data-low="([^"]+)" data-high="([^"]+)">([^<]+)</td>', row)
        assert (float(m.group(1)), float(m.group(2))) == (lo, hi)
        assert m.group(3) == f"{lo:.3f}-{hi:.3f}"
        s = re.search(r'<td class="t (calibrated|extrapolated)" title="([^"]*)">(\w+)</td>', row)
        assert s.group(3) == s.group(1) == e["support"]
        assert html.unescape(s.group(2)) == e["support_reason"]


def test_trainer_table_support_is_top_json_per_trainer(run70, page70):
    run = D.load_run(run70)
    per = top_json(run70)["per_trainer"]
    tt = T.trainer_table(run)
    assert len(tt) == len([v for v in per.values() if v])
    for _, r in tt.iterrows():
        e = per[r["trainer"]]
        assert r["plan_index"] == e["plan_index"]
        assert [r["step_time_s_low"], r["step_time_s_high"]] == e["step_time_s_interval"]
        assert r["support"] == e["support"] and r["support_reason"] == e["support_reason"]
    assert {r["support"] for _, r in tt.iterrows()} == {"calibrated", "extrapolated"}  # both kinds shown
    table = re.search(r'<h2 id="trainers">.*?</table>', page70, re.S).group(0)
    assert table.count('class="t extrapolated"') == sum(v["support"] == "extrapolated" for v in per.values() if v)


def test_the_answer_shows_the_sureness_lines(run70, page70):
    search = json.loads((run70 / "search.json").read_text())
    lines = search["sureness"]  # the search stores them (autopar.search.run._write_search_json)
    assert lines and all(isinstance(x, str) for x in lines)
    assert lines[0].startswith(f"The winner {top_json(run70)['top'][0]['plan_name']} is ")
    sure = re.search(r'<ul class="sure">(.*?)</ul>', page70, re.S).group(1)
    assert [html.unescape(x) for x in re.findall(r"<li>(.*?)</li>", sure)] == lines
    assert A.INTERVAL_NOTE in html.unescape(page70)
    assert "80 % of outcomes like this fall inside" in A.INTERVAL_NOTE


def test_sureness_of_an_older_search_json_is_recomputed(run70, tmp_path):
    """search.json from before the search stored `sureness`: the lines again, from top.json's plans
    and the plans kept."""
    for f in ("top.json", "scatter.parquet"):
        shutil.copy(run70 / f, tmp_path / f)
    search = json.loads((run70 / "search.json").read_text())
    stored = search.pop("sureness")
    (tmp_path / "search.json").write_text(json.dumps(search))
    run = D.load_run(tmp_path)
    assert run.sureness is None
    assert A.sureness(run) == stored
    text = write_report(tmp_path).read_text(encoding="utf-8")
    assert '<ul class="sure">' in text


# ---- a run directory from before the intervals --------------------------------------------------------


def test_a_run_without_intervals_still_renders(run70_old):
    run = D.load_run(run70_old)
    top = T.top_table(run)
    assert len(top) == 10
    assert top["step_time_s_low"].isna().all() and (top["support"] == "").all()
    assert A.sureness(run) == [] and not A.has_intervals(run)
    text = write_report(run70_old).read_text(encoding="utf-8")
    # the breakdowns, the winner's stage memory and timeline, the scatter
    assert text.startswith("<!DOCTYPE html>") and text.count('class="plotly-fig"') == 5
    assert all("error_x" not in t for t in figure(text, "fig-time")["data"])
    assert all("error_y" not in t for t in figure(text, "fig-scatter")["data"])
    assert "80 % interval" not in text and '<ul class="sure">' not in text
    assert A.INTERVAL_NOTE not in html.unescape(text)
    # the plans' numbers are still there
    table = re.search(r'<h2 id="top">.*?</table>', text, re.S).group(0)
    for _, r in top.iterrows():
        assert f'data-v="{r["step_time_s"]!r}">{r["step_time_s"]:.3f}<' in table
