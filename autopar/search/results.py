"""Search results as a pandas DataFrame: one row per plan with its plan columns, every estimate
column and, when rejected, the reason. Ranking, the Pareto front and 'why the winner wins'."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from autopar.calibration.margin import PairedMargin
from autopar.cost.columns import MEMORY_BIT
from autopar.figures import (
    DOMINANT_COST,
    FITS,
    HIGH,
    LAYOUT_TEXT,
    LOW,
    MEMORY_GIB,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    RANK_TIME_S,
    REJECTED_BY,
    REJECTED_CODE,
    STEP_TIME_S,
    SUPPORT_GAPS,
    SUPPORT_REASON,
    TIME,
    TIME_LABELS,
    TIME_TERMS,
    VARIANT_OF,
)
from autopar.search.limits import RANK_BY as RANK_BY  # declared apart: the CLI checks --rank-by early
from autopar.search.margins import HEADROOM_TRADE, headroom_pick, plan_margin, stored_margin
from autopar.spec.hardware import GIB
from autopar.spec.layout import auto_layout
from autopar.spec.offload_modules import parse_offload_modules
from autopar.spec.plan import LAYOUT_KEY, PLAN_KEY, RESULT_FIELDS, ParallelPlan
from autopar.spec.plan_fields import CATEGORY
from autopar.spec.plan_fields import plan_names as names_of
from autopar.spec.recompute_modules import DEFAULT_SELECTIVE, parse_modules
from autopar.spec.rules import all_rules, reason_text
from autopar.spec.table import PlanTable, plan_of_row
from autopar.spec.trainers import ALL_TRAINERS, get_trainer

COMM_TERMS = ("tp", "cp", "ep", "pp", "dp", "bubble")
#: a communication or bubble term is the plan's dominant cost only from this share of the step on:
#: below a fifth of the step no single overhead dominates, and naming the largest one misleads
DOMINANT_SHARE = 0.20
#: what makes two plans structurally different layouts: the process grid and the pipeline's shape
#: (LAYOUT_KEY: tp, pp, vpp, cp, dp, ep, etp), the pipeline schedule and the precision. Plans that
#: agree on these and differ only in the micro-batch, the ZeRO stage, the stage layout, what is
#: recomputed or a flag (SP, TP overlap, grads precision, MoE dispatch) are variants of one another:
#: the top-k shows the fastest of each structure and folds the others under it, so the runner-up is
#: the next different layout, not the winner with another recompute.
STRUCTURE_KEY = LAYOUT_KEY + ("pp_schedule", "dtype")
#: the one ranking order of plans, the tie-break included: the plan ranked first for headroom
#: (rank_group 0: autopar.search.margins.headroom_pick), then the step time ranked by (rank_time_s),
#: then less memory, then the plan's place in the walk (the one-shot order); a frame without a
#: column skips it (stable sorts keep its order)
RANK_KEYS = ("rank_group", RANK_TIME_S, PEAK_MEMORY_BYTES, "plan_index")


def frame(table: PlanTable, est: dict[str, np.ndarray], num_layers: int | None = None) -> pd.DataFrame:
    """Plans and their estimates as one DataFrame (categoricals as names, not codes)."""
    c = table.columns
    df = pd.DataFrame({f.column: _shown(f, c[f.column]) for f in RESULT_FIELDS})
    if "plan_index" in c:  # the plan's place in the search's walk
        df["plan_index"] = c["plan_index"]
    for name, arr in est.items():
        if np.ndim(arr) == 1:  # per-rank (R, n) arrays stay out of the table
            df[name] = arr
    if REJECTED_BY not in df:  # a search's estimate: the text only for the rows kept
        df[REJECTED_BY] = rejection_text(est[REJECTED_CODE], c["trainer"])
    df[LAYOUT_TEXT] = df.pop(LAYOUT_TEXT) if LAYOUT_TEXT in df else layout_texts(table, num_layers)
    df[PLAN_NAME] = plan_names(df)
    df[DOMINANT_COST] = dominant_costs(df)
    df[MEMORY_GIB] = df[PEAK_MEMORY_BYTES] / GIB
    return df


def dominant_costs(df: pd.DataFrame) -> np.ndarray:
    """Per row, the communication or bubble term (COMM_TERMS) that takes the largest share of the
    step when it takes at least DOMINANT_SHARE of it, else "" (no overhead dominates)."""
    terms = np.stack([df[TIME[t]].to_numpy(dtype=float) for t in COMM_TERMS], axis=1)
    step = df[STEP_TIME_S].to_numpy(dtype=float)
    largest = terms.max(axis=1) if len(df) else np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        dominates = largest >= DOMINANT_SHARE * step
    names = np.asarray(COMM_TERMS, dtype=object)[terms.argmax(axis=1)] if len(df) else np.zeros(0, dtype=object)
    return np.where(dominates & (largest > 0), names, "")


def _shown(f, column: np.ndarray) -> np.ndarray:
    """A table column as search results show it: a category by its names."""
    return np.asarray(f.choices, dtype=object)[column] if f.kind == CATEGORY else column


def rejection_text(codes: np.ndarray, trainer: np.ndarray) -> np.ndarray:
    """'memory', or the labels of the broken rules ('heads%tp', 'deepspeed:cp', ...), per row."""
    memory = (np.asarray(codes, dtype=np.uint64) >> np.uint64(MEMORY_BIT)) & np.uint64(1)
    return np.where(memory == 1, "memory", reason_text(np.asarray(codes, dtype=np.uint64), trainer, all_rules()))


def layout_texts(table: PlanTable, num_layers: int | None = None) -> np.ndarray:
    """The layout each row assumes, for display ('4x20 (even)', '[1, 62x2, 1] (embedding+loss as layers)')."""
    keys = np.stack([table.pp, table.vpp, table.layout_id], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    texts = []
    for pp, vpp, lid in uniq:
        lay = table.layouts[lid] if lid >= 0 else auto_layout(num_layers or 0, int(pp), int(vpp))
        texts.append(lay.describe())
    return np.asarray(texts, dtype=object)[inverse.reshape(-1)] if len(table) else np.zeros(0, dtype=object)


def plan_names(df: pd.DataFrame) -> np.ndarray:
    """Short layout names, e.g. tp8.pp4.v2.dp8 (axes of size 1 omitted but dp), vectorised (the one
    namer, autopar.spec.plan_fields.plan_names, that ParallelPlan.describe uses too)."""
    return names_of(df)


def set_rank_time(est: dict, rank_by: str) -> None:
    """rank_time_s: the step time the search ranks by (RANK_BY: the central prediction, or the
    pessimistic end of its 80 % interval)."""
    est[RANK_TIME_S] = est[RANK_BY[rank_by]]


def rank_order(df: pd.DataFrame) -> pd.DataFrame:
    """The rows in RANK_KEYS order (rank_time_s, else the central prediction)."""
    keys = [k for k in RANK_KEYS if k in df.columns]
    if RANK_TIME_S not in df.columns:
        keys.insert(int("rank_group" in keys), STEP_TIME_S)
    return df.sort_values(keys, kind="stable")


def ranked(df: pd.DataFrame) -> pd.DataFrame:
    """Plans that fit, fastest first (`rank_order`)."""
    return rank_order(df[df[FITS]])


def row_plan(row: pd.Series, layouts) -> ParallelPlan:
    """A DataFrame row back to a ParallelPlan (the one decoder, autopar.spec.table.plan_of_row); read
    as a dict first: a Series lookup per field costs ten times a dict's."""
    return plan_of_row(row.to_dict() if isinstance(row, pd.Series) else row, layouts)


