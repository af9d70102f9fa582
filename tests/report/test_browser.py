"""The report and a comparison in headless Chromium (Debian's `chromium`; `make test` installs it, and
these tests fail, not skip, without it): each page loads from file:// with the network disabled,
the console has no errors, no request leaves the file, every figure has drawn (plotly's SVG and
trace elements exist) and the screenshot is not blank, overall and where each figure is."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from autopar.report.html import REPORT_FILE

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CANARY = """<!DOCTYPE html><html><head><title>canary</title></head><body><p>canary</p>
<img src="http://example.invalid/pixel.png">
<script>
console.error("deliberate console error");
fetch("http://example.com/").then(function(){ document.title = "NET-OK"; })
  .catch(function(){ document.title = "NET-BLOCKED"; })
  .finally(function(){ document.documentElement.setAttribute("data-drawn-ms", "1"); });
undefinedFunction();
</script></body></html>"""


def figure_ids(page: Path) -> list[str]:
    return re.findall(r'<div id="([\w-]+)" class="plotly-fig"', page.read_text(encoding="utf-8"))


def console_errors(lines: list[str]) -> list[str]:
    """Chromium's own log of the page's console (not of its built-in chrome:// pages): uncaught
    errors and failed loads."""
    return [ln for ln in lines if "source: file://" in ln and re.search(r"Uncaught|Error|Failed to load|ERR_", ln)]


def check_page(result, page: Path) -> None:
    p = result.probe
    assert p["errors"] == [], p["errors"]
    assert console_errors(result.console) == [], result.console
    assert p["resources"] == [], f"requests left the file: {p['resources']}"
    assert p["plotly"], "plotly.js did not load"
    assert p["drawn_ms"] is not None, "the page never finished drawing"
    expected = figure_ids(page)
    assert [f["id"] for f in p["figures"]] == expected and expected
    img = result.pixels
    assert img.ndim == 3 and img.shape[0] > 100
    background = np.all(img >= 250, axis=2)
    assert (~background).mean() > 0.03, "the screenshot is (almost) blank"
    assert len(np.unique(img.reshape(-1, 3)[::7], axis=0)) > 50, "the screenshot has almost no colours"
    s = result.scale
    for f in p["figures"]:
        assert f["state"] == "drawn", f
        assert f["svgs"] >= 1 and f["traces"] >= 1 and f["trace_nodes"] >= 1, f
        assert f["points"] + f["paths"] > 0, f"{f['id']} has no marks: {f}"
        x, y, w, h = (int(round(v * s)) for v in f["rect"])
        assert y + h <= img.shape[0], f"{f['id']} is below the screenshot; make the window taller"
        region = img[y : y + h, x : x + w]
        ink = ~np.all(region >= 245, axis=2)
        assert ink.mean() > 0.02, f"{f['id']}: its part of the screenshot is blank ({ink.mean():.4f})"
        assert len(np.unique(region.reshape(-1, 3), axis=0)) >= 8, f"{f['id']}: hardly any colours"


def test_the_harness_sees_errors_and_the_network_is_off(browser, tmp_path):
    """The checks below mean something: a deliberately broken page is caught, and a request to the
    internet fails."""
    page = tmp_path / "canary.html"
    page.write_text(CANARY)
    r = browser.render(page, tmp_path, width=400, height=300, scale=1)
    errors = " | ".join(r.probe["errors"])
    assert "deliberate console error" in errors
    assert "undefinedFunction" in errors
    assert "failed to load http://example.invalid/pixel.png" in errors
    assert r.probe["title"] == "NET-BLOCKED"
    assert any("undefinedFunction" in ln for ln in r.console)  # Chromium's own log sees it too


def test_report_renders_offline_with_every_figure(browser, full_run, tmp_path):
    """The report with every section: top-k breakdowns, every plan, Optuna, trials, what-if."""
    page = full_run / REPORT_FILE
    r = browser.render(page, tmp_path, height=11000)
    check_page(r, page)
    ids = [f["id"] for f in r.probe["figures"]]
    assert ids == [
        "fig-time",
        "fig-memory",
        "fig-stage-memory",
        "fig-timeline",
        "fig-scatter",
        "fig-optuna",
        "fig-trials-time",
        "fig-trials-memory",
        "fig-whatif",
        "fig-whatif-mfu",
    ]
    scatter = next(f for f in r.probe["figures"] if f["id"] == "fig-scatter")
    assert scatter["points"] > 500  # every evaluated plan is a marker
    # the 80 % intervals are drawn: one error bar per top plan, one per point of the scatter
    top_k = len(json.loads((full_run / "top.json").read_text())["top"])
    assert next(f for f in r.probe["figures"] if f["id"] == "fig-time")["errorbars"] == top_k > 0
    assert scatter["errorbars"] > 500
    assert r.probe["sortable"] >= 1 and r.probe["sort"] == {"column": "#", "ascending": True, "descending": True}


def test_report_of_a_run_without_intervals_renders_offline(browser, run70_old, tmp_path):
    """A run directory written before the intervals: the same figures, no error bars."""
    from autopar.report.html import write_report

    page = write_report(run70_old, out=tmp_path / "old.html")
    r = browser.render(page, tmp_path, height=7500)
    check_page(r, page)
    ids = ["fig-time", "fig-memory", "fig-stage-memory", "fig-timeline", "fig-scatter"]
    assert [f["id"] for f in r.probe["figures"]] == ids
    assert all(f["errorbars"] == 0 for f in r.probe["figures"])


def test_comparison_renders_offline(browser, cli, run70, tmp_path):
    out = tmp_path / "compare.html"
    p = cli(
        "compare",
        "--model",
        "70b",
        "--gpus",
        "256",
        "--tp 8 --pp 4",
        "--tp 4 --pp 8 --recompute full",
        run70,
        "--out",
        out,
    )
    assert p.returncode == 0, p.stderr
    r = browser.render(out, tmp_path, height=3200)
    check_page(r, out)
    assert [f["id"] for f in r.probe["figures"]] == ["fig-time", "fig-memory", "fig-comm"]


def test_wide_tables_scroll_instead_of_clipping(browser, full_run, tmp_path):
    """In a 1000-pixel window the top-k, trials and what-if tables are wider than the page: each
    scrolls sideways in its wrapper, the page itself does not, and nothing else sticks out."""
    page = full_run / REPORT_FILE
    r = browser.render(page, tmp_path, width=1000, height=11000, scale=0.5)
    o = r.probe["overflow"]
    assert o["page_width"] <= o["window_width"], o
    assert o["sticking_out"] == [], o["sticking_out"]
    sortable = [t for t in o["tables"] if t["wrapped"]]
    assert sortable and all(t["overflow_x"] == "auto" for t in sortable)
    wide = [t for t in sortable if t["scroll_width"] > t["client_width"]]
    assert len(wide) >= 2, o["tables"]  # the top-k and the trials tables at least


@pytest.mark.parametrize("name", ["chromium"])
def test_chromium_is_installed(name):
    """Named failure when the browser is missing (the fixtures fail too, never skip)."""
    import shutil

    assert shutil.which(name) or shutil.which("chromium-browser"), (
        "install Debian's chromium (apt-get install -y chromium); make test does as root"
    )


def test_whole_run_whatif_renders_offline(browser, cli, tmp_path, monkeypatch):
    """--tokens with a deadline over two GPU counts: the time and cost panel, the days breakdown
    with its deadline line and the what-if's days and cost against GPUs draw without an error."""
    monkeypatch.chdir(tmp_path)  # a what-if writes reports/<scenario>/ here
    r = cli(
        "search",
        "--model",
        "llama3-8b",
        "--gpus",
        "16,32",
        "--tokens",
        "1T",
        "--deadline",
        "400d",
        "--price-per-gpu-hour",
        "2.5",
    )
    assert r.returncode == 0, r.stderr
    page = next(tmp_path.glob("reports/llama3-8b_16x*/" + REPORT_FILE))
    r = browser.render(page, tmp_path, height=11000)
    check_page(r, page)
    ids = [f["id"] for f in r.probe["figures"]]
    assert {"fig-run", "fig-whatif", "fig-whatif-run"} <= set(ids), ids
