"""Write the report and comparison pages: one self-contained HTML file each (`report_page`,
`compare_page`), plotly.js inlined once, no network access (no CDN, no fonts, no MathJax), a few
lines of inline JavaScript to sort tables. Opens from disk in any browser.

`write_report(run_dir)` is what `autopar search` calls after writing a run directory (through
`write_reports`, one report per scenario); `write_compare` is `autopar compare --out`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

from autopar.atomic import write_with
from autopar.errors import InputError
from autopar.forked import forked_map
from autopar.report import run_data as D
from autopar.report.compare_page import compare_html
from autopar.report.report_page import REPORT_FILE, report_html
from autopar.search.run_dir import forget_scenarios, write_scenarios


def write_report(
    run_dir: str | Path,
    *,
    out: str | Path | None = None,
    scenarios: Sequence[str | Path] | None = None,
    loaded: dict | None = None,
) -> Path:
    """(Re)build the report of a run directory; returns the file written (default
    RUN_DIR/report.html). `scenarios`: the run directories of the search this run belongs to (this
    one included); several are a what-if, recorded in RUN_DIR/whatif.json so a later `autopar
    report` keeps the what-if section; one (or none) removes a whatif.json left by an earlier
    what-if. None (the default, a rebuild): keep whatever whatif.json says. Raises InputError for
    a missing or corrupt run directory. `loaded`: the runs already read (by resolved path), shared by
    the reports of one what-if (with `scenarios`, which replaces what whatif.json said) so each run
    directory is read once, its trials too (it is the run of its own report), and its tables derived
    once (RunData.derived)."""
    d = Path(run_dir)
    run = loaded.get(d.resolve()) if loaded is not None else None
    if run is None:
        run = D.load_run(run_dir)
        if loaded is not None:
            loaded[d.resolve()] = run
    if scenarios is not None:  # a fresh search: record its scenarios, or forget a what-if of the past
        dirs = [Path(s) for s in scenarios]
        if len(dirs) > 1:
            write_scenarios(d, dirs)
        else:
            forget_scenarios(d)
        run.scenarios = dirs
    scenario_runs = None
    if len(run.scenarios) > 1:
        scenario_runs = []
        for s in run.scenarios:
            if Path(s).resolve() == d.resolve():
                scenario_runs.append(run)
            elif Path(s).is_dir():
                key = Path(s).resolve()
                try:
                    other = loaded[key] if loaded is not None and key in loaded else None
                    if other is None and loaded is not None:  # with its trials: its own report's run next
                        other = loaded[key] = D.load_run(s, with_scenarios=False)
                    elif other is None:
                        other = D.load_run(s, with_trials=False, with_scenarios=False)
                    scenario_runs.append(other)
                except InputError:  # a scenario removed or broken since: leave it out
                    continue
    path = Path(out) if out is not None else d / REPORT_FILE
    _mkdir_write(path, report_html(run, scenario_runs, out_dir=path.parent))
    return path


def write_reports(run_dirs: Sequence[str | Path], loaded: dict | None = None) -> list[Path]:
    """The reports of one search (what `autopar search` calls): one report per run directory;
    several directories are the scenarios of a what-if, and each report shows them side by side.
    `loaded`: runs already read (`read_run`), by resolved path."""
    # one directory twice (e.g. two scenarios into one --run-dir) is one scenario
    seen: dict[Path, Path] = {}
    for d in run_dirs:
        seen.setdefault(Path(d).resolve(), Path(d))
    unique = list(seen.values())
    loaded = {} if loaded is None else loaded  # each scenario's run read once for all the what-if's reports
    if len(unique) > 1:  # read here, so that the workers the reports are written on start with them
        for d in unique:
            if d.resolve() not in loaded:
                read_run(d, loaded)
    return forked_map([partial(write_report, d, scenarios=unique, loaded=loaded) for d in unique])


def read_run(run_dir: str | Path, loaded: dict) -> None:
    """Read a run directory into `loaded` (by resolved path), for `write_reports`."""
    loaded[Path(run_dir).resolve()] = D.load_run(run_dir)


def write_compare(cmp, out: str | Path) -> Path:
    path = Path(out)
    _mkdir_write(path, compare_html(cmp))
    return path


def _mkdir_write(path: Path, text: str) -> None:
    """Atomically (a reader, or a second search worker writing the same run directory, never sees
    half a page), creating the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
