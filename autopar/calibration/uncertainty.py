"""How sure an estimate is: a central 80 % interval around every prediction (step time, tokens/s,
peak memory) and whether the plan stands on calibrated ground.

The method (docs/cost-model.md, "How sure: intervals and support"), chosen to be simple and
checkable rather than clever:

1. Residuals. Every published run's leave-one-group-out error (autopar.calibration.new_ground: its
   throughput predicted by the profiles fitted without its whole group of sources, every release
   of a vendor's summary or every benchmark file of a trainer team), as r = ln(published /
   predicted). Held-out errors, not in-sample ones: an in-sample residual is too small, and a
   leave-one-source-out one too small for a new source (the mechanisms were chosen while looking
   at it; a vendor's next release shares its last one's software).
2. Regime. A plan's residuals are those of the published runs of its regime: performance profile
   x workload (dense / MoE) x context (long or not) x precision x GPU generation. When that holds
   fewer than MIN_RUNS runs the regime is coarsened: profile x workload x context, then workload x
   context, then every run (REGIME_LEVELS).
3. Interval. Symmetric in log space: +-q, q the 80 % empirical quantile of those residuals' sizes
   |r| (numpy's default linear interpolation, Hyndman & Fan 1996 type 7). This is split-conformal
   prediction with the absolute residual as the score (Lei et al. 2018, "Distribution-free
   predictive inference for regression") with the sources as the held-out folds. Symmetric, not the
   10 % and 90 % quantiles, because a new source's error is not on the side of the old ones': the
   MoE runs published before 2025-07 were predicted too slow, the later ones too fast, and the
   quantile band of the earlier ones held 59 % of the later MoE runs where this holds 86 %, at a
   narrower median width (autopar validate's chronological coverage).
4. Support. A plan is "calibrated" when some published run of its profile has everything it does
   at least as far (GAP_NAMES: the workload, long context, precision, GPU generation, TP, PP, CP
   and EP sizes, EP across nodes, sharded data parallelism at its size, the GPU count). Otherwise it
   is "extrapolated", and each gap (at most MAX_GAPS counted) widens the interval by `widening` on
   each side in log space. `widening` is fitted once, when the profiles are regenerated (`make
   profiles`): the 80th percentile of the per-gap widening that the published runs extrapolated
   under leave-one-source-out needed to be covered.
5. New ground. A user's cluster and trainer version are a source the model has not seen, and a
   source errs as a whole (residual = source effect + row noise): the runs of a left-out source
   fall outside the band the other sources give them more often than 1 in 5. Per class of run
   (workload x context) the interval is widened on each side by what a left-out source needs: the
   80th percentile of each run's distance outside its held-out interval, every source weighted
   equally (one draw of the source effect each, however many rows it published):
   `fit_new_source`, stored with the widening.
6. Memory. The 10 % and 90 % quantiles (widened to hold the central prediction; asymmetric: a
   memory model's bias has a physical side, the allocator's reserve above the tensors priced) over
   the measured peak-memory figures of the published runs
   (autopar.calibration.memory_published) of the plan's class of memory stack (every run's when the
   class holds fewer than MIN_RUNS): the memory model has no fitted constant, so its residuals are
   out of sample as they are; widened for a new source as in 5, per class of memory stack (the
   PyTorch stacks' caching allocator and eager buffers against the fused stacks: `memory_class`,
   `fit_memory_new_source`).

7. Ranking. Two plans of one profile share part of their error: the interval of their step-time
   ratio comes from pairs of published runs of one source (autopar.calibration.margin), wider the
   more layout knobs the two plans differ in.

The calibration points (one per published run: its regime, its layout and its residual) are
stored with the profiles in data/profiles.cv.json; `support_points` reads them back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np

from autopar.calibration.margin import PairedMargin
from autopar.calibration.sources import declared
from autopar.calibration.stored_figures import stored_figures
from autopar.calibration.support import (
    GAP_BIT,
    GAP_NAMES,
    LONG_CONTEXT,
    MAX_GAPS,
    CalibrationPoint,
    gap_count,
    gap_words,
    nearest_point,
    point_differences,
    point_gaps,
    reach_of,
    support_gaps,
)
from autopar.cost.profiles import profiles
from autopar.figures import (
    HIGH,
    INTERVAL,
    INTERVAL_FIGURES,
    INTERVAL_LEVEL,
    LOW,
    PEAK_MEMORY_BYTES,
    STEP_TIME_S,
    SUPPORT,
    SUPPORT_GAPS,
    SUPPORT_REASON,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
)
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import DTYPES
from autopar.spec.table import PlanTable
from autopar.spec.trainers import ALL_TRAINERS, get_trainer

#: the interval's level: central, so 10 % of outcomes below and 10 % above
LEVEL = 0.8
QUANTILES = ((1 - LEVEL) / 2, (1 + LEVEL) / 2)
#: fewest runs a regime's band is taken from (an 80 % quantile of fewer is one or two runs' error)
MIN_RUNS = 10
#: regime levels, finest first: the fields of the regime key each keeps
REGIME_LEVELS = (
    ("profile", "workload", "long_context", "dtype", "generation"),
    ("profile", "workload", "long_context"),
    ("workload", "long_context"),
    (),
)


@dataclass(frozen=True)
class Support:
    """The published points a prediction stands on, and the fitted widening per gap."""

    points: tuple[CalibrationPoint, ...]
    widening: float  # log-space widening on each side per support gap
    memory_residuals: tuple[float, ...] = ()  # ln(measured / predicted) of published peak memory
    #: (class of run, log-space widening on each side) for a source the model has not seen
    #: (`fit_new_source`); a class without one takes the largest
    new_source: tuple[tuple[str, float], ...] = ()
    #: the same for peak memory, per class of memory stack (`memory_class`, `fit_memory_new_source`)
    memory_new_source: tuple[tuple[str, float], ...] = ()
    #: the memory-stack class of each memory residual (`memory_class`; empty: one class)
    memory_classes: tuple[str, ...] = ()
    #: the error model of two plans' step-time ratio (autopar.calibration.margin); None: not fitted
    margin: PairedMargin | None = None

    def __hash__(self) -> int:
        """Hashed once (a search looks its bands up for every chunk of plans; the points are many)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(
                (
                    self.points,
                    self.widening,
                    self.memory_residuals,
                    self.new_source,
                    self.memory_new_source,
                    self.memory_classes,
                    self.margin,
                )
            )
            object.__setattr__(self, "_hash", h)
        return h

    def new_source_widening(self, workload: str, long_context: bool) -> float:
        """The log widening on each side a new source of this class of run needs."""
        return _class_widening(self.new_source, run_class(workload, long_context))

    def memory_new_source_widening(self, stack_class: str) -> float:
        """The log widening on each side of the memory band a new source of this stack class needs."""
        return _class_widening(self.memory_new_source, stack_class)


