"""`autopar validate` as a library call: published runs predicted in sample and leave-one-source-out
cross-validated (fit on every source but one, predict that one: the headline figure), optionally
after refitting the profiles. The cases are priced once and a fit only re-assembles the step
(autopar.calibration.case_batch), so the cross-validation of the bundled runs takes seconds.

`autopar validate --fit --write-profiles autopar/cost/data/profiles.toml` regenerates the shipped
profiles and their stored figures (data/profiles.cv.json) with a digest over the data, the
predictions and the fit they were computed with (`current_digest`): the docs quote that command's
output, and a test checks the stored digest is the current one.
"""

from __future__ import annotations

import ast
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

from autopar.atomic import write_atomic
from autopar.calibration.case_batch import CaseBatch, forget_profiles
from autopar.calibration.margin import fit_paired_margin, margin_coverage
from autopar.calibration.memory_published import PublishedMemoryResult, compare_published_memory
from autopar.calibration.new_ground import chronological, leave_one_group_out, leave_out, physics_only
from autopar.calibration.profile_fit import ProfileFit, fit_profiles
from autopar.calibration.run_cases import RunCase, build_cases
from autopar.calibration.run_rows import BUNDLED, BUNDLED_ROWS, load_runs
from autopar.calibration.stored_figures import CV_FILE, shipped_path, stored_figures
from autopar.calibration.support import calibration_point
from autopar.calibration.uncertainty import (
    LEVEL,
    Support,
    by_group,
    coverage_against,
    fit_memory_new_source,
    fit_new_source,
    fit_widening,
    nested_coverage,
    nested_memory_coverage,
    support_points,
)
from autopar.calibration.validation import RowResult, ValidationResult, evaluate_cases
from autopar.cost.profiles import Provenance, profile_of, profiles_toml
from autopar.errors import InputError
from autopar.json_out import dumps
from autopar.spec.trainers import get_trainer

#: the packages whose data files the stored figures depend on
_DATA_PACKAGES = ("autopar.spec", "autopar.cost", "autopar.calibration")
#: significant digits of the predictions the digest covers: far finer than any change of the cost
#: model, far coarser than the last bits numpy may round differently on another CPU
DIGEST_DIGITS = 7


