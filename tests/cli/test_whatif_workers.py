"""A what-if searched and reported on forked workers (autopar.forked) writes the files, and prints
the answer, that one core gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

from autopar import forked


def _files(root: Path) -> dict:
    """Each scenario's top.json and search.json (less the timings and the run directory's own
    path) and report (less its time of writing and the search's duration), by scenario directory
    name."""
    out = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        info = json.loads((d / "search.json").read_text())
        info.pop("timings_s")
        info["options"].pop("run_dir", None)
        page = re.sub(r"written [0-9: -]+\.", "written W.", (d / "report.html").read_text(encoding="utf-8"))
        page = re.sub(r"search took [0-9.]+ s", "search took T s", page)
        out[d.name] = (json.loads((d / "top.json").read_text()), info, page.replace(str(root), "ROOT"))
    return out


def test_a_whatif_on_two_workers_writes_what_one_core_writes(cli_run, tmp_path, monkeypatch):
    """`search --model tiny --gpus 4,8 --gpu h100-sxm,a100-80gb`: four scenarios, each searched and
    reported on forked workers, against the same on one core."""
    runs = {}
    for cores in (1, 2):
        monkeypatch.setattr(forked, "usable_cores", lambda c=cores: c)
        (tmp_path / str(cores)).mkdir()
        monkeypatch.chdir(tmp_path / str(cores))  # a what-if writes under reports/ of the working directory
        r = cli_run("search", "--model", "tiny", "--gpus", "4,8", "--gpu", "h100-sxm,a100-80gb")
        assert r.returncode == 0, r.stderr
        runs[cores] = (_files(tmp_path / str(cores) / "reports"), r.stdout.replace(str(tmp_path / str(cores)), "ROOT"))
    assert len(runs[1][0]) == 4
    assert runs[2] == runs[1]