def _class_widening(fitted: tuple[tuple[str, float], ...], klass: str) -> float:
    """A class's fitted widening; a class without one takes the largest (0 with none fitted)."""
    return dict(fitted).get(klass, max((w for _, w in fitted), default=0.0))


def memory_class(stack: str | None) -> str:
    """The class of memory stack a peak-memory widening is fitted per: "torch" for the PyTorch
    stacks (torchtitan, FSDP, the built-in model: caching-allocator reserves, eager buffers),
    "fused" for the rest (Megatron-Core, NeMo, DeepSpeed, nanotron, Meta's 4D)."""
    return "torch" if (stack or "").startswith("torch") else "fused"


def source_memory_class(source: str) -> str:
    """The memory-stack class of a published run's source (autopar.calibration.sources)."""
    from autopar.calibration.sources import FAMILY_STACK

    d = declared(source)
    return memory_class(d.stack or FAMILY_STACK.get(source, ""))


def run_class(workload: str, long_context: bool) -> str:
    """The class of run the new-source widening is fitted per: "dense", "moe long" ..."""
    return workload + (" long" if long_context else "")


@dataclass(frozen=True)
class RegimeBand:
    """The residual band of a regime: the band a prediction of it falls in, before widening."""

    name: str  # "megatron dense bf16 hopper"
    runs: int
    low: float  # ln(true / predicted) at its low end (-q: `_symmetric_band`)
    high: float  # at its high end (+q)