@dataclass
class ValidationReport:
    in_sample: ValidationResult
    cross_validated: ValidationResult | None
    cv_origin: str  # how the cross-validated figures were obtained
    fit: ProfileFit | None
    runs: str  # what was read
    stored_uncertainty: dict | None = None  # the stored points, widening and coverage, when read back
    #: a user's runs priced with the shipped profiles: their coverage is by the shipped intervals
    judged_by_shipped: bool = False
    runs_path: str | None = None  # --runs (None: the bundled tables)
    #: the checks that imitate new ground (autopar.calibration.new_ground); None where not computed
    chronological: ValidationResult | None = None
    families: ValidationResult | None = None
    physics_only: ValidationResult | None = None

    @cached_property
    def memory(self) -> PublishedMemoryResult:
        """The rows' published memory figures against their predictions, and every run's fit check
        (autopar.calibration.memory_published; recomputed, nothing stored)."""
        return compare_published_memory([r.case for r in self.in_sample.rows], load_runs(self.runs_path))

    def _memory_peaks(self) -> list[tuple[str, str, float]]:
        """(row, source, ln(measured / predicted)) of the rows' measured peak-memory figures (a
        device or reserved peak, not an analytic term)."""
        return [
            (c.row_id, c.source, -math.log1p(c.error))
            for c in self.memory.comparisons
            if c.figure.quantity in ("reserved", "device") and c.error > -1
        ]

    @cached_property
    def _uncertainty(self) -> dict | None:
        return self._compute_uncertainty()

    def uncertainty(self) -> dict | None:
        """The calibration points of the held-out errors, the fitted widening per support gap and
        the coverage of the 80 % interval per category (autopar.calibration.uncertainty), or None
        without cross-validated figures; computed once."""
        return self._uncertainty

    def _compute_uncertainty(self) -> dict | None:
        """The calibration points of the held-out errors, the fitted widening per support gap and
        the coverage of the 80 % interval per category (autopar.calibration.uncertainty), or None without
        cross-validated figures."""
        if self.stored_uncertainty is not None:
            return self.stored_uncertainty
        if self.judged_by_shipped:
            points = [calibration_point(r.case, r.error) for r in self.in_sample.rows if not r.case.dropless]
            return {
                "level": LEVEL,
                "method": "your runs inside the shipped profiles' intervals (the model never saw them)",
                "coverage": coverage_against(points, support_points()),
            }
        if self.cross_validated is None:
            return None
        points = [calibration_point(r.case, r.error) for r in self.cross_validated.rows if not r.case.dropless]
        widening = fit_widening(points)
        new_source = fit_new_source(points, widening)
        peaks = self._memory_peaks()
        memory = [(s, r) for _, s, r in peaks]
        memory_new_source = fit_memory_new_source(memory)
        margin = fit_paired_margin(points)
        return {
            "level": LEVEL,
            "widening": widening,
            "new_source_widening": dict(new_source),
            "memory_new_source_widening": dict(memory_new_source),
            "method": "leave-one-source-out: each run inside the interval the other sources give it, "
            "its band and widenings fitted without its source",
            "coverage": nested_coverage(points) | {"peak memory": nested_memory_coverage(memory)},
            "coverage_on_new_ground": self._new_ground_coverage(),
            "paired_margin": None if margin is None else margin.to_dict(),
            "paired_margin_coverage": margin_coverage(points),
            "points": [p.to_dict() for p in points],
            "memory_residuals": [{"row_id": i, "source": s, "residual": r} for i, s, r in peaks],
        }

    def _new_ground_coverage(self) -> dict:
        """Per check that imitates new ground, the share of runs inside the interval the model would
        give them there: leave one group out (each run judged by the intervals the other groups'
        held-out residuals give), chronological (the later runs, predicted by the earlier fit, judged
        by the intervals the earlier sources' leave-one-source-out residuals give)."""
        out: dict = {}
        if self.families is not None:
            pts = [calibration_point(r.case, r.error) for r in self.families.rows if not r.case.dropless]
            out["leave one group out"] = nested_coverage(pts, by_group)
        if self.chronological is not None and self.cross_validated is not None:
            later = {r.case.row_id for r in self.chronological.rows}
            earlier = [
                calibration_point(r.case, r.error)
                for r in self.cross_validated.rows
                if not r.case.dropless and r.case.row_id not in later
            ]
            widening = fit_widening(earlier)
            support = Support(tuple(earlier), widening, new_source=fit_new_source(earlier, widening))
            pts = [calibration_point(r.case, r.error) for r in self.chronological.rows if not r.case.dropless]
            out["chronological"] = coverage_against(pts, support)
        return out


def current_digest(in_sample: ValidationResult | None = None) -> str:
    """sha256 over what the stored figures depend on, and nothing else:
    - the data: the calibration tables, the spec data files (hardware behaviour, the constants
      table, models, GPUs, trainers) and the profiles' constants (profiles.toml without its
      [provenance] table, which holds the digest);
    - the cost model as the figures see it: every bundled run's prediction (its metric and its
      published-memory figures) with the shipped profiles, to `DIGEST_DIGITS` significant digits;
    - the fit and the intervals: this package's code as its syntax tree, without docstrings.
    So a comment, a docstring or a refactor that moves no prediction needs no refit. `in_sample`:
    the bundled runs already predicted with the shipped profiles."""
    h = hashlib.sha256()
    for package in _DATA_PACKAGES:
        for p in sorted(_walk(resources.files(package)), key=lambda p: p.name):
            if p.name.endswith((".toml", ".csv")):
                data = p.read_bytes()
                if p.name == "profiles.toml":
                    data = _without_provenance(data.decode()).encode()
                h.update(p.name.encode() + b"\0" + data)
    for p in sorted(_walk(resources.files("autopar.calibration")), key=lambda p: p.name):
        if p.name.endswith(".py"):
            h.update(p.name.encode() + b"\0" + _code_without_docs(p.read_text()).encode())
    if in_sample is None:
        in_sample = evaluate_cases(*build_cases(load_runs(None)))
    cases = [r.case for r in in_sample.rows]
    for r in in_sample.rows:
        h.update(f"{r.case.row_id}\0{r.predicted:.{DIGEST_DIGITS}g}\0".encode())
    for m in compare_published_memory(cases, load_runs(None)).comparisons:
        h.update(f"{m.row_id}\0{m.figure.quantity}\0{m.predicted_gib:.{DIGEST_DIGITS}g}\0".encode())
    return h.hexdigest()


