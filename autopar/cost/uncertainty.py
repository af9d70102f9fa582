"""How sure an estimate is: a central 80 % interval around every prediction (step time, tokens/s,
peak memory) and whether the plan stands on calibrated ground.

The method (docs/cost-model.md, "How sure: intervals and support"), chosen to be simple and
checkable rather than clever:

1. Residuals. Every published run's leave-one-source-out error (autopar.cost.validate_runs: its
   throughput predicted by the profiles fitted to every other source), as r = ln(published /
   predicted). Held-out errors, not in-sample ones: an in-sample residual is too small.
2. Regime. A plan's residuals are those of the published runs of its regime: performance profile
   x workload (dense / MoE) x context (long or not) x precision x GPU generation. When that holds
   fewer than MIN_RUNS runs the regime is coarsened: profile x workload x context, then workload x
   context, then every run (REGIME_LEVELS).
3. Interval. The 10 % and 90 % empirical quantiles of those residuals (numpy's default linear
   interpolation, Hyndman & Fan 1996 type 7), widened to hold the central prediction. This is the
   split-conformal idea (Lei et al. 2018, "Distribution-free predictive inference for regression")
   with the sources as the held-out folds.
4. Support. A plan is "calibrated" when some published run of its profile has everything it does
   at least as far (SUPPORT_GAPS: the workload, long context, precision, GPU generation, TP, PP,
   CP and EP sizes, EP across nodes, sharded data parallelism at its size, the GPU count).
   Otherwise it is "extrapolated", and each gap (at most MAX_GAPS counted) widens the interval by
   `widening` on each side in log space. `widening` is fitted once, when the profiles are
   regenerated (`make profiles`): the 80th percentile of the per-gap widening that the published
   runs extrapolated under leave-one-source-out needed to be covered.
5. Memory. The same quantiles over the measured peak-memory figures of the published runs
   (autopar.cost.memory_published): the memory model has no fitted constant, so its residuals are
   out of sample as they are.

The calibration points (one per published run: its regime, its layout and its residual) are
stored with the profiles in data/profiles.cv.json; `support_points` reads them back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np

from autopar.cost.collectives import place
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import DTYPES
from autopar.spec.table import PlanTable
from autopar.spec.trainers import ALL_TRAINERS, get_trainer

#: the interval's level: central, so 10 % of outcomes below and 10 % above
LEVEL = 0.8
QUANTILES = ((1 - LEVEL) / 2, (1 + LEVEL) / 2)
#: fewest runs a regime's quantiles are taken from (a 10 % quantile of fewer is one run's error)
MIN_RUNS = 10
#: gaps counted in the widening: beyond three the plan is far from anything measured anyway
MAX_GAPS = 3
#: sequence length from which a run counts as long-context (the validation's categories)
LONG_CONTEXT = 32768
#: regime levels, finest first: the fields of the regime key each keeps
REGIME_LEVELS = (
    ("profile", "workload", "long_context", "dtype", "generation"),
    ("profile", "workload", "long_context"),
    ("workload", "long_context"),
    (),
)
#: what a plan may do beyond every published run of its profile, one bit each
SUPPORT_GAPS = (
    "profile",
    "workload",
    "long_context",
    "dtype",
    "generation",
    "tp",
    "pp",
    "cp",
    "ep",
    "ep_cross_node",
    "sharded_dp",
    "gpus",
)
GAP_BIT = {name: 1 << i for i, name in enumerate(SUPPORT_GAPS)}


@dataclass(frozen=True)
class CalibrationPoint:
    """One published run as the support of the cost model: its regime, its layout and its held-out
    residual ln(published / predicted)."""

    row_id: str
    source: str
    profile: str
    workload: str  # "dense" | "moe"
    long_context: bool
    dtype: str
    generation: str
    gpu: str
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    zero_stage: int
    num_gpus: int
    ep_cross_node: bool
    residual: float
    params: float = 0.0  # the model's parameters
    categories: tuple[str, ...] = ()  # the validation's categories it counts in
    layout: str = ""
    model: str = ""

    def regime(self, level: Sequence[str]) -> tuple:
        return tuple(getattr(self, f) for f in level)

    def to_dict(self) -> dict:
        return asdict(self)


def calibration_point(case, error: float) -> CalibrationPoint:
    """A published run (autopar.cost.run_cases.RunCase) and its held-out relative error on
    throughput, as a calibration point."""
    p, g = case.plan, case.cluster
    ep_nodes = int(place(p.ep, p.etp, g.gpus_per_node).nodes) if case.model.moe else 1
    return CalibrationPoint(
        row_id=case.row_id,
        source=case.source,
        profile=case.profile,
        workload=case.workload,
        long_context=case.seq_len >= LONG_CONTEXT,
        dtype=p.dtype,
        generation=g.gpu.generation,
        gpu=g.gpu.key,
        tp=p.tp,
        pp=p.pp,
        cp=p.cp,
        ep=p.ep,
        dp=p.dp,
        zero_stage=p.zero_stage,
        num_gpus=p.num_gpus,
        ep_cross_node=ep_nodes > 1,
        residual=-math.log1p(error),
        params=float(case.model.params_total),
        categories=tuple(case.categories()),
        layout=p.describe(),
        model=case.name,
    )


@dataclass(frozen=True)
class Support:
    """The published points a prediction stands on, and the fitted widening per gap."""

    points: tuple[CalibrationPoint, ...]
    widening: float  # log-space widening on each side per support gap
    memory_residuals: tuple[float, ...] = ()  # ln(measured / predicted) of published peak memory

    def without_source(self, source: str) -> "Support":
        return Support(tuple(p for p in self.points if p.source != source), self.widening, self.memory_residuals)


@dataclass(frozen=True)
class RegimeBand:
    """The residual quantiles of a regime: the band a prediction of it falls in, before widening."""

    name: str  # "megatron dense bf16 hopper"
    runs: int
    low: float  # ln(true / predicted) at the 10 % quantile (held to <= 0)
    high: float  # at 90 % (held to >= 0)


@cache
def support_points() -> Support:
    """The shipped profiles' calibration points (data/profiles.cv.json), or none."""
    from autopar.cost.validate_runs import stored_figures

    stored = stored_figures() or {}
    u = stored.get("uncertainty") or {}
    points = tuple(CalibrationPoint(**(p | {"categories": tuple(p.get("categories", ()))})) for p in u.get("points", []))
    memory = tuple(float(m["residual"]) for m in u.get("memory_residuals", []))
    return Support(points, float(u.get("widening", 0.0)), memory)


