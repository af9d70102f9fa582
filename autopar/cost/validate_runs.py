"""`autopar validate` as a library call: published runs predicted in sample and leave-one-source-out
cross-validated (the headline), optionally after refitting the profiles; the stored cross-validation
of the bundled runs (data/profiles.cv.json, written with the shipped profiles) is shown without
refitting 14 folds."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from autopar.cost.profile_fit import ProfileFit, fit_profiles
from autopar.cost.profiles import Provenance, profile_of, profiles_toml, provenance
from autopar.cost.run_cases import RunCase, build_cases
from autopar.cost.run_rows import BUNDLED, load_runs
from autopar.cost.validation import RowResult, ValidationResult, evaluate_cases
from autopar.errors import InputError
from autopar.spec.hardware import CostConstants
from autopar.spec.trainers import get_trainer

CV_FILE = "profiles.cv.json"


@dataclass
class ValidationReport:
    in_sample: ValidationResult
    cross_validated: ValidationResult | None
    cv_origin: str  # where the cross-validated figures come from
    fit: ProfileFit | None
    runs: str  # what was read


def bundled_digest() -> str:
    """sha256 of the bundled calibration tables: a stored cross-validation is for these rows only."""
    h = hashlib.sha256()
    for name in BUNDLED:
        h.update(resources.files("autopar.cost").joinpath(f"data/{name}").read_bytes())
    return h.hexdigest()


def validate_runs(
    runs: str | None = None,
    trainer: str | None = None,
    fit: bool = False,
    cross_validate: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    cases, skipped = build_cases(load_runs(runs))
    if trainer is not None:
        prof = get_trainer(trainer).profile
        cases = [c for c in cases if profile_of(c.plan.trainer).name == prof]
        if not cases:
            raise InputError(
                f"no run of {runs or 'the bundled tables'} is priced with {trainer}'s profile; "
                f"drop --trainer or pass --runs with runs of that trainer"
            )
    fitted = fit_profiles(cases) if fit else None
    in_sample = evaluate_cases(cases, skipped, fitted.constants if fitted else None)
    if cross_validate:
        cv, origin = leave_one_source_out(cases, skipped, progress), "recomputed: leave-one-source-out refits"
    else:
        cv, origin = stored_cross_validation(cases, skipped, runs, fitted)
    return ValidationReport(in_sample, cv, origin, fitted, runs or "the bundled calibration runs (rows 1-54, 201-291)")


def _fold(args: tuple[list[RunCase], str]) -> tuple[str, dict[str, CostConstants], list[tuple[str, float, float]]]:
    cases, source = args
    train = [c for c in cases if c.source != source]
    constants = fit_profiles(train).constants
    held = evaluate_cases([c for c in cases if c.source == source], [], constants)
    return source, constants, [(r.case.row_id, r.predicted, r.error) for r in held.rows]


def leave_one_source_out(cases: list[RunCase], skipped, progress=None) -> ValidationResult:
    """Fit on every source but one, predict that one, for every source (folds in parallel)."""
    sources = list(dict.fromkeys(c.source for c in cases))
    by_row: dict[str, tuple[float, float]] = {}
    workers = max(1, min(len(sources), os.cpu_count() or 1))
    with ProcessPoolExecutor(workers) as pool:
        for source, _, rows in pool.map(_fold, [(cases, s) for s in sources]):
            if progress:
                progress(source)
            by_row.update({rid: (pred, err) for rid, pred, err in rows})
    kept = [c for c in cases if c.row_id in by_row]
    return ValidationResult([RowResult(c, *by_row[c.row_id]) for c in kept], skipped, "leave-one-source-out")


def stored_cross_validation(cases, skipped, runs, fitted) -> tuple[ValidationResult | None, str]:
    """The cross-validation stored with the shipped profiles, when it is for these rows."""
    if runs is not None:
        return None, "not stored for your runs: add --cross-validate (refits once per source)"
    if fitted is not None:
        return None, "refitted profiles: add --cross-validate for their cross-validated figures"
    path = resources.files("autopar.cost").joinpath(f"data/{CV_FILE}")
    if not path.is_file():
        return None, "none stored yet: run autopar validate --fit --cross-validate"
    data = json.loads(path.read_text())
    if data.get("runs_sha256") != bundled_digest():
        return None, "the stored cross-validation is for other rows: rerun with --cross-validate"
    rows = data["rows"]
    kept = [c for c in cases if c.row_id in rows]
    result = ValidationResult(
        [RowResult(c, rows[c.row_id]["predicted"], rows[c.row_id]["error"]) for c in kept],
        skipped,
        "leave-one-source-out",
    )
    return result, f"stored with the shipped profiles ({provenance().date}; {provenance().command})"


def write_profiles(report: ValidationReport, path: str | Path, command: str, date: str) -> list[Path]:
    """The fitted profiles as a profiles.toml (and, cross-validated, its .cv.json beside it)."""
    if report.fit is None:
        raise InputError("--write-profiles needs --fit (there is nothing fitted to write)")
    cv = report.cross_validated if report.cv_origin.startswith("recomputed") else None
    summary = (
        "none"
        if cv is None
        else "; ".join(
            f"{g} {100 * v['mape']:.1f}% over {v['rows']} rows" for g, v in cv.summary()["by_category"].items()
        )
    )
    prov = Provenance(
        command=command, runs=report.runs, date=date, cross_validation=f"leave-one-source-out MAPE: {summary}"
    )
    out = Path(path)
    _write(out, profiles_toml(report.fit.constants, prov))
    written = [out]
    if cv is not None:
        cv_path = out.with_name(CV_FILE) if out.name == "profiles.toml" else out.with_suffix(".cv.json")
        rows = {r.case.row_id: {"source": r.case.source, "predicted": r.predicted, "error": r.error} for r in cv.rows}
        _write(
            cv_path,
            json.dumps(
                {"runs_sha256": bundled_digest(), "summary": cv.summary(), "rows": rows}, indent=1, default=float
            )
            + "\n",
        )
        written.append(cv_path)
    return written


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        raise InputError(f"cannot write '{path}' ({e.strerror}); choose a writable path") from None