def _code_without_docs(source: str) -> str:
    """A module's syntax tree without its docstrings (comments are not in the tree)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[0] = ast.Pass()
    return ast.dump(tree)


def _walk(root):
    for p in root.iterdir():
        if p.is_dir() and p.name != "__pycache__":
            yield from _walk(p)
        elif p.is_file():
            yield p


def _without_provenance(text: str) -> str:
    out, skip = [], False
    for line in text.splitlines():
        if line.startswith("["):
            skip = line.strip() == "[provenance]"
        if not skip:
            out.append(line)
    return "\n".join(out)


def validate_runs(
    runs: str | None = None,
    trainer: str | None = None,
    fit: bool = False,
    progress: Callable[[str], None] | None = None,
    no_row: Callable[[str | None, list], str] | None = None,
    cross_validate: bool = False,
) -> ValidationReport:
    """The leave-one-source-out figures are recomputed for the bundled runs when refitting or when
    the stored ones are for other code or data (their digest), else read back; for a user's runs
    only with `cross_validate` (one fit per source). `no_row(runs, skipped)`: the line for --fit
    when no row can be evaluated (exit 2)."""
    cases, skipped = build_cases(load_runs(runs))
    if fit and not cases:
        raise InputError(no_row(runs, skipped) if no_row else "--fit has no row to fit")
    if trainer is not None:
        prof = get_trainer(trainer).profile
        cases = [c for c in cases if profile_of(c.plan.trainer).name == prof]
        if not cases:
            raise InputError(
                f"no run of {runs or 'the bundled tables'} is priced with {trainer}'s profile; "
                f"drop --trainer or pass --runs with runs of that trainer"
            )
    batch = CaseBatch.of(cases) if cases else None  # every case priced once, for each evaluation below
    fitted = fit_profiles(cases) if fit else None
    in_sample = evaluate_cases(cases, skipped, fitted.constants if fitted else None, batch=batch)
    what = runs or f"the bundled calibration runs ({BUNDLED_ROWS})"
    physics = physics_only(cases, skipped, batch)
    stored = _stored_result(in_sample) if runs is None and not fit and trainer is None else None
    if stored is not None:
        return ValidationReport(
            in_sample,
            stored,
            "stored with the shipped profiles (their digest is this code's and data's)",
            None,
            what,
            (stored_figures() or {}).get("uncertainty"),
            chronological=_stored_check(in_sample, "chronological"),
            families=_stored_check(in_sample, "families"),
            physics_only=physics,
        )
    if runs is not None and not cross_validate:
        origin = "not computed for your runs: add --cross-validate (one fit per source)"
        return ValidationReport(
            in_sample, None, origin, fitted, what, judged_by_shipped=not fit, runs_path=runs, physics_only=physics
        )
    cv = leave_one_source_out(cases, skipped, progress)
    origin = "recomputed: every source predicted by the profiles fitted to all the others"
    return ValidationReport(
        in_sample,
        cv,
        origin,
        fitted,
        what,
        runs_path=runs,
        chronological=chronological(cases, skipped),
        families=leave_one_group_out(cases, skipped, progress),
        physics_only=physics,
    )


def _stored_result(in_sample: ValidationResult) -> ValidationResult | None:
    """The stored leave-one-source-out rows, if they were computed with this data, these
    predictions and this fit (the digest of the bundled runs `in_sample`)."""
    stored = stored_figures()
    if stored is None or stored.get("digest") != current_digest(in_sample):
        return None
    rows = stored["rows"]
    cases = [r.case for r in in_sample.rows]
    if {c.row_id for c in cases} != set(rows):
        return None
    return ValidationResult(
        [RowResult(c, rows[c.row_id]["predicted"], rows[c.row_id]["error"]) for c in cases],
        in_sample.skipped,
        "leave-one-source-out",
    )


def _stored_check(in_sample: ValidationResult, name: str) -> ValidationResult | None:
    """A new-ground check's stored rows (`write_profiles`), read with the stored leave-one-source-out
    ones (whose digest `_stored_result` checked)."""
    check = ((stored_figures() or {}).get("new_ground") or {}).get(name)
    if not check:
        return None
    rows = check["rows"]
    cases = [r.case for r in in_sample.rows if r.case.row_id in rows]
    return ValidationResult(
        [RowResult(c, rows[c.row_id]["predicted"], rows[c.row_id]["error"]) for c in cases],
        in_sample.skipped,
        check["method"],
    )


def leave_one_source_out(cases: list[RunCase], skipped, progress=None) -> ValidationResult:
    """Fit on every source but one, predict that one, for every source."""
    return leave_out(cases, skipped, lambda c: c.source, "leave-one-source-out", progress)


def write_profiles(report: ValidationReport, path: str | Path, command: str, date: str) -> list[Path]:
    """The fitted profiles as a profiles.toml, and its figures (.cv.json) beside it, with the digest."""
    if report.fit is None:
        raise InputError("--write-profiles needs --fit (there is nothing fitted to write)")
    cv = report.cross_validated
    summary = (
        "; ".join(f"{g} {100 * v['mape']:.1f}% over {v['rows']} rows" for g, v in cv.summary()["by_category"].items())
        if cv is not None
        else "not computed (add --cross-validate)"
    )
    out = Path(path)
    # the digest covers the profiles' constants: write them first, then the digest over them
    draft = Provenance(command=command, runs=report.runs, date=date, cross_validation="", digest="")
    _write(out, profiles_toml(report.fit.own(), draft))
    shipped = out.resolve() == Path(str(resources.files("autopar.cost").joinpath("data/profiles.toml"))).resolve()
    if shipped:
        from autopar.cost.profiles import profiles, provenance

        profiles.cache_clear()
        provenance.cache_clear()
        forget_profiles()
    digest = current_digest()
    prov = Provenance(
        command=command,
        runs=report.runs,
        date=date,
        cross_validation=f"leave-one-source-out MAPE: {summary}",
        digest=digest,
    )
    _write(out, profiles_toml(report.fit.own(), prov))
    # the shipped profiles' figures are this package's data; a user's lie beside their profiles
    if shipped:
        cv_path = shipped_path()
    else:
        cv_path = out.with_name(CV_FILE) if out.name == "profiles.toml" else out.with_suffix(".cv.json")
    rows = _row_figures(cv) if cv else {}
    fitted = [
        {"profile": p.profile, "constant": p.name, "prior": p.prior, "low": p.low, "high": p.high, "value": p.value}
        for p in report.fit.parameters
    ]
    new_ground = {
        name: {"method": result.method, "rows": _row_figures(result)}
        for name, result in (("chronological", report.chronological), ("families", report.families))
        if result is not None
    }
    body = {
        "digest": digest,
        "runs": BUNDLED,
        "in_sample": report.in_sample.summary(),
        "cross_validated": cv.summary() if cv else None,
        "fitted": fitted,
        "rows": rows,
        "uncertainty": report.uncertainty(),
        "new_ground": new_ground,
    }
    _write(cv_path, dumps(body, indent=1) + "\n")
    stored_figures.cache_clear()
    support_points.cache_clear()
    return [out, cv_path]


def _row_figures(result: ValidationResult) -> dict[str, dict]:
    return {r.case.row_id: {"source": r.case.source, "predicted": r.predicted, "error": r.error} for r in result.rows}


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as e:
        raise InputError(f"cannot write '{path}' ({e.strerror}); choose a writable path") from None
