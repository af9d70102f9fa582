"""The error model of two plans' step-time ratio from paired published runs
(autopar.calibration.margin), checked against hand derivations and by recomputing its coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar.calibration import margin as M
from autopar.calibration.support import CalibrationPoint
from tests.calibration.test_uncertainty import point


def _point(source: str, residual: float, **kw) -> CalibrationPoint:
    """A published run of `source` (test_uncertainty's point: megatron, dense, bf16, H100)."""
    return point(0, residual, source=source, **({"model": "m"} | kw))


def test_knobs_apart_counts_each_differing_knob_once() -> None:
    a = {"tp": 4, "pp": 4, "vpp": 8, "dp": 16, "micro_batch_size": 1, "dtype": "bf16", "seq_len": 8192}
    b = a | {"tp": 8, "pp": 2, "vpp": 4}
    assert M.knobs_apart(a, b) == 3
    assert M.knobs_apart(a, a) == 0
    assert M.knobs_apart(a, {"tp": 8}) == 1  # knobs one side lacks count as equal


def test_pairs_are_runs_of_one_source_model_gpu_and_profile() -> None:
    pts = [
        _point("s1", 0.10, tp=1),
        _point("s1", -0.05, tp=2),
        _point("s1", 0.00, tp=2, pp=2),
        _point("s2", 0.30, tp=1),  # another source: no pair with s1's runs
        _point("s1", 0.20, tp=4, model="other"),  # another model
    ]
    pairs = M.residual_pairs(pts)
    # s1's three runs of model m: C(3, 2) = 3 pairs, by hand
    assert {s for s, _, _ in pairs} == {"s1"} and len(pairs) == 3
    diffs = sorted(round(abs(d), 6) for _, _, d in pairs)
    assert diffs == [0.05, 0.10, 0.15]
    ks = sorted(k for _, k, _ in pairs)
    assert ks == [1, 1, 2]  # tp 1 vs 2, tp 2 pp 1 vs pp 2, tp 1 pp 1 vs tp 2 pp 2


def test_too_few_pairs_fit_nothing() -> None:
    pts = [_point("s", 0.01 * i, tp=2**i) for i in range(5)]  # 10 pairs
    assert M.fit_paired_margin(pts) is None


def test_no_knob_apart_the_base_is_the_rms_difference() -> None:
    """With every pair 0 knobs apart the likelihood is that of N(0, base^2), whose maximum is at
    base^2 = mean(d^2) (a hand derivation); the grid resolves it to its step, 10^(3/180) = 3.9 %."""
    rng = np.random.default_rng(3)
    pts = []
    for s in range(8):  # 8 sources x 6 runs = 8 x 15 = 120 pairs, every run of a source the same layout
        pts += [_point(f"s{s}", float(r), row_id=f"s{s}-{i}") for i, r in enumerate(rng.normal(0, 0.1, 6))]
    model = M.fit_paired_margin(pts)
    assert model is not None and model.pairs == 120
    d = np.array([x for _, _, x in M.residual_pairs(pts)])
    assert model.base == pytest.approx(math.sqrt(np.mean(d**2)), rel=0.04)


def test_the_interval_widens_with_the_knobs_apart_and_holds_for_80_percent() -> None:
    """Runs whose error has a share per tp size (a mechanism the model misses at some sizes) and row
    noise: pairs that differ in tp differ more, so the fitted per-knob term is positive and the
    half-width grows with the knobs apart; the scale is the source-weighted 80th percentile, so
    recomputing the share of each source's pairs inside gives 80 % (to one pair's weight)."""
    rng = np.random.default_rng(7)
    pts = []
    for s in range(10):
        by_tp = {tp: rng.normal(0, 0.15) for tp in (1, 2, 4, 8)}
        for i in range(8):
            tp = (1, 2, 4, 8)[i % 4]
            pts.append(_point(f"s{s}", by_tp[tp] + rng.normal(0, 0.03), tp=tp, row_id=f"s{s}-{i}"))
    model = M.fit_paired_margin(pts)
    assert model is not None
    assert model.per_knob > 2 * model.base
    assert model.half_width(0) < model.half_width(1) < model.half_width(3)
    per_source: dict[str, list[bool]] = {}
    for s, k, d in M.residual_pairs(pts):
        per_source.setdefault(s, []).append(abs(d) <= model.half_width(k) * (1 + 1e-9))
    shares = [np.mean(v) for v in per_source.values()]
    assert np.mean(shares) >= 0.8 - 1e-9
    tighter = M.PairedMargin(model.base, model.per_knob, model.scale * 0.97, model.pairs)
    inside = {s: [abs(d) <= tighter.half_width(k) for s2, k, d in M.residual_pairs(pts) if s2 == s] for s in per_source}
    assert np.mean([np.mean(v) for v in inside.values()]) < 0.8  # the scale is the smallest that holds


def test_leave_one_source_out_coverage_recomputed() -> None:
    rng = np.random.default_rng(11)
    pts = []
    for s in range(6):
        pts += [
            _point(f"s{s}", float(r), tp=2 ** (i % 3), row_id=f"s{s}-{i}") for i, r in enumerate(rng.normal(0, 0.1, 6))
        ]
    cov = M.margin_coverage(pts)
    hits = []
    for s in sorted({p.source for p in pts}):
        model = M.fit_paired_margin([p for p in pts if p.source != s])
        mine = M.residual_pairs([p for p in pts if p.source == s])
        hits.append(np.mean([abs(d) <= model.half_width(k) for _, k, d in mine]))
    assert cov["sources"] == 6 and cov["pairs"] == 6 * 15
    assert cov["covered"] == pytest.approx(np.mean(hits))


def test_unpaired_plans_combine_their_own_intervals() -> None:
    assert M.unpaired_half_width(0.03, 0.04) == pytest.approx(0.05)  # 3-4-5