def _quantiles(values: Iterable[float]) -> tuple[float, float]:
    v = np.fromiter(values, float)
    lo, hi = np.quantile(v, QUANTILES)
    return min(float(lo), 0.0), max(float(hi), 0.0)


def regime_band(support: Support, profile: str, workload: str, long_context: bool, dtype: str, generation: str):
    """The finest regime (REGIME_LEVELS) holding at least MIN_RUNS points, and its quantiles."""
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
            return RegimeBand(_regime_name(want, level), len(mine), *_quantiles(mine))
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


@dataclass(frozen=True)
class Reach:
    """How far the published runs of one profile go (the support a plan is checked against)."""

    profile: str
    runs: int
    workloads: frozenset  # (workload, long_context) pairs
    dtypes: frozenset
    generations: frozenset
    tp: int
    pp: int
    cp: int
    ep: int
    ep_cross_node: bool
    sharded_dp: int  # largest dp with sharded states (ZeRO-3 / FSDP); 0: none
    gpus: int

    @classmethod
    def of(cls, profile: str, points: Sequence[CalibrationPoint]) -> "Reach":
        mine = [p for p in points if p.profile == profile]
        moe = [p for p in mine if p.workload == "moe"]
        sharded = [p.dp for p in mine if p.zero_stage >= 3]
        return cls(
            profile=profile,
            runs=len(mine),
            workloads=frozenset((p.workload, p.long_context) for p in mine),
            dtypes=frozenset(p.dtype for p in mine),
            generations=frozenset(p.generation for p in mine),
            tp=max((p.tp for p in mine), default=0),
            pp=max((p.pp for p in mine), default=0),
            cp=max((p.cp for p in mine), default=0),
            ep=max((p.ep for p in moe), default=0),
            ep_cross_node=any(p.ep_cross_node for p in moe),
            sharded_dp=max(sharded, default=0),
            gpus=max((p.num_gpus for p in mine), default=0),
        )