def top_plans(df: pd.DataFrame, k: int) -> pd.DataFrame:
    """The k fastest structurally different plans that fit (STRUCTURE_KEY), each on its fastest
    trainer, with `trainers`: every trainer that can run that plan (and fits it), in the order of
    autopar.spec.trainers.TRAINERS, and `variants`: how many other plans of its structure fit
    (`variant_plans` lists them)."""
    return top_and_variants(df, k)[0]


def top_and_variants(df: pd.DataFrame, k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(top_plans(df, k), variant_plans(df, k)), the plans grouped by structure once for both."""
    leaders, variants = _distinct(df)
    best = leaders.head(k)
    counts = variants.groupby(VARIANT_OF, sort=False).size() if len(variants) else pd.Series(dtype=int)
    top = best.assign(variants=[int(counts.get(r, 0)) for r in range(1, len(best) + 1)])
    return top, variants[variants[VARIANT_OF] <= k] if len(variants) else variants


def variant_plans(df: pd.DataFrame, k: int) -> pd.DataFrame:
    """The variants folded under the top k (top_plans): each distinct fitting plan that shares the
    structure of a top plan and is slower, fastest first, with `variant_of`: the rank (1-based) of
    the top plan it is a variant of, and `trainers` as top_plans has it."""
    return top_and_variants(df, k)[1]


def _distinct(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the fastest plan of each structure, in rank order; every other distinct plan, with
    `variant_of` the rank of its structure's fastest), both with `trainers`."""
    fit = ranked(df)
    if fit.empty:
        empty = fit.assign(trainers=pd.Series(dtype=object))
        return empty, empty.assign(**{VARIANT_OF: pd.Series(dtype=int)})
    keys = [c for c in PLAN_KEY if c in fit.columns]
    order = {t: i for i, t in enumerate(ALL_TRAINERS)}
    runs_on = fit.groupby(keys, sort=False, dropna=False)["trainer"].agg(
        lambda s: ", ".join(sorted(set(s), key=lambda t: order[t]))
    )
    plans = fit.drop_duplicates(keys, keep="first")
    idx = pd.MultiIndex.from_frame(plans[keys]) if len(keys) > 1 else plans[keys[0]]
    plans = plans.assign(trainers=runs_on.reindex(idx).to_numpy())
    shape = [c for c in STRUCTURE_KEY if c in plans.columns]
    group = plans.groupby(shape, sort=False, dropna=False).ngroup().to_numpy()
    first = ~pd.Series(group).duplicated().to_numpy()
    rank_of_group = {g: r for r, g in enumerate(group[first], start=1)}
    variants = plans[~first]
    return plans[first], variants.assign(**{VARIANT_OF: [rank_of_group[g] for g in group[~first]]})


def best_per_trainer(
    df: pd.DataFrame, margin: PairedMargin | None = None, headroom_gib: float = 0.0, trade: float = 0.0
) -> dict[str, pd.Series]:
    """The fastest plan that fits for each trainer that was searched (None where nothing fits), or
    with `trade` > 0 the plan the headroom rule ranks first among its plans
    (autopar.search.margins.headroom_pick)."""
    out: dict[str, pd.Series | None] = {}
    for t in ALL_TRAINERS:
        mine = df[df["trainer"] == t]
        if len(mine):
            best = ranked(mine.drop(columns="rank_group", errors="ignore"))
            pick = headroom_pick(best, margin, headroom_gib, trade) if trade > 0 else None
            out[t] = None if best.empty else best.iloc[pick.position if pick else 0]
    return out


def rank_first_for_headroom(
    pool: pd.DataFrame, margin: PairedMargin | None, headroom_gib: float, trade: float = HEADROOM_TRADE
) -> tuple[pd.DataFrame, str | None]:
    """(the pool with `rank_group`: 0 for the plan the headroom rule ranks first, on every trainer of
    its profile, 1 for the others; the rule's line), or (the pool, None) when the rule picks nothing."""
    order = ranked(pool)
    pick = headroom_pick(order, margin, headroom_gib, trade) if len(order) else None
    if pick is None:
        return pool, None
    chosen = order.iloc[pick.position]
    line = pick.line(order, _runner_text(chosen, order.iloc[0]), headroom_gib)
    keys = [c for c in PLAN_KEY if c in pool.columns]
    same = np.ones(len(pool), dtype=bool)
    for k in keys:
        same &= (pool[k] == chosen[k]).to_numpy()
    profile = get_trainer(str(chosen["trainer"])).profile
    same &= np.array([get_trainer(str(t)).profile == profile for t in pool["trainer"]])
    return pool.assign(rank_group=np.where(same, 0, 1)), line


def pareto_positions(cost, memory, tiebreak=None) -> np.ndarray:
    """Positions of the points no other point beats on both cost (step time) and memory, lower
    being better and one strictly; of exact duplicates the first by `tiebreak` (default: position).
    Sorted by cost, then memory; O(n log n): along the cost order, a point is on the front when it
    needs strictly less memory than every cheaper one."""
    cost, memory = np.asarray(cost, dtype=float), np.asarray(memory, dtype=float)
    if not len(cost):
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(len(cost)) if tiebreak is None else tiebreak, memory, cost))
    m = memory[order]
    best_before = np.minimum.accumulate(np.concatenate([[np.inf], m[:-1]]))
    return order[m < best_before]


