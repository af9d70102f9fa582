"""The report's data about every evaluated plan, in one step from the plans frame of a run to plain
pandas frames: the Pareto front, the colour class of each plan, and the scatter of memory against
throughput (shared estimates merged into one point, sampled above a few thousand points).

Every frame keeps the raw numbers of the run (bytes, tokens/s) next to derived display units (GiB),
so tests can compare them with the estimates exactly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autopar.figures import (
    FITS,
    HIGH,
    LAYOUT_TEXT,
    LOW,
    MEMORY_GIB,
    MFU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    REJECTED_BY,
    STEP_TIME_S,
    SUPPORT_GAPS,
    TOKENS_PER_S,
)
from autopar.search.results import pareto_positions
from autopar.search.streaming import SCATTER_POINTS
from autopar.spec.hardware import GIB

#: most points drawn in the all-plans scatter (declared with the sample the search keeps for it)
MAX_SCATTER_POINTS = SCATTER_POINTS
#: the colour class of the plans that fit, named as the figure reads
FIT_CLASS = FITS.header
#: most distinct colours in the scatter: further rejection reasons share "other rules"
MAX_CATEGORIES = 8


def pareto_mask(throughput: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Points no other point beats: higher throughput and lower memory, one strictly. Of exact
    duplicates one is kept (autopar.search.results.pareto_positions)."""
    keep = np.zeros(len(memory), bool)
    keep[pareto_positions(-np.asarray(throughput, dtype=float), memory)] = True
    return keep


def pareto_table(plans: pd.DataFrame) -> pd.DataFrame:
    """Fitting plans on the throughput / memory front, least memory first."""
    fit = plans[plans[FITS].astype(bool)]
    front = fit[pareto_mask(fit[TOKENS_PER_S].to_numpy(), fit[PEAK_MEMORY_BYTES].to_numpy())].copy()
    front[MEMORY_GIB] = front[PEAK_MEMORY_BYTES] / GIB
    front = front.sort_values([PEAK_MEMORY_BYTES, TOKENS_PER_S], ascending=[True, False], kind="stable")
    cols = [
        PLAN_NAME,
        "pp",
        "pp_schedule",
        "recompute",
        "zero_stage",
        "micro_batch_size",
        PEAK_MEMORY_BYTES,
        MEMORY_GIB,
        TOKENS_PER_S,
        STEP_TIME_S,
        MFU,
    ]
    return front[cols + (["plan_index"] if "plan_index" in front.columns else [])]


def categories(plans: pd.DataFrame) -> pd.Series:
    """Colour class of every plan: 'fits', 'memory' (over capacity or headroom) or the rule it breaks
    (the first one; rare rules share 'other rules')."""
    fits = plans[FITS].astype(bool).to_numpy()
    codes, uniques = pd.factorize(plans[REJECTED_BY].astype(str))  # split each distinct string once
    first = np.asarray([u.split(", ")[0] for u in uniques] or [""], dtype=object)[np.maximum(codes, 0)]
    cat = pd.Series(np.where(fits, FIT_CLASS, first), index=plans.index, dtype=object)
    counts = cat[cat != FIT_CLASS].value_counts()
    rare = counts.index[MAX_CATEGORIES - 2 :] if len(counts) > MAX_CATEGORIES - 1 else []
    return cat.where(~cat.isin(rare), "other rules")


def hover_text(plans: pd.DataFrame) -> pd.Series:
    """One hover label per plan: the layout and its key numbers."""
    if plans.empty:
        return pd.Series([], index=plans.index, dtype=object)
    s = lambda c: plans[c].astype(str)  # noqa: E731
    sched = np.where(plans["pp"].to_numpy() > 1, s("pp_schedule") + ", ", "")
    text = (
        s(PLAN_NAME)
        + "<br>"
        + sched
        + s("recompute")
        + " recompute, ZeRO "
        + s("zero_stage")
        + ", mbs "
        + s("micro_batch_size")
        + "<br>layout "
        + s(LAYOUT_TEXT)
        + "<br>"
        + (plans[PEAK_MEMORY_BYTES] / GIB).map("{:.1f}".format)
        + " GiB, "
        + plans[STEP_TIME_S].map("{:.3f}".format)
        + " s/step, MFU "
        + (100 * plans[MFU]).map("{:.1f}".format)
        + "%"
    )
    if {LOW[STEP_TIME_S], HIGH[STEP_TIME_S]} <= set(plans.columns):  # the 80 % interval and support
        lo, hi = plans[LOW[STEP_TIME_S]], plans[HIGH[STEP_TIME_S]]
        band = "<br>80 % interval " + lo.map("{:.3f}".format) + "-" + hi.map("{:.3f}".format) + " s/step"
        if SUPPORT_GAPS in plans.columns:
            gaps = plans[SUPPORT_GAPS]
            band = band + np.where(gaps.isna(), "", np.where(gaps == 0, ", calibrated", ", extrapolated"))
        text = text.where(lo.isna() | hi.isna(), text + band)
    rej = plans[REJECTED_BY].astype(str)
    return text.where(rej == "", text + "<br>rejected: " + rej)