def support_gaps(
    table: PlanTable, model: ModelSpec, cluster: ClusterSpec, seq_len: int, reach: Reach, dtype: np.ndarray
) -> np.ndarray:
    """Per plan, the bitmask of SUPPORT_GAPS it has against `reach` (0: calibrated)."""
    c = table.columns
    crosses = place(c["ep"], c["etp"], cluster.gpus_per_node).nodes > 1
    return _gaps(
        reach,
        "moe" if model.moe else "dense",
        seq_len >= LONG_CONTEXT,
        cluster.gpu.generation,
        np.asarray(DTYPES, dtype=object)[dtype],
        c["tp"],
        c["pp"],
        c["cp"],
        c["ep"],
        crosses,
        c["zero_stage"],
        c["dp"],
        table.num_gpus,
    )


def _gaps(reach: Reach, workload, long_context, generation, dtype, tp, pp, cp, ep, ep_cross, zero, dp, gpus):
    """The gap bitmask of layouts (arrays) of one workload, context and GPU generation."""
    n = len(tp)
    gaps = np.zeros(n, dtype=np.int64)
    if reach.runs == 0:
        return gaps | GAP_BIT["profile"]
    if (workload, long_context) not in reach.workloads:
        kind = "long_context" if long_context and any(w == workload for w, _ in reach.workloads) else "workload"
        gaps |= GAP_BIT[kind]
    gaps |= np.where(np.isin(dtype, list(reach.dtypes)), 0, GAP_BIT["dtype"])
    if not generation or generation not in reach.generations:
        gaps |= GAP_BIT["generation"]
    for name, size in (("tp", tp), ("pp", pp), ("cp", cp)):
        gaps |= np.where(np.asarray(size) > getattr(reach, name), GAP_BIT[name], 0)
    if workload == "moe":
        gaps |= np.where(np.asarray(ep) > reach.ep, GAP_BIT["ep"], 0)
        if not reach.ep_cross_node:
            gaps |= np.where(ep_cross, GAP_BIT["ep_cross_node"], 0)
    sharded = np.asarray(zero) >= 3
    gaps |= np.where(sharded & (np.asarray(dp) > reach.sharded_dp), GAP_BIT["sharded_dp"], 0)
    gaps |= np.where(np.asarray(gpus) > reach.gpus, GAP_BIT["gpus"], 0)
    return gaps


