"""Checks that imitate ground the model has not seen, beside leave-one-source-out (whose mechanisms
and constants were chosen while looking at it, so its residuals understate a new source's error):

- `chronological`: fit only on sources published before `CUTOFF`, predict the later ones (each
  source's date: autopar.calibration.sources). What a user meets: the next release's runs.
- `leave_one_group_out`: leave out a whole group of sources together (every release of one vendor's
  performance summary, every benchmark file of one trainer team: `Source.group`), fit on the rest.
- `physics_only`: every fitted constant at its prior, no fit at all: what the hardware data and the
  mechanisms explain by themselves.

Each is a ValidationResult, summarised per category as leave-one-source-out is.
"""

from __future__ import annotations

from collections.abc import Callable

from autopar.calibration.case_batch import CaseBatch
from autopar.calibration.profile_fit import fit_profiles, prior_constants
from autopar.calibration.run_cases import RunCase
from autopar.calibration.sources import declared
from autopar.calibration.validation import RowResult, ValidationResult, evaluate_cases

#: the chronological split: fit on what was published before, predict what came after
CUTOFF = "2025-07-01"


def chronological(cases: list[RunCase], skipped, cutoff: str = CUTOFF) -> ValidationResult | None:
    """The sources published on or after `cutoff` predicted by the profiles fitted to those before
    it; None when either side has no dated row (a user's own sources carry no date)."""
    dated = [c for c in cases if declared(c.source).published]
    before = [c for c in dated if declared(c.source).published < cutoff]
    after = [c for c in dated if declared(c.source).published >= cutoff]
    if not before or not after:
        return None
    result = evaluate_cases(after, skipped, fit_profiles(before).constants, method=f"chronological (cutoff {cutoff})")
    return result


def leave_out(
    cases: list[RunCase],
    skipped,
    fold: Callable[[RunCase], str],
    method: str,
    progress: Callable[[str], None] | None = None,
) -> ValidationResult:
    """Fit on every fold but one, predict that one, for every fold (`fold(case)` names a case's)."""
    by_row: dict[str, tuple[float, float]] = {}
    for name in dict.fromkeys(fold(c) for c in cases):
        train = [c for c in cases if fold(c) != name]
        held = [c for c in cases if fold(c) == name]
        if not train:
            continue
        result = evaluate_cases(held, [], fit_profiles(train).constants)
        by_row.update({r.case.row_id: (r.predicted, r.error) for r in result.rows})
        if progress:
            progress(name)
    kept = [c for c in cases if c.row_id in by_row]
    return ValidationResult([RowResult(c, *by_row[c.row_id]) for c in kept], skipped, method)


def leave_one_group_out(
    cases: list[RunCase], skipped, progress: Callable[[str], None] | None = None
) -> ValidationResult:
    """Fit on every group of sources but one, predict that one, for every group."""
    return leave_out(cases, skipped, lambda c: declared(c.source).group, "leave-one-group-out", progress)


def physics_only(cases: list[RunCase], skipped, batch: CaseBatch | None = None) -> ValidationResult:
    """Every case predicted with each fitted constant at its prior (the trainers' kernel facts kept;
    `batch`: the cases already priced)."""
    method = "physics only (every constant at its prior)"
    return evaluate_cases(cases, skipped, prior_constants(), method=method, batch=batch)
