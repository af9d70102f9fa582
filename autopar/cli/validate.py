"""`autopar validate`: predicted vs published throughput of real training runs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o


@app.command()
def validate(
    runs: Annotated[Optional[str], typer.Option("--runs", help="Calibration CSV (default: "
                                                "../shared/reference/calibration_runs.csv).")] = None,
    fit: Annotated[bool, typer.Option("--fit", help="Refit the cost model's efficiency constants to these runs "
                                      "(bounded least squares) and report the fitted values.")] = False,
    write_profile: Annotated[Optional[str], typer.Option("--write-profile", help="With --fit: write the fitted "
                                                         "constants as a cluster profile YAML (use with --cluster).")] = None,
    as_json: o.Json = False,
) -> None:
    """Predict every published run whose layout is complete enough and compare with its measured
    throughput: per-row error, MAPE and max error; rows that cannot be evaluated, with the reason."""
    from autopar.cost.published import default_runs_path, evaluate_runs, load_runs

    path = runs or default_runs_path()
    result = evaluate_runs(load_runs(path))
    if fit:
        from autopar.cli.render_validate import fit_summary
        from autopar.cost.published import fit_to_runs

        fitted = fit_to_runs(load_runs(path))
        result = fitted.result
        fit_summary(fitted, write_profile)
    if as_json:
        import json

        print(json.dumps(result.to_dict(), indent=2))
        return
    from autopar.cli.render import console
    from autopar.cli.render_validate import validation_tables

    out = console()
    for r in validation_tables(result, path):
        out.print(r)