def pareto_front(df: pd.DataFrame) -> pd.DataFrame:
    """Plans that fit and that no other fitting plan beats on both step time and memory."""
    fit = df[df[FITS]]
    return fit.iloc[pareto_positions(fit[STEP_TIME_S].to_numpy(), fit[PEAK_MEMORY_BYTES].to_numpy())]


def why_winner(winner: pd.Series, runner: pd.Series | None) -> str:
    """One line on why the winner beats the runner-up: the step-time terms that differ most."""
    if runner is None:
        return f"{winner[PLAN_NAME]} is the only plan that fits."
    gain = runner[STEP_TIME_S] / winner[STEP_TIME_S] - 1
    saved, paid = _term_differences(winner, runner)
    runner_desc = _runner_text(winner, runner)
    if not saved and not paid:  # same predicted time: the tie is broken by memory, then by order
        mem = (runner[PEAK_MEMORY_BYTES] - winner[PEAK_MEMORY_BYTES]) / GIB
        why = f"{mem:.3g} GiB less memory" if mem > 0 else "listed first"
        return f"{winner[PLAN_NAME]} ties the runner-up, {runner_desc}, on predicted step time; {why}."
    return (
        f"{winner[PLAN_NAME]} beats the runner-up, {runner_desc}, by {100 * gain:.1f}% per step: "
        + ", ".join(saved + paid)
        + "."
    )