@cache
def support_points() -> Support:
    """The shipped profiles' calibration points (data/profiles.cv.json), or none."""
    stored = stored_figures() or {}
    u = stored.get("uncertainty") or {}
    points = tuple(
        CalibrationPoint(**(p | {"categories": tuple(p.get("categories", ()))})) for p in u.get("points", [])
    )
    memory = tuple(float(m["residual"]) for m in u.get("memory_residuals", []))
    classes = tuple(source_memory_class(str(m.get("source", ""))) for m in u.get("memory_residuals", []))
    new_source = _class_pairs(u.get("new_source_widening"))
    memory_new = _class_pairs(u.get("memory_new_source_widening"))
    margin = PairedMargin(**u["paired_margin"]) if u.get("paired_margin") else None
    return Support(points, float(u.get("widening", 0.0)), memory, new_source, memory_new, classes, margin)


def _class_pairs(stored) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((str(c), float(w)) for c, w in (stored or {}).items()))


def _symmetric_band(values: Iterable[float]) -> tuple[float, float]:
    """(-q, q), q the LEVEL quantile of the residuals' sizes |r| (the split-conformal band)."""
    q = float(np.quantile(np.abs(np.fromiter(values, float)), LEVEL))
    return -q, q


def _quantiles(values: Iterable[float]) -> tuple[float, float]:
    v = np.fromiter(values, float)
    lo, hi = np.quantile(v, QUANTILES)
    return min(float(lo), 0.0), max(float(hi), 0.0)


@lru_cache(maxsize=1024)  # a search asks it for every chunk of plans, with few distinct questions
def regime_band(support: Support, profile: str, workload: str, long_context: bool, dtype: str, generation: str):
    """The finest regime (REGIME_LEVELS) holding at least MIN_RUNS points, and its band."""
    want = {
        "profile": profile,
        "workload": workload,
        "long_context": long_context,
        "dtype": dtype,
        "generation": generation,
    }
    for level in REGIME_LEVELS:
        key = tuple(want[f] for f in level)
        mine = [p.residual for p in support.points if p.regime(level) == key]
        if len(mine) >= MIN_RUNS or not level:
            if not mine:
                return RegimeBand("no published run", 0, -math.inf, math.inf)
            return RegimeBand(_regime_name(want, level), len(mine), *_symmetric_band(mine))
    raise AssertionError("the last regime level takes every point")


def _regime_name(want: dict, level: Sequence[str]) -> str:
    parts = []
    for f in level:
        v = want[f]
        if f == "long_context":
            parts.append("long context" if v else "short context")
        elif f == "workload":
            parts.append("MoE" if v == "moe" else "dense")
        elif v:
            parts.append(str(v))
    return " ".join(parts) if parts else "every published run"


