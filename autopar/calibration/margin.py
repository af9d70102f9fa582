"""How sure the ranking of two plans is: the 80 % interval of the ratio of their step times, from
paired residuals.

Two plans priced by one performance profile share part of their error (the profile's constants,
the GPU's rates), so the model's error on their ratio is that of the difference of two residuals of
one stack, not of either alone. The published runs hold such pairs: runs of one source (one
trainer version, one cluster) of one model on one GPU, at different layouts. For each pair,
d = r_a - r_b (r = ln(published / predicted), the held-out residuals of the calibration points),
and k = how many layout knobs the two runs differ in (PAIR_KNOBS).

Model: d ~ N(0, base^2 + k x per_knob^2): every knob two plans differ in adds an independent share
of error (two plans one knob apart share more of it than two plans five knobs apart). `base` and
`per_knob` by maximum likelihood over the pairs; then `scale`, the 80th percentile of
|d| / sqrt(base^2 + k per_knob^2) with every source weighted equally (a source is one draw of how
its stack errs, however many pairs it published), so that the interval holds for 80 % of the
sources' pairs whatever the shape of the tails. The half-width of the 80 % interval of ln(t_a / t_b)
for plans k knobs apart is then scale x sqrt(base^2 + k per_knob^2).

Plans priced by different profiles share nothing: their difference combines the two plans' own
intervals (`unpaired_half_width`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations

import numpy as np

from autopar.calibration.support import CalibrationPoint

#: the layout knobs two runs (or plans) can differ in, each counted once: the parallel sizes, the
#: interleaving, the micro-batch, what is recomputed, the ZeRO stage, the precision, and the
#: question's sequence length and GPU count (a search's plans share the last two)
PAIR_KNOBS = (
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "dp",
    "micro_batch_size",
    "recompute",
    "zero_stage",
    "dtype",
    "seq_len",
    "num_gpus",
)
#: fewest pairs a margin model is fitted from (two parameters and a quantile)
MIN_PAIRS = 30
#: the interval's level (as the step-time intervals': autopar.calibration.uncertainty.LEVEL)
LEVEL = 0.8


@dataclass(frozen=True)
class PairedMargin:
    """The fitted model of the error on ln(t_a / t_b) of two plans of one profile."""

    base: float  # log-space standard deviation of two plans no knob apart
    per_knob: float  # added in quadrature per knob they differ in
    scale: float  # the 80 % multiplier of the standard deviation (from the pairs, not Gaussian)
    pairs: int  # the published pairs it was fitted on

    def half_width(self, knobs_apart: int) -> float:
        """The half-width, in log space, of the 80 % interval of ln(t_a / t_b)."""
        return self.scale * math.sqrt(self.base**2 + knobs_apart * self.per_knob**2)

    def to_dict(self) -> dict:
        return asdict(self)


def knobs_apart(a: Mapping, b: Mapping) -> int:
    """How many of PAIR_KNOBS two runs or plans differ in (a knob either lacks counts as equal)."""
    return sum(1 for k in PAIR_KNOBS if k in a and k in b and a[k] != b[k])


def _pair_group(p: CalibrationPoint) -> tuple:
    """What two published runs must share to be a pair of one stack."""
    return (p.source, p.model, p.gpu, p.profile)


def residual_pairs(points: Sequence[CalibrationPoint]) -> list[tuple[str, int, float]]:
    """(source, knobs apart, r_a - r_b) of every pair of runs of one source, model, GPU and profile
    that differ in at least their layout's description or a knob."""
    groups: dict[tuple, list[CalibrationPoint]] = {}
    for p in points:
        groups.setdefault(_pair_group(p), []).append(p)
    out = []
    for members in groups.values():
        for a, b in combinations(members, 2):
            da, db = a.to_dict(), b.to_dict()
            out.append((a.source, knobs_apart(da, db), a.residual - b.residual))
    return out


def fit_paired_margin(points: Sequence[CalibrationPoint]) -> PairedMargin | None:
    """The margin model fitted on the points' pairs (the module docstring), or None with fewer than
    MIN_PAIRS pairs."""
    pairs = residual_pairs(points)
    if len(pairs) < MIN_PAIRS:
        return None
    k = np.array([p[1] for p in pairs], dtype=float)
    d = np.array([p[2] for p in pairs])
    # maximum likelihood of (base, per_knob) on a log grid: two parameters, a few hundred pairs
    grid = np.geomspace(1e-3, 1.0, 181)
    var = grid[:, None, None] ** 2 + k[None, None, :] * grid[None, :, None] ** 2
    nll = np.sum(0.5 * np.log(var) + d**2 / (2 * var), axis=2)
    i, j = np.unravel_index(int(np.argmin(nll)), nll.shape)
    base, per_knob = float(grid[i]), float(grid[j])
    z = np.abs(d) / np.sqrt(base**2 + k * per_knob**2)
    scale = _source_weighted_quantile([p[0] for p in pairs], z, LEVEL)
    return PairedMargin(base=base, per_knob=per_knob, scale=scale, pairs=len(pairs))


def _source_weighted_quantile(sources: Sequence[str], values: np.ndarray, q: float) -> float:
    """The q quantile of values, each source's values sharing one unit of weight (the smallest value
    whose cumulative weight reaches q)."""
    count: dict[str, int] = {}
    for s in sources:
        count[s] = count.get(s, 0) + 1
    order = np.argsort(values, kind="stable")
    weights = np.array([1.0 / count[sources[i]] for i in order])
    cum = np.cumsum(weights) / len(count)
    return float(values[order][min(int(np.searchsorted(cum, q - 1e-12)), len(values) - 1)])


def margin_coverage(points: Sequence[CalibrationPoint]) -> dict:
    """Leave one source out: the share of each source's pairs inside the interval the margin model
    fitted on the other sources' pairs gives them, every source weighted equally ({pairs, sources,
    covered}); how the margin holds for a stack it was not fitted on."""
    sources = sorted({p.source for p in points})
    hits: list[tuple[str, bool]] = []
    for s in sources:
        model = fit_paired_margin([p for p in points if p.source != s])
        if model is None:
            continue
        mine = residual_pairs([p for p in points if p.source == s])
        hits += [(s, abs(d) <= model.half_width(k)) for _, k, d in mine]
    if not hits:
        return {"pairs": 0, "sources": 0, "covered": math.nan}
    per: dict[str, list[bool]] = {}
    for s, h in hits:
        per.setdefault(s, []).append(h)
    return {"pairs": len(hits), "sources": len(per), "covered": float(np.mean([np.mean(h) for h in per.values()]))}


def unpaired_half_width(half_a: float, half_b: float) -> float:
    """The half-width of ln(t_a / t_b) for plans of different profiles: their own log half-widths
    combined as independent errors."""
    return math.hypot(half_a, half_b)