def _term_differences(winner: pd.Series, other: pd.Series) -> tuple[list[str], list[str]]:
    """(the two step-time terms the winner saves most against `other`, the one it pays most), in
    words; differences below 0.01 % of the step are noise to a reader."""
    diffs = sorted(((other[TIME[t]] - winner[TIME[t]], t) for t in TIME_TERMS), reverse=True)
    tiny = 1e-4 * float(winner[STEP_TIME_S])
    saved = [f"{d:.3g} s less {TIME_LABELS[t]}" for d, t in diffs if d > tiny][:2]
    paid = [f"{-d:.3g} s more {TIME_LABELS[t]}" for d, t in diffs[::-1] if d < -tiny][:1]
    return saved, paid


def ep_choice_line(winner: pd.Series, pool: pd.DataFrame) -> str:
    """For a MoE winner: what decides its expert-parallel size, against the fastest fitting plan at
    any other EP size in the pool (every layout's fastest is there): the step-time terms that
    differ most and the memory; '' without another EP size."""
    if "ep" not in pool.columns or not len(pool):
        return ""
    fit = pool[pool[FITS].astype(bool) & (pool["ep"] != winner["ep"])]
    if fit.empty:
        return ""
    other = rank_order(fit.drop(columns="rank_group", errors="ignore")).iloc[0]
    saved, paid = _term_differences(winner, other)
    gain = float(other[STEP_TIME_S]) / float(winner[STEP_TIME_S]) - 1
    mem = (float(other[PEAK_MEMORY_BYTES]) - float(winner[PEAK_MEMORY_BYTES])) / GIB
    terms = ", ".join(saved + paid) or "the same step-time terms"
    ep, other_ep = int(winner["ep"]), int(other["ep"])
    pace = f"{abs(100 * gain):.1f}% {'slower' if gain >= 0 else 'faster'}"
    memory = f"{abs(mem):.1f} GiB {'less' if mem >= 0 else 'more'} memory"
    # the terms are the winner's against the other plan: the winner is the sentence's subject
    return (
        f"Why EP {ep}: the fastest plan at another EP size, {other[PLAN_NAME]} (EP {other_ep}), is {pace} "
        f"per step; against it EP {ep} has {terms}, and {memory}."
    )