def interval_columns(
    table: PlanTable,
    est: dict,
    model: ModelSpec,
    cluster: ClusterSpec,
    seq_len: int,
    trainer: str | None = None,
    support: Support | None = None,
) -> dict[str, np.ndarray]:
    """The 80 % intervals and the support of every plan: <figure>_low / _high for step_time_s,
    tokens_per_s, tokens_per_s_per_gpu and peak_memory_bytes, and support_gaps (0: calibrated).
    `trainer`: the trainer that runs every plan (else the table's trainer column)."""
    support = support or support_points()
    n = len(table)
    dtype = np.asarray(table.columns["dtype"], dtype=np.int64)
    low = np.zeros(n)
    high = np.zeros(n)
    gaps = np.zeros(n, dtype=np.int64)
    workload = "moe" if model.moe else "dense"
    long_context = seq_len >= LONG_CONTEXT
    # (trainer code, its rows): the streamed chunks hold one trainer each, taken whole
    memory_widen, m_lo, m_hi = np.zeros(n), np.zeros(n), np.zeros(n)
    groups: list[tuple[int, slice | np.ndarray]] = []
    if n and trainer:
        groups = [(ALL_TRAINERS.index(trainer), slice(None))]
    elif n:
        codes = np.asarray(table.columns["trainer"], dtype=np.int64)
        present = np.flatnonzero(np.bincount(codes))
        groups = [(int(present[0]), slice(None))] if len(present) == 1 else [(int(t), codes == t) for t in present]
    for t, rows in groups:
        profile = get_trainer(ALL_TRAINERS[t]).profile
        stack_class = memory_class(profiles()[profile].memory_stack)
        memory_widen[rows] = support.memory_new_source_widening(stack_class)
        m_lo[rows], m_hi[rows] = _memory_band(support, stack_class)
        gaps[rows] = support_gaps(table.columns, model, cluster, seq_len, reach_of(profile, support), dtype, rows)
        mine = dtype[rows]
        kinds = np.flatnonzero(np.bincount(mine, minlength=len(DTYPES)))
        for d in kinds:
            band = regime_band(support, profile, workload, long_context, DTYPES[d], cluster.gpu.generation)
            if len(kinds) == 1:
                at = rows
            else:  # the rows of this dtype among the trainer's (all of the table's, or a mask)
                at = np.flatnonzero(rows)[mine == d] if isinstance(rows, np.ndarray) else mine == d
            new = support.new_source_widening(workload, long_context)
            low[at], high[at] = band.low - new, band.high + new
    # ln(true / predicted) of throughput lies in [low - widen, high + widen]: the factors
    # exp(low), exp(high) of the band and exp(widen) per gap count (a few values, not one per plan)
    up = np.exp(support.widening * np.arange(MAX_GAPS + 1))[gap_count(gaps)]
    lo_f, hi_f = np.exp(low) / up, np.exp(high) * up
    out: dict[str, np.ndarray] = {SUPPORT_GAPS: gaps}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for name in (TOKENS_PER_S, TOKENS_PER_S_PER_GPU):
            if name in est:
                out[LOW[name]] = est[name] * lo_f
                out[HIGH[name]] = est[name] * hi_f
        out[LOW[STEP_TIME_S]], out[HIGH[STEP_TIME_S]] = est[STEP_TIME_S] / hi_f, est[STEP_TIME_S] / lo_f
        out[LOW[PEAK_MEMORY_BYTES]] = est[PEAK_MEMORY_BYTES] * (np.exp(m_lo - memory_widen) / up)
        out[HIGH[PEAK_MEMORY_BYTES]] = est[PEAK_MEMORY_BYTES] * (np.exp(m_hi + memory_widen) * up)
    return out


def _memory_band(support: Support, stack_class: str) -> tuple[float, float]:
    """The measured peaks' 10 % and 90 % quantiles (before a stack's new-source widening): those of
    the stack's class when it has MIN_RUNS of them, else of every class."""
    mine = [r for r, c in zip(support.memory_residuals, support.memory_classes) if c == stack_class]
    pool = mine if len(mine) >= MIN_RUNS else list(support.memory_residuals)
    if len(pool) < MIN_RUNS:
        return -math.inf, math.inf
    return _quantiles(pool)


#: the interval and support columns interval_columns adds (plans.parquet, the search's frames)
INTERVAL_COLUMNS = tuple(b[f] for f in INTERVAL_FIGURES for b in (LOW, HIGH)) + (SUPPORT_GAPS,)


def support_text(
    gaps: int, plan, model: ModelSpec, cluster: ClusterSpec, seq_len: int, support: Support | None = None
) -> tuple[str, str]:
    """("calibrated" | "extrapolated", why): the gaps in words against the profile's published runs,
    with the nearest published run, e.g. ("extrapolated", "no megatron run with ZeRO-3 beyond dp 64;
    nearest run: 12 (Llama-2-70B tp4.pp4.dp16 on 256 x h100-sxm)")."""
    support = support or support_points()
    trainer = get_trainer(plan.trainer)
    reach = reach_of(trainer.profile, support)
    band = regime_band(
        support,
        trainer.profile,
        "moe" if model.moe else "dense",
        seq_len >= LONG_CONTEXT,
        plan.dtype,
        cluster.gpu.generation,
    )
    on = f"its interval from {band.runs} published runs ({band.name})"
    new = support.new_source_widening("moe" if model.moe else "dense", seq_len >= LONG_CONTEXT)
    pct = 100 * (math.exp(new) - 1)
    if pct >= 0.05:  # a stack the published runs do not include: a user's own, always
        on += f", {pct:.1f} % wider each side for a stack they do not include".replace(".0 %", " %")
    nearest = nearest_point(plan, model, cluster, support.points, trainer.profile, seq_len)
    near = (
        f"nearest run: {nearest.row_id} ({nearest.model} {nearest.layout} on {nearest.num_gpus} x {nearest.gpu})"
        if nearest is not None
        else ""  # no published run at all (no stored figures)
    )
    if not gaps:
        differs = point_differences(nearest, plan, cluster) if nearest is not None else []
        if near:
            near = f"; {near}" + (f", this plan: {', '.join(differs)}" if differs else ", the same layout")
        return support_word(gaps), f"within the published {trainer.profile} runs{near}; {on}"
    words = [gap_words(name, plan, model, cluster, seq_len, reach) for name in GAP_NAMES if gaps & GAP_BIT[name]]
    return "extrapolated", "; ".join(words) + (f"; {near}" if near else "") + f"; {on}"


