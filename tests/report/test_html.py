"""The pages (autopar/report/html.py, report_page.py, compare_page.py): one self-contained offline
file, plotly.js inlined once, no network references, the tables carry the run's numbers, optional
sections appear when their data exists; plotly is imported only by autopar/report/figure_base.py."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from autopar.report import answer_text as A
from autopar.report import run_data as D
from autopar.report import scatter_tables as S
from autopar.report import top_tables as T
from autopar.report.html import REPORT_FILE, write_report, write_reports

REPO = Path(__file__).resolve().parents[2]
MB = 1e6


def external_refs(text: str) -> list[str]:
    """src/href attributes of the page's own markup that leave the file (plotly.js's code is
    excluded: its strings are not requests)."""
    markup = re.sub(r"<script type=\"text/javascript\">.*?</script>", "", text, flags=re.S)
    markup = re.sub(r"<script type=\"application/json\"[^>]*>.*?</script>", "", markup, flags=re.S)
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", markup)
    return [r for r in refs if not (r.startswith("#") or re.match(r"^(\.\./|[\w.-]+/)*[\w.%-]+\.html$", r))]


def check_self_contained(text: str) -> None:
    assert text.startswith("<!DOCTYPE html>")
    assert text.count("plotly.js v") >= 1  # plotly.js's banner
    scripts = re.findall(r"<script[^>]*>", text)
    assert not [s for s in scripts if "src=" in s], "no external scripts"
    markup = re.sub(r"<script.*?</script>", "", text, flags=re.S)
    assert "<link" not in markup and "@import" not in markup and "url(" not in markup
    assert external_refs(text) == []
    # plotly.js inlined exactly once
    from plotly.offline import get_plotlyjs

    assert text.count(get_plotlyjs()[:2000]) == 1


@pytest.fixture(scope="module")
def report70(run70) -> tuple[Path, str]:
    path = write_report(run70)
    return path, path.read_text(encoding="utf-8")


def test_report_is_one_self_contained_file_under_10_mb(report70, run70):
    path, text = report70
    assert path == run70 / REPORT_FILE
    check_self_contained(text)
    assert path.stat().st_size < 10 * MB  # the acceptance bound for the 70B / 256 search


def test_report_has_the_question_answer_and_top_table(report70, run70):
    _, text = report70
    run = D.load_run(run70)
    assert A.answer(run) in text.replace("&#x27;", "'")
    top = T.top_table(run)
    table = re.search(r"<h2 id=\"top\">.*?</table>", text, re.S).group(0)
    assert table.count("<tr") == len(top) + 1
    for _, r in top.iterrows():  # the sortable cells carry the exact estimate, and show it rounded
        assert f'data-v="{r["step_time_s"]!r}">{r["step_time_s"]:.3f}<' in table
        assert f'data-v="{r["tokens_per_s"]!r}">{r["tokens_per_s"]:,.0f}<' in table
        assert f">{r['plan_name']}<" in table
    assert 'class="sortable"' in table
    for fig in ("fig-time", "fig-memory", "fig-scatter"):
        assert f'id="{fig}"' in text and f'id="{fig}-json"' in text
    for absent in ("fig-optuna", "fig-trials-time", "fig-whatif"):
        assert absent not in text  # an exhaustive run with no trials and no what-if
    variants = re.search(r"<h2 id=\"variants\">.*?</table>", text, re.S).group(0)
    assert variants.count("<tr") == len(T.variant_table(run)) + 1  # one row per folded variant


def test_figure_json_carries_the_numbers(report70, run70):
    _, text = report70
    run = D.load_run(run70)
    spec = json.loads(re.search(r'id="fig-time-json">(.*?)</script>', text, re.S).group(1))
    compute = next(t for t in spec["data"] if t["name"] == "compute")
    assert compute["x"] == T.time_breakdown(T.top_rows(run))["compute"].tolist()
    scatter = json.loads(re.search(r'id="fig-scatter-json">(.*?)</script>', text, re.S).group(1))
    drawn = sum(len(t["x"]) for t in scatter["data"] if t["name"].startswith(("fits", "rejected")))
    assert drawn == len(S.scatter_frame(run.plans))


def test_every_optional_section_appears_with_its_data(full_run, run70_128):
    text = (full_run / REPORT_FILE).read_text(encoding="utf-8")
    check_self_contained(text)
    for fig in (
        "fig-time",
        "fig-memory",
        "fig-scatter",
        "fig-optuna",
        "fig-trials-time",
        "fig-trials-memory",
        "fig-whatif",
    ):
        assert f'id="{fig}-json"' in text, fig
    assert "Trials: predicted vs measured (3)" in text
    # step-time errors (predicted - measured) / measured of the three trials: measured = 1.1, 0.95, 1.25 x
    assert ">-9.1%<" in text and ">+5.3%<" in text and ">-20.0%<" in text
    # what-if: both scenarios, this one marked, the other linked relatively
    assert "128 x h100-sxm" in text and "this report" in text
    other = Path(re.search(r'<a href="([^"]+report\.html)"', text).group(1))
    assert (full_run / other).resolve() == (run70_128 / REPORT_FILE).resolve()
    # the other scenario's report shows the same what-if, and a rebuild keeps it (whatif.json)
    assert "What-if: the best plan per scenario (2)" in (run70_128 / REPORT_FILE).read_text(encoding="utf-8")
    write_report(run70_128)
    assert "What-if: the best plan per scenario (2)" in (run70_128 / REPORT_FILE).read_text(encoding="utf-8")


def test_write_reports_dedupes_and_single_run_has_no_whatif(run70, tmp_path):
    paths = write_reports([run70, run70])
    assert paths == [run70 / REPORT_FILE]
    out = write_report(run70, out=tmp_path / "sub" / "r.html")
    assert out.is_file() and 'id="whatif"' not in out.read_text(encoding="utf-8")


def test_nothing_fits_report(tmp_path):
    from autopar.search.run import SearchOptions, run_search
    from autopar.search.space import load_space
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import get_preset
    from autopar.spec.question import Question

    m = get_preset("llama3.1-405b")
    q = Question(model=m, num_gpus=8, cluster=default_cluster("h100-sxm"), seq_len=8192, global_batch_size=64)
    run_search(q, SearchOptions(space=load_space("default"), run_dir=tmp_path))
    text = write_report(tmp_path).read_text(encoding="utf-8")
    assert "Nothing fits llama3.1-405b on 8 x h100-sxm" in text and "No plan fits" in text
    assert 'id="fig-scatter-json"' in text and 'id="fig-time-json"' not in text


def test_no_module_imports_plotly_figure_base_reads_its_bundle():
    """figure_base writes plotly's JSON and inlines plotly's bundle without importing plotly
    (tests/report/test_figure_json.py holds both to plotly's own)."""
    assert 'find_spec("plotly")' in (REPO / "autopar" / "report" / "figure_base.py").read_text()
    importers = []
    for path in sorted((REPO / "autopar").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] == "plotly" for n in names):
                importers.append(path.relative_to(REPO).as_posix())
    assert importers == []