def _runner_text(winner: pd.Series, runner: pd.Series) -> str:
    """The runner-up by its layout, or by what differs when it has the winner's layout."""
    if winner[PLAN_NAME] != runner[PLAN_NAME]:
        return str(runner[PLAN_NAME])
    keys = (
        "pp_schedule",
        "recompute",
        "recompute_modules",
        "zero_stage",
        "micro_batch_size",
        "dtype",
        "tp_comm_overlap",
        "compile",
        "optimizer_offload",
        "offload_modules",
        LAYOUT_TEXT,
        "trainer",
    )
    labels = {
        "pp_schedule": "schedule",
        "recompute": "recompute",
        "recompute_modules": "recompute modules",
        "zero_stage": "ZeRO",
        "micro_batch_size": "mbs",
        "dtype": "dtype",
        "tp_comm_overlap": "TP overlap",
        "compile": "torch.compile",
        "optimizer_offload": "optimizer offload",
        "offload_modules": "activation offload",
        LAYOUT_TEXT: "stages",
        "trainer": "trainer",
    }

    def shown(row, k):
        if k == "offload_modules":
            return ",".join(parse_offload_modules(int(row[k]))) or "none"
        if k != "recompute_modules":
            return row[k]
        return ",".join(parse_modules(int(row[k])) or DEFAULT_SELECTIVE) if row["recompute"] == "selective" else "none"

    d = [
        f"{labels[k]} {shown(runner, k)} (not {shown(winner, k)})"
        for k in keys
        if k in runner.index and runner[k] != winner[k]
    ]
    return "the same layout with " + (", ".join(d) if d else "another knob")


def sureness_lines(top: pd.DataFrame, pool: pd.DataFrame, margin: PairedMargin | None = None) -> list[str]:
    """How sure the answer is (autopar.calibration.uncertainty): whether the winner stands on calibrated
    ground, whether the margin over the runner-up holds under the model's error (autopar.search.margins:
    `margin`, default the shipped model), and, when the winner is extrapolated, the fastest calibrated
    plan inside the winner's interval."""
    if top.empty or LOW[STEP_TIME_S] not in top.columns:
        return []
    w = top.iloc[0]
    lo, hi = float(w[LOW[STEP_TIME_S]]), float(w[HIGH[STEP_TIME_S]])
    band = f"{lo:.3f}-{hi:.3f} s per step"
    calibrated = int(w[SUPPORT_GAPS]) == 0
    reason = str(w.get(SUPPORT_REASON, ""))
    lines = [
        f"The winner {w[PLAN_NAME]} is {'calibrated' if calibrated else 'extrapolated'}: {reason}; "
        f"80 % interval {band}."
    ]
    if len(top) > 1:
        r = top.iloc[1]
        m = plan_margin(w, r, stored_margin() if margin is None else margin)
        lo, up = m.percent_range()
        head = (
            f"The runner-up {_runner_text(w, r)} ({float(r[STEP_TIME_S]):.3f} s, "
            f"{100 * math.expm1(m.log_ratio):+.1f} %), {m.basis}: the 80 % interval of the difference "
            f"is {lo:+.1f} % to {up:+.1f} %"
        )
        if m.separated:
            lines.append(head + ", so the ranking holds under the model's own error.")
        else:
            lines.append(head + ": the model cannot tell them apart; measure both (--trials) before committing.")
    if not calibrated and len(pool) and SUPPORT_GAPS in pool.columns:
        solid = ranked(pool[(pool[SUPPORT_GAPS] == 0) & (pool[STEP_TIME_S] <= hi)])
        if len(solid):
            c = solid.iloc[0]
            slower = float(c[STEP_TIME_S]) / float(w[STEP_TIME_S]) - 1
            lines.append(
                f"Fastest predicted: {w[PLAN_NAME]} ({float(w[STEP_TIME_S]):.3f} s, extrapolated). Fastest on "
                f"calibrated ground: {c[PLAN_NAME]} on {c['trainer']} ({float(c[STEP_TIME_S]):.3f} s, "
                f"{100 * slower:+.1f}%), inside the winner's interval."
            )
    return lines
