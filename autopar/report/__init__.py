"""HTML reports of search runs and side-by-side comparisons of layouts.

Three steps: `run_data` reads a run directory (through autopar.search.run_dir), `tables`,
`trial_tables` and `compare_tables` compute the report data (pandas, exactly testable), `figures`
draws it (the only plotly importer), `html` assembles one self-contained page. `compare` resolves
the layouts of `autopar compare`. Importing this package imports neither
pandas nor plotly; `write_report` / `write_reports` load them when called.
"""

from __future__ import annotations


def write_report(run_dir, **kwargs):
    """Write RUN_DIR/report.html (see autopar.report.html.write_report)."""
    from autopar.report.html import write_report as _write

    return _write(run_dir, **kwargs)


def write_reports(run_dirs):
    """One report per run directory; several are the scenarios of one what-if
    (see autopar.report.html.write_reports)."""
    from autopar.report.html import write_reports as _write

    return _write(run_dirs)
