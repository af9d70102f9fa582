"""The real router's imbalance from the one paired measurement in the published runs
(autopar.spec.routing): for each layout measured with forced-balanced and with real routing
(Megatron-MoE-ModelZoo long-context table), the imbalance that turns the forced-balanced prediction
into the dropless measurement (the ratio of the two published throughputs)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autopar.calibration.case_batch import CaseBatch, constants_table
from autopar.calibration.run_cases import RunCase


def _throughput(case: RunCase, imbalance: float) -> float:
    c = replace(case, routing_imbalance=imbalance, inputs=None, dropless=False)
    batch = CaseBatch.of([c])
    return float(batch.tokens_per_step[0] / batch.step_time(constants_table({}))[0])


def implied_imbalances(cases: list[RunCase]) -> dict[str, float]:
    """row -> the imbalance its dropless measurement implies (bisection in [1, 4])."""
    out = {}
    forced = {c.row_id: c for c in cases if not c.dropless}
    for d in (c for c in cases if c.dropless):
        f = forced[d.row_id.rstrip("d")]
        target = _throughput(f, 1.0) * d.published / f.published
        lo, hi = 1.0, 4.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _throughput(f, mid) > target else (lo, mid)
        out[d.row_id] = (lo + hi) / 2
    return out


def derived_imbalance(cases: list[RunCase]) -> float:
    """The median of the implied imbalances."""
    return float(np.median(list(implied_imbalances(cases).values())))