def _short(plans: pd.DataFrame) -> pd.Series:
    if plans.empty:
        return pd.Series([], index=plans.index, dtype=object)
    s = lambda c: plans[c].astype(str)  # noqa: E731
    sched = np.where(plans["pp"].to_numpy() > 1, s("pp_schedule") + ", ", "")
    return (
        s(PLAN_NAME)
        + " ("
        + sched
        + s("recompute")
        + ", ZeRO "
        + s("zero_stage")
        + ", mbs "
        + s("micro_batch_size")
        + ")"
    )


def scatter_frame(
    plans: pd.DataFrame, keep: pd.Index | None = None, max_points: int = MAX_SCATTER_POINTS, seed: int = 0
) -> pd.DataFrame:
    """Every evaluated plan with a finite estimate: memory (GiB) vs throughput, its colour class,
    whether it is on the Pareto front, the hover text, and where the run has them the point's 80 %
    intervals (step_time_s_low/high, tokens_per_s_low/high) and support_gaps. Plans with the same estimate (same
    memory, throughput and class, e.g. schedules that do not matter without a pipeline) share one
    point: `n_plans` counts them and the hover names them. Above max_points points, a
    deterministic sample that always keeps the Pareto front and the rows in `keep` (e.g. the
    top-k). The frame is indexed by the first plan of each point; attrs say how many plans there
    were, how many were drawn and how many have no finite estimate. Text is built only for the
    points drawn, so millions of plans cost little more than the numbers."""
    mem_all = plans[PEAK_MEMORY_BYTES].to_numpy(float)
    tput_all = plans[TOKENS_PER_S].to_numpy(float)
    finite = np.isfinite(tput_all) & np.isfinite(mem_all)
    p = plans[finite]
    mem, tput = mem_all[finite], tput_all[finite]
    fit = p[FITS].astype(bool).to_numpy()
    front = np.zeros(len(p), bool)
    front[fit] = pareto_mask(tput[fit], mem[fit])
    cat = categories(p).to_numpy()
    gid = pd.DataFrame({"m": mem, "t": tput, "c": cat}).groupby(["m", "t", "c"], sort=False).ngroup().to_numpy()
    first = ~pd.Series(gid).duplicated().to_numpy()
    n_plans = np.bincount(gid)
    on_front = np.bincount(gid, weights=front) > 0
    pos = np.flatnonzero(first)  # positions (in p) of each point's first plan, in gid order
    points = len(pos)
    if points > max_points:
        must = on_front[gid[pos]] | p.index[pos].isin(keep if keep is not None else [])
        rest = np.flatnonzero(~must)
        n = max(0, max_points - int(must.sum()))
        pick = np.random.default_rng(seed).choice(rest, size=min(n, len(rest)), replace=False)
        pos = np.sort(np.concatenate([np.flatnonzero(must), pick]))
        pos = np.flatnonzero(first)[pos]
    g = gid[pos]
    sel = p.iloc[pos]
    out = pd.DataFrame(
        {
            PLAN_NAME: sel[PLAN_NAME].astype(str).to_numpy(),
            PEAK_MEMORY_BYTES: mem[pos],
            MEMORY_GIB: mem[pos] / GIB,
            TOKENS_PER_S: tput[pos],
            STEP_TIME_S: sel[STEP_TIME_S].to_numpy(float),
            "category": cat[pos],
            "pareto": on_front[g],
            "n_plans": n_plans[g],
        },
        index=sel.index,
    )
    for c in (LOW[STEP_TIME_S], HIGH[STEP_TIME_S], LOW[TOKENS_PER_S], HIGH[TOKENS_PER_S], SUPPORT_GAPS):
        if c in sel.columns:  # the point's 80 % intervals and support (a run from before them has none)
            out[c] = sel[c].to_numpy()
    out["hover"] = _hover(p, sel, gid, g, first, n_plans)
    out = out.sort_index()
    out.attrs.update(
        total=int(len(plans)),
        points=int(points),
        plotted=int(len(out)),
        plotted_plans=int(out["n_plans"].sum()),
        without_estimate=int((~finite).sum()),
    )
    return out


def _hover(p: pd.DataFrame, sel: pd.DataFrame, gid, g, first, n_plans) -> np.ndarray:
    """A point's hover: its first plan's text, then up to four more plans that share its estimate."""
    hover = hover_text(sel).to_numpy(dtype=object)
    dup = np.flatnonzero(~first & np.isin(gid, g[n_plans[g] > 1]))
    if len(dup):
        rank = pd.Series(gid[dup]).groupby(gid[dup]).cumcount().to_numpy()
        dup = dup[rank < 4]
        shorts: dict[int, list[str]] = {}
        for gg, sh in zip(gid[dup], _short(p.iloc[dup]).to_numpy()):
            shorts.setdefault(int(gg), []).append(sh)
        hover = hover + np.asarray(
            [
                ""
                if n_plans[gg] < 2
                else "<br>same estimate: "
                + ", ".join(shorts.get(int(gg), []))
                + (f" and {n_plans[gg] - 5:,} more" if n_plans[gg] > 5 else "")
                for gg in g
            ],
            dtype=object,
        )
    return hover


CATEGORY_ORDER = (FIT_CLASS, "memory")


def category_order(cats: pd.Series) -> list[str]:
    """Legend order: fits, memory, then rules by frequency, 'other rules' last."""
    counts = cats.value_counts()
    rest = [c for c in counts.index if c not in CATEGORY_ORDER and c != "other rules"]
    last = ["other rules"] if "other rules" in counts.index else []
    return [c for c in CATEGORY_ORDER if c in counts.index] + rest + last
