"""The whole run in the report (--tokens): the winner's time and cost panel, where the days go
(steps, checkpoint writes, rework, restarts), and the what-if's days and cost per scenario."""

from __future__ import annotations

import pandas as pd

from autopar.figures import (
    CHECKPOINT_GIB,
    CHECKPOINT_INTERVAL_MIN,
    COST,
    DAYS,
    GOODPUT,
    GPU_HOURS,
    LOST_TO_CHECKPOINTS,
    LOST_TO_RESTARTS,
    LOST_TO_REWORK,
    PLAN_NAME,
    TRAIN_DAYS,
)
from autopar.report.run_data import RunData
from autopar.report.top_tables import candidate_labels

#: the parts of the days to train, in the order drawn; each the share of the wall time it loses
#: (autopar.cost.goodput: lost_to_*), the rest being steps
RUN_TERMS = {
    "steps": "training steps",
    LOST_TO_CHECKPOINTS: "checkpoint writes",
    LOST_TO_REWORK: "rework after failures",
    LOST_TO_RESTARTS: "restarts and checkpoint reads",
}


def training_run(run: RunData) -> dict | None:
    """The whole run the search was asked about (search.json's options.training), or None."""
    t = run.search.get("options", {}).get("training")
    return t if isinstance(t, dict) and t.get("tokens") else None


def deadline_days(run: RunData) -> float | None:
    """The deadline the search was asked about, in days (None: no deadline)."""
    t = training_run(run) or {}
    return t["deadline_s"] / 86_400 if t.get("deadline_s") else None


def run_panel(run: RunData, w: pd.Series) -> pd.DataFrame:
    """The winner's whole run as (item, value) rows: tokens, days, goodput and its terms,
    checkpoints, GPU-hours, cost, and the deadline and budget verdicts."""
    from autopar.spec.training_run import money_text, never_text, tokens_text

    t = training_run(run) or {}
    rows = [
        ("tokens", tokens_text(float(t.get("tokens", 0)))),
        ("days to train", never_text(float(w[DAYS]), "{:,.1f}")),
        ("days of steps (without checkpoints or failures)", f"{w[TRAIN_DAYS]:,.1f}"),
        (GOODPUT.header, f"{100 * w[GOODPUT]:.2f}%"),
    ]
    rows += [(f"lost to {RUN_TERMS[k]}", f"{100 * w[k]:.2f}%") for k in RUN_TERMS if k != "steps"]
    rows += [
        ("checkpoint (every rank's shard)", f"{w[CHECKPOINT_GIB]:,.0f} GiB"),
        ("checkpoint interval (Young/Daly)", never_text(float(w[CHECKPOINT_INTERVAL_MIN]), "{:,.1f} min")),
        (GPU_HOURS.header, never_text(float(w[GPU_HOURS]), "{:,.0f}")),
    ]
    if pd.notna(w.get(COST)):
        rows.append((COST.header, money_text(float(w[COST]))))
    if t.get("deadline_s"):
        left = t["deadline_s"] / 86_400 - w[DAYS]
        rows.append(
            (
                "deadline",
                f"{t['deadline_s'] / 86_400:g} days: "
                + (f"met, {left:.1f} days to spare" if left >= 0 else f"missed by {-left:.1f} days"),
            )
        )
    if t.get("budget") and pd.notna(w.get(COST)):
        left = t["budget"] - float(w[COST])
        rows.append(
            (
                "budget",
                money_text(t["budget"])
                + ": "
                + (f"met, {money_text(left)} left" if left >= 0 else f"over by {money_text(-left)}"),
            )
        )
    return pd.DataFrame(rows, columns=["item", "value"])


def run_breakdown(rows: pd.DataFrame) -> pd.DataFrame:
    """Days per part of the run (RUN_TERMS) per candidate; they sum to `days`."""
    days = rows[DAYS].to_numpy(dtype=float)
    out = pd.DataFrame(
        {k: days * rows[k].to_numpy(dtype=float) for k in RUN_TERMS if k != "steps"},
        index=pd.Index(candidate_labels(rows), name="candidate"),
    )
    out.insert(0, "steps", rows[TRAIN_DAYS].to_numpy(dtype=float))
    out[DAYS] = days
    return out


def whatif_answers(wt: pd.DataFrame, t: dict | None) -> list[str]:
    """The what-if's answers to the run's questions (autopar.search.training.choose): the cheapest
    scenario that meets the deadline and the fastest within the budget."""
    from autopar.search.training import choose
    from autopar.spec.training_run import TrainingRun, deadline_text, money_text

    if t is None or not wt[DAYS].notna().any():
        return []
    run = TrainingRun(
        **{k: v for k, v in t.items() if k in ("tokens", "deadline_s", "price_per_gpu_hour", "prices_by_gpu", "budget")}
    )
    priced = bool(wt[COST].notna().any())
    c = choose(wt[DAYS], wt[COST] if priced else wt[GPU_HOURS], run)

    def said(i: int | None, label: str) -> str:
        if i is None:
            return f"{label}: none."
        r = wt.iloc[i]
        cost = f", cost {money_text(r[COST])}" if priced else ""
        return (
            f"{label}: {r[PLAN_NAME]} on {r['scenario']}, {r[DAYS]:.1f} days, "
            f"{r[GPU_HOURS] / 1e6:.3g}M GPU-hours{cost}."
        )

    deadline = f"Cheapest by {deadline_text(run.deadline_s)}" if run.deadline_s else "Cheapest"
    budget = f"Fastest within the budget of {money_text(run.budget)}" if run.budget else "Fastest"
    return [said(c["cheapest_by_deadline"], deadline), said(c["fastest_within_budget"], budget)]
