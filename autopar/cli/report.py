"""`autopar report`: (re)build the HTML report of a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app


@app.command()
def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directory written by `autopar search`; several: the "
            "scenarios of a what-if, shown side by side in each report.",
            show_default=False,
            metavar="RUN_DIR",
        ),
    ],
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out", "-o", help="Write the report here instead of RUN_DIR/report.html (one run directory only)."
        ),
    ] = None,
) -> None:
    """Write RUN_DIR/report.html: one self-contained offline page (the question and its answer,
    the top plans, time and memory breakdowns, every evaluated plan, the Pareto front, Optuna's
    history, trials and what-if scenarios when present).

    Example: autopar report reports/llama3-70b_256xh100-sxm_s8192_gbs512_default
    """
    from autopar.errors import InputError
    from autopar.report.html import write_report, write_reports

    if out is not None and len(run_dirs) > 1:
        raise InputError("--out takes one run directory; without it each report goes into its own run directory")
    from autopar.cli.checks import output_file

    if out is not None and out.is_dir():
        raise InputError(f"--out '{out}' is a directory; give a file name such as {out / 'report.html'}")
    output_file(out, "--out")
    # one directory: rebuild it as it was (a what-if it belongs to stays); several: a what-if of them
    paths = [write_report(run_dirs[0], out=out)] if out is not None or len(run_dirs) == 1 else write_reports(run_dirs)
    for p in paths:
        print(f"Report: {p} ({p.stat().st_size / 1e6:.1f} MB)")