def by_source(p: CalibrationPoint) -> str:
    """The fold of leave-one-source-out: a run's publication."""
    return p.source


def by_group(p: CalibrationPoint) -> str:
    """The fold of leave-one-group-out: every release of a vendor's summary, every benchmark file
    of a trainer team, together (autopar.calibration.sources)."""
    return declared(p.source).group


def _distance_outside(low: float, high: float, r: float) -> float:
    """How far `r` lies outside [low, high]: 0 inside, and 0 for a band with no published runs
    behind it (unbounded)."""
    miss = max(low - r, r - high, 0.0)
    return miss if math.isfinite(miss) else 0.0


def fit_widening(points: Sequence[CalibrationPoint], fold: Callable[[CalibrationPoint], str] = by_source) -> float:
    """The per-gap log widening that covers 80 % of the points extrapolated when their fold is left
    out: each point's gaps and band are those of the other folds' points."""
    needed = []
    for p in points:
        rest = Support(tuple(q for q in points if fold(q) != fold(p)), 0.0)
        count = point_gaps(p, rest.points)
        if not count:
            continue
        band = regime_band(rest, p.profile, p.workload, p.long_context, p.dtype, p.generation)
        needed.append(_distance_outside(band.low, band.high, p.residual) / count)
    return float(np.quantile(needed, LEVEL)) if needed else 0.0


def fit_new_source(
    points: Sequence[CalibrationPoint], widening: float, fold: Callable[[CalibrationPoint], str] = by_source
) -> tuple[tuple[str, float], ...]:
    """Per class of run (`run_class`), the log widening on each side a left-out fold needs beyond
    the band and the gap widening the other folds give it: the 80th percentile of each run's
    distance outside that interval (0 inside), every fold weighted equally (a source is one draw
    of the source effect, however many rows it published)."""
    misses: dict[str, list[tuple[str, float]]] = {}
    for p in points:
        rest = Support(tuple(q for q in points if fold(q) != fold(p)), widening)
        band = regime_band(rest, p.profile, p.workload, p.long_context, p.dtype, p.generation)
        w = widening * point_gaps(p, rest.points)
        miss = _distance_outside(band.low - w, band.high + w, p.residual)
        misses.setdefault(run_class(p.workload, p.long_context), []).append((fold(p), miss))
    return tuple(sorted((c, _fold_weighted_quantile(m, LEVEL)) for c, m in misses.items()))


def _fold_weighted_quantile(values: Sequence[tuple[str, float]], q: float) -> float:
    """The q quantile (the smallest value whose cumulative weight reaches q) of (fold, value) pairs,
    each fold's values sharing one unit of weight."""
    per_fold: dict[str, int] = {}
    for f, _ in values:
        per_fold[f] = per_fold.get(f, 0) + 1
    pairs = sorted((v, 1.0 / per_fold[f]) for f, v in values)
    v = np.array([x for x, _ in pairs])
    cum = np.cumsum([w for _, w in pairs]) / len(per_fold)
    return float(v[min(int(np.searchsorted(cum, q - 1e-12)), len(v) - 1)])


def coverage(
    points: Sequence[CalibrationPoint],
    widening: float,
    fold: Callable[[CalibrationPoint], str] = by_source,
    new_source: tuple[tuple[str, float], ...] = (),
) -> dict[str, dict]:
    """Per category, the share of published runs whose published value falls inside the 80 %
    interval built from the other folds' points (leave-one-source-out by default), widened for a
    new source by `new_source` (`fit_new_source`)."""
    return _shares(
        (p, interval_of(p, Support(tuple(q for q in points if fold(q) != fold(p)), widening, new_source=new_source)))
        for p in points
    )