def gap_count(gaps: np.ndarray) -> np.ndarray:
    """Support gaps per plan (bits set), at most MAX_GAPS."""
    g = np.asarray(gaps, dtype=np.int64)
    count = np.zeros(g.shape, dtype=np.int64)
    for bit in GAP_BIT.values():
        count += (g & bit) > 0
    return np.minimum(count, MAX_GAPS)


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
    trainer_codes = (
        np.full(n, ALL_TRAINERS.index(trainer), dtype=np.int64) if trainer else table.columns["trainer"].astype(int)
    )
    dtype = table.columns["dtype"].astype(np.int64)
    low = np.zeros(n)
    high = np.zeros(n)
    gaps = np.zeros(n, dtype=np.int64)
    workload = "moe" if model.moe else "dense"
    long_context = seq_len >= LONG_CONTEXT
    for t in np.unique(trainer_codes) if n else ():
        rows_t = trainer_codes == t
        profile = get_trainer(ALL_TRAINERS[t]).profile
        reach = Reach.of(profile, support.points)
        gaps[rows_t] = support_gaps(table.take(np.flatnonzero(rows_t)), model, cluster, seq_len, reach, dtype[rows_t])
        for d in np.unique(dtype[rows_t]):
            rows = rows_t & (dtype == d)
            band = regime_band(support, profile, workload, long_context, DTYPES[d], cluster.gpu.generation)
            low[rows], high[rows] = band.low, band.high
    widen = support.widening * gap_count(gaps)
    low, high = low - widen, high + widen  # ln(true / predicted) of throughput
    out = {"support_gaps": gaps}
    with np.errstate(over="ignore", invalid="ignore"):
        for name in ("tokens_per_s", "tokens_per_s_per_gpu"):
            if name in est:
                out[f"{name}_low"] = est[name] * np.exp(low)
                out[f"{name}_high"] = est[name] * np.exp(high)
        out["step_time_s_low"] = est["step_time_s"] * np.exp(-high)
        out["step_time_s_high"] = est["step_time_s"] * np.exp(-low)
        m_lo, m_hi = _memory_band(support)
        m_widen = support.widening * gap_count(gaps)
        out["peak_memory_bytes_low"] = est["peak_memory_bytes"] * np.exp(m_lo - m_widen)
        out["peak_memory_bytes_high"] = est["peak_memory_bytes"] * np.exp(m_hi + m_widen)
    return out


def _memory_band(support: Support) -> tuple[float, float]:
    if len(support.memory_residuals) < MIN_RUNS:
        return -math.inf, math.inf
    return _quantiles(support.memory_residuals)


INTERVAL_FIGURES = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "peak_memory_bytes")
#: the interval and support columns interval_columns adds (plans.parquet, the search's frames)
INTERVAL_COLUMNS = tuple(f"{f}_{end}" for f in INTERVAL_FIGURES for end in ("low", "high")) + ("support_gaps",)


def support_text(
    gaps: int, plan, model: ModelSpec, cluster: ClusterSpec, seq_len: int, support: Support | None = None
) -> tuple[str, str]:
    """("calibrated" | "extrapolated", why): the gaps in words against the profile's published runs,
    with the nearest published run, e.g. ("extrapolated", "no megatron run with ZeRO-3 beyond dp 64;
    nearest run: 12 (Llama-2-70B tp4.pp4.dp16 on 256 x h100-sxm)")."""
    support = support or support_points()
    trainer = get_trainer(plan.trainer)
    reach = Reach.of(trainer.profile, support.points)
    band = regime_band(
        support,
        trainer.profile,
        "moe" if model.moe else "dense",
        seq_len >= LONG_CONTEXT,
        plan.dtype,
        cluster.gpu.generation,
    )
    on = f"its interval from {band.runs} published runs ({band.name})"
    if not gaps:
        return "calibrated", f"within the published {trainer.profile} runs; {on}"
    words = [_gap_words(name, plan, model, cluster, seq_len, reach) for name in SUPPORT_GAPS if gaps & GAP_BIT[name]]
    nearest = nearest_point(plan, model, cluster, support, trainer.profile)
    near = f"; nearest run: {nearest.row_id} ({nearest.model} {nearest.layout} on {nearest.num_gpus} x {nearest.gpu})"
    return "extrapolated", "; ".join(words) + (near if nearest else "") + f"; {on}"


def _gap_words(name: str, plan, model, cluster, seq_len: int, reach: Reach) -> str:
    who = reach.profile
    if name == "profile":
        return f"no published run on {who}'s profile"
    if name == "workload":
        return f"no {'MoE' if model.moe else 'dense'} run on {who}"
    if name == "long_context":
        return f"no run at {seq_len // 1024}K context on {who}"
    if name == "dtype":
        return f"no {plan.dtype} run on {who}"
    if name == "generation":
        gen = cluster.gpu.generation or "this GPU's (not stated)"
        return f"no {who} run on a {gen} GPU"
    if name in ("tp", "pp", "cp", "ep"):
        return f"no {who} run with {name} beyond {getattr(reach, name)}"
    if name == "ep_cross_node":
        return f"no {who} run with EP across nodes"
    if name == "sharded_dp":
        what = "ZeRO-3" if who != "torchtitan" else "FSDP"
        limit = f"beyond dp {reach.sharded_dp}" if reach.sharded_dp else "at all"
        return f"no {who} run with {what} {limit}"
    if name == "gpus":
        return f"no {who} run beyond {reach.gpus} GPUs"
    raise KeyError(name)


