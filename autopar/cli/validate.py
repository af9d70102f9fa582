"""`autopar validate`: predicted vs published throughput of real training runs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o

Runs = Annotated[
    Optional[str],
    typer.Option(
        "--runs",
        help="A calibration CSV with the columns of the bundled "
        "tables (default: the bundled public runs, rows 1-106, 201-291 and 401-411).",
    ),
]
Trainer = Annotated[
    Optional[str],
    typer.Option(
        "--trainer",
        help="Only the runs priced with this trainer's performance profile (megatron, torchtitan, deepspeed, ...).",
    ),
]
Fit = Annotated[
    bool,
    typer.Option(
        "--fit",
        help="Refit the performance profiles to these runs (each constant pulled towards its "
        "physical prior, inside its documented range) and report with the fitted constants: "
        "prior, fitted value, shift and range of each.",
    ),
]
CrossValidate = Annotated[
    bool,
    typer.Option(
        "--cross-validate",
        help="With --runs: also the leave-one-source-out figures of your runs (fit on every source "
        "but one, predict that one; one fit per source). The bundled runs always have them.",
    ),
]
AllRows = Annotated[
    bool,
    typer.Option(
        "--all-rows",
        help="Print every row of the per-row tables (by default a table of more than 60 rows shows "
        "the 60 furthest off; --json always lists every row).",
    ),
]
WriteProfile = Annotated[
    Optional[str],
    typer.Option(
        "--write-profile",
        help="With --fit: write the fitted "
        "constants of --trainer's profile (default megatron) as a "
        "cluster profile YAML, for --cluster FILE.",
    ),
]
WriteProfiles = Annotated[
    Optional[str],
    typer.Option(
        "--write-profiles",
        help="With --fit: write every "
        "fitted profile as a profiles.toml (maintainers: "
        "autopar/cost/data/profiles.toml).",
    ),
]


@app.command()
def validate(
    runs: Runs = None,
    trainer: Trainer = None,
    fit: Fit = False,
    cross_validate: CrossValidate = False,
    write_profile: WriteProfile = None,
    write_profiles: WriteProfiles = None,
    all_rows: AllRows = False,
    as_json: o.Json = False,
) -> None:
    """Predict every published run whose layout is complete enough and compare with its measured
    throughput: per-row error and MAPE per category, family and source, in sample and
    leave-one-source-out cross-validated (recomputed: fit on every source but one, predict that
    one); rows that cannot be evaluated, with the reason.

    Refit from your own runs: autopar validate --fit --runs my_runs.csv --trainer megatron --write-profile mine.yaml
    """
    from autopar.cli.checks import output_file
    from autopar.errors import InputError

    given = [f for f, v in (("--write-profile", write_profile), ("--write-profiles", write_profiles)) if v]
    if given and not fit:
        raise InputError(
            f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --fit (there is nothing "
            f"fitted to write); add --fit"
        )
    output_file(write_profile, "--write-profile")
    output_file(write_profiles, "--write-profiles")
    from autopar.calibration.validate_runs import validate_runs

    report = validate_runs(runs, trainer, fit=fit, no_row=no_row_to_fit, cross_validate=cross_validate)
    from autopar.cli.render_validate import print_report, write_outputs

    written = write_outputs(report, trainer, write_profile, write_profiles)
    if as_json:
        from autopar.cli.render_validate import report_json
        from autopar.json_out import dumps

        print(dumps(report_json(report, written), indent=2))
        return
    print_report(report, written, all_rows)


def no_row_to_fit(runs: str | None, skipped: list[tuple[str, str, str]]) -> str:
    """The line for --fit when no row can be evaluated: how many were skipped and the first reason."""
    first = f" (row {skipped[0][0]}: {skipped[0][2][:120]})" if skipped else ""
    return (
        f"--fit has no row to fit: none of the {len(skipped):,} rows of {runs or 'the bundled tables'} can be "
        f"evaluated{first}; fix the rows (`autopar validate --runs FILE` lists why each is skipped)"
    )