def nested_coverage(
    points: Sequence[CalibrationPoint], fold: Callable[[CalibrationPoint], str] = by_source
) -> dict[str, dict]:
    """`coverage` with nothing of a run's own fold in its interval: each fold's runs judged by the
    band, gap widening and new-source widening fitted on the other folds' points alone. The fitted
    widenings of `coverage` have seen the fold they judge (a fold whose miss sets the new-source
    quantile lands inside by construction); this is how a source the model has not seen fares."""
    intervals = []
    for name in dict.fromkeys(fold(p) for p in points):
        rest = [q for q in points if fold(q) != name]
        widening = fit_widening(rest, fold)
        support = Support(tuple(rest), widening, new_source=fit_new_source(rest, widening, fold))
        intervals += [(p, interval_of(p, support)) for p in points if fold(p) == name]
    return _shares(intervals)


def coverage_against(points: Sequence[CalibrationPoint], support: Support) -> dict[str, dict]:
    """Per category, the share of runs (their errors under the shipped profiles) inside the
    intervals the shipped support gives them: how a set of runs the model never saw judges it.
    Runs of one regime and layout share their band and gaps (computed once: a user's table of
    10,000 runs repeats a few hundred layouts)."""
    gaps: dict[tuple, int] = {}

    def gaps_of(p: CalibrationPoint) -> int:
        key = _layout_key(p)
        if key not in gaps:
            gaps[key] = point_gaps(p, support.points)
        return gaps[key]

    return _shares((p, interval_of(p, support, gaps_of(p))) for p in points)


def _layout_key(p: CalibrationPoint) -> tuple:
    """What a point's band and support gaps depend on: its regime and its layout."""
    return (p.profile, p.workload, p.long_context, p.dtype, p.generation, p.tp, p.pp, p.cp, p.ep) + (
        p.ep_cross_node,
        p.zero_stage,
        p.dp,
        p.num_gpus,
    )


def interval_of(p: CalibrationPoint, support: Support, gaps: int | None = None) -> tuple[float, float]:
    """The log-space interval [low, high] of ln(true / predicted) that `support` gives a run's regime
    and layout (`gaps`: its support gaps, when already counted)."""
    band = regime_band(support, p.profile, p.workload, p.long_context, p.dtype, p.generation)
    w = support.widening * (point_gaps(p, support.points) if gaps is None else gaps)
    w += support.new_source_widening(p.workload, p.long_context)
    return band.low - w, band.high + w


def inside(p: CalibrationPoint, support: Support, gaps: int | None = None) -> bool:
    """Whether a run's residual falls inside the interval `support` gives its regime and layout."""
    low, high = interval_of(p, support, gaps)
    return low <= p.residual <= high


def _shares(intervals: Iterable[tuple[CalibrationPoint, tuple[float, float]]]) -> dict[str, dict]:
    """{category: {rows, covered, covered_by_source, sources, median_width}} of (point, its log
    interval) pairs, every run in "all rows" too: `covered` counts runs, `covered_by_source` weighs
    each source equally (what a new source, one draw of the source effect `fit_new_source` fits, can
    expect); a width is exp(high) - exp(low) (0.3: the interval spans 30 % of the estimate)."""
    by: dict[str, dict[str, list[tuple[bool, float]]]] = {}
    for p, (low, high) in intervals:
        with np.errstate(over="ignore"):
            cell = (bool(low <= p.residual <= high), float(np.exp(high) - np.exp(low)))
        for c in (*p.categories, "all rows"):
            by.setdefault(c, {}).setdefault(p.source, []).append(cell)
    out = {}
    for c, per in by.items():
        runs = [x for v in per.values() for x in v]
        out[c] = {"rows": len(runs), "covered": float(np.mean([hit for hit, _ in runs]))}
        out[c]["covered_by_source"] = float(np.mean([np.mean([hit for hit, _ in v]) for v in per.values()]))
        out[c] |= {"sources": len(per), "median_width": float(np.median([w for _, w in runs]))}
    return out