def test_table_modules_import_no_plotly_and_the_package_is_light():
    import subprocess
    import sys

    code = (
        "import sys, autopar.report, autopar.report.top_tables, autopar.report.scatter_tables, "
        "autopar.report.answer_text, autopar.report.compare, autopar.cli.compare; "
        "print(sorted(m for m in ('plotly', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_new_single_search_forgets_an_old_whatif(run70, run70_128, tmp_path):
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    for src, dst in ((run70, a), (run70_128, b)):
        dst.mkdir()
        for f in ("scatter.parquet", "top.json", "search.json"):
            shutil.copy(src / f, dst / f)
    write_reports([a, b])
    assert (a / "whatif.json").is_file() and 'id="whatif"' in (a / REPORT_FILE).read_text(encoding="utf-8")
    write_report(a)  # a rebuild keeps it
    assert 'id="whatif"' in (a / REPORT_FILE).read_text(encoding="utf-8")
    write_reports([a])  # what `autopar search` does for one scenario
    assert not (a / "whatif.json").exists() and 'id="whatif"' not in (a / REPORT_FILE).read_text(encoding="utf-8")


def test_degenerate_runs_still_render(run70, tmp_path):
    """No plans at all, no valid plan, no finite estimate: a page, not a crash."""
    import shutil

    import pandas as pd

    for f in ("top.json", "search.json"):
        shutil.copy(run70 / f, tmp_path / f)
    top = json.loads((tmp_path / "top.json").read_text()) | {"top": [], "pareto": [], "why": "No plan is valid."}
    (tmp_path / "top.json").write_text(json.dumps(top))
    plans = pd.read_parquet(run70 / "scatter.parquet")
    invalid = plans.assign(fits=False, valid=False, rejected_by="tp%heads, pp>layers")
    for df, figs in ((plans.iloc[:0], 0), (invalid, 1), (invalid.assign(tokens_per_s=float("nan")), 0)):
        df.to_parquet(tmp_path / "scatter.parquet")
        text = write_report(tmp_path).read_text(encoding="utf-8")
        check_self_contained(text)
        assert "No plan fits" in text and text.count('class="plotly-fig"') == figs
