"""The reports of a what-if share their reading: each scenario's run directory is read once for all
of them (autopar.report.html.write_reports), and a run's top rows are built once per load
(RunData.derived), each caller getting its own copy. The pages are those each run directory gives
on its own rebuild (`autopar report`, which reads every directory afresh). Counted on one core: on
several, the reports are written on forked workers that start with every run read
(tests/cli/test_whatif_workers.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from autopar import forked
from autopar.report import html as H
from autopar.report import run_data as D
from autopar.report import top_tables as T


def _copies(tmp_path: Path, *runs: Path) -> list[Path]:
    """Copies of the session's run directories (the reports write into them)."""
    return [Path(shutil.copytree(r, tmp_path / f"s{i}")) for i, r in enumerate(runs)]


def _page(path: Path) -> str:
    return re.sub(r"written [0-9: -]+\.", "written W.", path.read_text(encoding="utf-8"))


def test_a_whatif_reads_each_run_once(run70, run70_128, tmp_path, monkeypatch):
    monkeypatch.setattr(forked, "usable_cores", lambda: 1)
    dirs = _copies(tmp_path, run70, run70_128)
    reads: list[Path] = []
    real = D.load_run

    def counted(run_dir, **kw):
        reads.append(Path(run_dir).resolve())
        return real(run_dir, **kw)

    monkeypatch.setattr(D, "load_run", counted)
    built = {"n": 0}
    real_rows = T._top_rows

    def rows(run):
        built["n"] += 1
        return real_rows(run)

    monkeypatch.setattr(T, "_top_rows", rows)
    pages = H.write_reports(dirs)
    assert sorted(reads) == sorted(d.resolve() for d in dirs)  # two scenarios: two reads, not four
    assert built["n"] == 2  # one top table per run, for its own report and the other's what-if row
    shared = [_page(p) for p in pages]
    monkeypatch.setattr(D, "load_run", real)
    monkeypatch.setattr(T, "_top_rows", real_rows)
    alone = [_page(H.write_report(d)) for d in dirs]  # a rebuild: whatif.json, every run read afresh
    assert shared == alone


def test_top_rows_are_a_copy(run70):
    run = D.load_run(run70)
    first = T.top_rows(run)
    first["plan_name"] = "changed"
    assert (T.top_rows(run)["plan_name"] != "changed").all()