def _memory_misses(
    residuals: Sequence[tuple[str, float]], class_of: Callable[[str], str] = source_memory_class
) -> list[tuple[str, float]]:
    """(source, how far its figure falls outside the memory band of the other sources' figures: of
    its stack class when they hold MIN_RUNS, else of every class)."""
    out = []
    for source, r in residuals:
        rest = [(class_of(s), x) for s, x in residuals if s != source]
        mine = [x for c, x in rest if c == class_of(source)]
        pool = mine if len(mine) >= MIN_RUNS else [x for _, x in rest]
        lo, hi = _quantiles(pool) if len(pool) >= MIN_RUNS else (-math.inf, math.inf)
        out.append((source, _distance_outside(lo, hi, r)))
    return out


def fit_memory_new_source(
    residuals: Sequence[tuple[str, float]], class_of: Callable[[str], str] = source_memory_class
) -> tuple[tuple[str, float], ...]:
    """Per class of memory stack (`class_of` a source), the log widening on each side of the memory
    band that a left-out source needs (as `fit_new_source` for throughput, over the measured peaks:
    (source, ln(measured / predicted)) pairs)."""
    by: dict[str, list[tuple[str, float]]] = {}
    for source, miss in _memory_misses(residuals, class_of):
        by.setdefault(class_of(source), []).append((source, miss))
    return tuple(sorted((c, _fold_weighted_quantile(m, LEVEL)) for c, m in by.items()))


def memory_coverage(
    residuals: Sequence[tuple[str, float]],
    new_source: tuple[tuple[str, float], ...] = (),
    class_of: Callable[[str], str] = source_memory_class,
) -> dict:
    """The share of measured peak-memory figures inside the memory interval built from the other
    sources' figures ((source, ln(measured / predicted)) pairs), widened by their stack class's
    `new_source` widening."""
    hits = [miss <= _class_widening(new_source, class_of(s)) for s, miss in _memory_misses(residuals, class_of)]
    return {"rows": len(hits), "covered": float(np.mean(hits)) if hits else math.nan}


def nested_memory_coverage(
    residuals: Sequence[tuple[str, float]], class_of: Callable[[str], str] = source_memory_class
) -> dict:
    """`memory_coverage` with nothing of a source in its own interval: each source's figures judged
    by the band of the other sources' figures widened by the new-source widening fitted on those
    other sources alone (as `nested_coverage` for throughput)."""
    misses = _memory_misses(residuals, class_of)
    hits = []
    for name in dict.fromkeys(s for s, _ in residuals):
        fitted = fit_memory_new_source([(s, r) for s, r in residuals if s != name], class_of)
        hits += [m <= _class_widening(fitted, class_of(name)) for s, m in misses if s == name]
    return {"rows": len(hits), "covered": float(np.mean(hits)) if hits else math.nan}


def conformal_half_width(residuals: Sequence[float]) -> float | None:
    """The half-width of the 80 % band of a new residual exchangeable with these n (split conformal
    on |r|, Lei et al. 2018: the ceil((n + 1) x 0.8)-th smallest |r|), or None when n is too small
    for one (fewer than 4). What a calibration on measured trials leaves of the model's error."""
    r = np.sort(np.abs(np.fromiter(residuals, float)))
    k = math.ceil((len(r) + 1) * LEVEL)
    return float(r[k - 1]) if 1 <= k <= len(r) else None


def support_word(gaps: int) -> str:
    """ "calibrated" (no support gap) or "extrapolated"."""
    return "calibrated" if int(gaps) == 0 else "extrapolated"


def interval_fields(row, reason: str | None = None) -> dict:
    """A plan's intervals and support as the `--json` fields of `estimate`, of the search's plans and
    of the measured stage's candidates: <figure>_interval ([low, high]), interval_level, support, and
    support_reason when given; `row` maps interval_columns' names to one plan's values."""
    out: dict = {INTERVAL[f]: [float(row[LOW[f]]), float(row[HIGH[f]])] for f in INTERVAL_FIGURES}
    out |= {INTERVAL_LEVEL: LEVEL, SUPPORT: support_word(row[SUPPORT_GAPS])}
    return out | ({SUPPORT_REASON: reason} if reason is not None else {})
