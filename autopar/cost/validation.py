"""Predict published runs and compare: per-row error, MAPE per category, per family and per source,
in sample and leave-one-source-out cross-validated (fit on every source but one, predict that one;
the cross-validated figure is the headline: an in-sample figure is not a result)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from autopar.cost.price import prepare, price
from autopar.cost.profiles import profile_of, profiles
from autopar.cost.run_cases import RunCase
from autopar.spec.hardware import CostConstants
from autopar.spec.table import PlanTable

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


def priced(case: RunCase, constants: dict[str, CostConstants] | None):
    """The case's cluster priced with its trainer's profile, or with the given constants (profile
    name -> constants: a fit in progress)."""
    prof = profiles()[case.profile] if case.profile else profile_of(case.plan.trainer)
    cluster = replace(
        case.cluster, constants=(constants or {}).get(prof.name, prof.constants), training_stack=prof.memory_stack
    )
    if case.kernel_overrides:
        cluster = replace(cluster, constants=replace(cluster.constants, **case.kernel_overrides))
    return cluster


def predict(case: RunCase, constants: dict[str, CostConstants] | None = None) -> tuple[float, float]:
    """(predicted value in the row's metric, relative error on throughput). `constants`: profile
    name -> constants to price with (a fit in progress); None = the shipped profiles."""
    cluster = priced(case, constants)
    imbalance = cluster.constants.moe_routing_imbalance if case.dropless else case.routing_imbalance
    if case.prepared is None:
        case.prepared = prepare(
            PlanTable.from_plans([case.plan]),
            case.model,
            case.cluster,
            num_gpus=case.plan.num_gpus,
            seq_len=case.seq_len,
            trainer_capabilities=False,
        )
    cols = price(case.prepared, cluster, imbalance)
    step = float(cols["step_time_s"][0])
    tok_gpu = float(cols["tokens_per_s_per_gpu"][0])
    if case.metric == "tokens/s/GPU":
        return tok_gpu, tok_gpu / case.published - 1
    if case.metric == "step time s":
        return step, case.published / step - 1
    if case.metric == "TFLOP/s/GPU":
        pred = tok_gpu * case.flops_per_token / 1e12
        return pred, pred / case.published - 1
    pred = tok_gpu * case.flops_per_token / (case.cluster.gpu.bf16_tflops * 1e12)  # MFU
    return pred, pred / case.published - 1


def evaluate_cases(
    cases: list[RunCase], skipped, constants: dict[str, CostConstants] | None = None, method: str = "in-sample"
) -> ValidationResult:
    rows = []
    for c in cases:
        pred, err = predict(c, constants)
        rows.append(RowResult(case=c, predicted=pred, error=err))
    return ValidationResult(rows=rows, skipped=skipped, method=method)


@dataclass
class CrossValidation:
    """Leave-one-source-out: each source predicted by the constants fitted on all the others."""

    result: ValidationResult
    folds: dict[str, dict[str, CostConstants]] = field(default_factory=dict)  # held-out source -> fit


def leave_one_source_out(
    cases: list[RunCase],
    skipped,
    fit: Callable[[list[RunCase]], dict[str, CostConstants]],
    progress: Callable[[str], None] | None = None,
) -> CrossValidation:
    """Fit on every source but one and predict that one, for every source."""
    rows: list[RowResult] = []
    folds = {}
    for source in dict.fromkeys(c.source for c in cases):
        if progress:
            progress(source)
        train = [c for c in cases if c.source != source]
        folds[source] = fit(train)
        held = evaluate_cases([c for c in cases if c.source == source], [], folds[source])
        rows += held.rows
    order = {id(c): i for i, c in enumerate(cases)}
    rows.sort(key=lambda r: order[id(r.case)])
    return CrossValidation(result=ValidationResult(rows, skipped, "leave-one-source-out"), folds=folds)
