"""HTML reports of search runs and side-by-side comparisons of layouts.

Three steps. Data: `run_data` reads a run directory (through autopar.search.run_dir);
`top_tables` (the top-k, the best plan per trainer, the breakdowns, each plan's 80 % intervals and
support), `scatter_tables` (every plan's scatter, the Pareto front), `answer_text` (the question,
the answer and how sure it is, in words), `run_tables`
(the whole run's days and cost), `trial_tables` (Optuna, trials, what-if) and `compare_tables`
compute the report data (pandas, exactly testable). Figures: `breakdown_figures`,
`scatter_figures` and `trial_figures` draw it as plotly figure dicts, on `figure_base` (the
layout, serialisation, plotly.js: the only plotly importer). Pages: `report_page` and
`compare_page` assemble one self-contained page from `page`'s building blocks (`format` formats
the numbers), and `html` writes them. `compare` resolves the layouts of `autopar compare`.
Importing this package imports neither pandas nor plotly; `write_report` / `write_reports` load
them when called.
"""

from __future__ import annotations


def write_report(run_dir, **kwargs):
    """Write RUN_DIR/report.html (see autopar.report.html.write_report)."""
    from autopar.report.html import write_report as _write

    return _write(run_dir, **kwargs)


def write_reports(run_dirs, loaded=None):
    """One report per run directory; several are the scenarios of one what-if
    (see autopar.report.html.write_reports)."""
    from autopar.report.html import write_reports as _write

    return _write(run_dirs, loaded)


def read_run(run_dir, loaded):
    """Read a run directory for `write_reports` (see autopar.report.html.read_run)."""
    from autopar.report.html import read_run as _read

    _read(run_dir, loaded)
