"""Predict published runs and compare: per-row error, MAPE per category, per family and per source,
in sample and leave-one-source-out cross-validated (fit on every source but one, predict that one;
the cross-validated figure is the headline: an in-sample figure is not a result)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from autopar.calibration.case_batch import CaseBatch, constants_table
from autopar.calibration.run_cases import RunCase
from autopar.spec.hardware import CostConstants

CATEGORIES = ("dense Megatron-family", "FSDP-family", "MoE", "long context")


@dataclass
class RowResult:
    case: RunCase
    predicted: float  # in the row's metric
    error: float  # (predicted - published) / published, on throughput

    def to_dict(self) -> dict:
        c = self.case
        return {
            "row_id": c.row_id,
            "source": c.source,
            "family": c.family,
            "categories": c.categories(),
            "dropless": c.dropless,
            "model": c.name,
            "gpus": c.plan.num_gpus,
            "gpu": c.cluster.gpu.key,
            "layout": c.plan.describe(),
            "trainer": c.plan.trainer,
            "metric": c.metric,
            "published": c.published,
            "predicted": self.predicted,
            "error": self.error,
            "assumptions": c.assumptions,
        }


def mape(errors: Iterable[float]) -> float:
    e = np.abs(np.fromiter(errors, float))
    return float(e.mean()) if e.size else math.nan


@dataclass
class ValidationResult:
    rows: list[RowResult]
    skipped: list[tuple[str, str, str]]  # (row_id, model, reason)
    method: str = "in-sample"  # or "leave-one-source-out"

    @property
    def errors(self) -> np.ndarray:
        return np.array([r.error for r in self.rows])

    @property
    def mape(self) -> float:
        return mape(r.error for r in self.rows)

    @property
    def max_error(self) -> float:
        return float(np.max(np.abs(self.errors))) if self.rows else math.nan

    def grouped(self, key: Callable[[RunCase], Iterable[str]]) -> dict[str, dict]:
        """{group: {rows, mape, max}} with `key(case)` naming the groups a row belongs to."""
        groups: dict[str, list[float]] = {}
        for r in self.rows:
            for g in key(r.case):
                groups.setdefault(g, []).append(r.error)
        return {
            g: {"rows": len(e), "mape": mape(e), "max_abs_error": float(np.max(np.abs(e)))} for g, e in groups.items()
        }

    def summary(self) -> dict:
        primary = [r.error for r in self.rows if not r.case.dropless]
        return {
            "method": self.method,
            "evaluated": len(primary),
            "skipped": len(self.skipped),
            "mape": mape(primary),
            "max_abs_error": float(np.max(np.abs(primary))) if primary else math.nan,
            "dropless_measurements": self.grouped(lambda c: ["dropless"] if c.dropless else []).get("dropless"),
            "by_category": self.grouped(lambda c: c.categories()),
            "by_family": self.grouped(lambda c: [] if c.dropless else [c.family]),
            "by_workload": self.grouped(
                lambda c: [] if c.dropless else [c.workload] + (["long context"] if c.long_context else [])
            ),
            "by_source": self.grouped(lambda c: [] if c.dropless else [c.source]),
        }

    def to_dict(self) -> dict:
        return self.summary() | {
            "rows": [r.to_dict() for r in self.rows],
            "skipped_rows": [{"row_id": i, "model": m, "reason": r} for i, m, r in self.skipped],
        }


def evaluate_cases(
    cases: list[RunCase],
    skipped,
    constants: dict[str, CostConstants] | None = None,
    method: str = "in-sample",
    batch: CaseBatch | None = None,
) -> ValidationResult:
    """Every case predicted with the shipped profiles, or with the given constants (profile name ->
    constants: a fit's), all at once (autopar.calibration.case_batch; `batch`: the cases already
    priced)."""
    if not cases:
        return ValidationResult([], skipped, method)
    pred, err = (batch or CaseBatch.of(cases)).predicted(constants_table(constants or {}))
    rows = [RowResult(case=c, predicted=float(p), error=float(e)) for c, p, e in zip(cases, pred, err)]
    return ValidationResult(rows=rows, skipped=skipped, method=method)