def nearest_point(plan, model, cluster, support: Support, profile: str) -> CalibrationPoint | None:
    """The published run of the profile (else of any) closest to the plan: the same workload,
    context, precision and generation first, then the nearest sizes in log2."""
    pool = [p for p in support.points if p.profile == profile] or list(support.points)
    if not pool:
        return None
    workload, long_context = ("moe" if model.moe else "dense"), model.seq_len >= LONG_CONTEXT

    def distance(p: CalibrationPoint) -> float:
        d = 4.0 * (p.workload != workload) + 2.0 * (p.long_context != long_context)
        d += 2.0 * (p.dtype != plan.dtype) + 1.0 * (p.generation != cluster.gpu.generation)
        d += 1.0 * ((p.zero_stage >= 3) != (plan.zero_stage >= 3))
        for a, b in ((p.tp, plan.tp), (p.pp, plan.pp), (p.cp, plan.cp), (p.ep, plan.ep), (p.dp, plan.dp)):
            d += 0.25 * abs(math.log2(a) - math.log2(b))
        if p.params > 0:
            d += 0.5 * abs(math.log2(p.params / model.params_total))
        return d

    return min(pool, key=lambda p: (distance(p), p.row_id))


def fit_widening(points: Sequence[CalibrationPoint]) -> float:
    """The per-gap log widening that covers 80 % of the points extrapolated under
    leave-one-source-out: each point's gaps and band are those of the other sources' points."""
    needed = []
    for p in points:
        rest = Support(tuple(q for q in points if q.source != p.source), 0.0)
        count = _point_gaps(p, rest)
        if not count:
            continue
        band = regime_band(rest, p.profile, p.workload, p.long_context, p.dtype, p.generation)
        miss = max(band.low - p.residual, p.residual - band.high, 0.0)
        needed.append(miss / count if math.isfinite(miss) else 0.0)
    return float(np.quantile(needed, LEVEL)) if needed else 0.0


def _point_gaps(p: CalibrationPoint, support: Support) -> int:
    """Support gaps of a published run against other points (as counted in the widening)."""
    one = (np.array([v]) for v in (p.dtype, p.tp, p.pp, p.cp, p.ep, p.ep_cross_node, p.zero_stage, p.dp, p.num_gpus))
    reach = Reach.of(p.profile, support.points)
    return int(gap_count(_gaps(reach, p.workload, p.long_context, p.generation, *one))[0])


def coverage(points: Sequence[CalibrationPoint], widening: float) -> dict[str, dict]:
    """Per category, the share of published runs whose published value falls inside the 80 %
    interval built from the other sources' points (leave-one-source-out)."""
    hits: dict[str, list[bool]] = {}
    for p in points:
        rest = Support(tuple(q for q in points if q.source != p.source), widening)
        band = regime_band(rest, p.profile, p.workload, p.long_context, p.dtype, p.generation)
        w = widening * _point_gaps(p, rest)
        inside = band.low - w <= p.residual <= band.high + w
        for c in p.categories:
            hits.setdefault(c, []).append(inside)
    return {c: {"rows": len(h), "covered": float(np.mean(h))} for c, h in hits.items()}


def memory_coverage(residuals: Sequence[tuple[str, float]]) -> dict:
    """The share of measured peak-memory figures inside the memory interval built from the other
    sources' figures ((source, ln(measured / predicted)) pairs)."""
    hits = []
    for source, r in residuals:
        rest = [x for s, x in residuals if s != source]
        lo, hi = _quantiles(rest) if len(rest) >= MIN_RUNS else (-math.inf, math.inf)
        hits.append(lo <= r <= hi)
    return {"rows": len(hits), "covered": float(np.mean(hits)) if hits else math.nan}
