"""The whole run in the report (--tokens): the winner's time and cost panel, where the days go
(steps, checkpoint writes, rework, restarts), and the what-if's days and cost per scenario."""

from __future__ import annotations

import pandas as pd

from autopar.report.run_data import RunData
from autopar.report.top_tables import candidate_labels

#: the parts of the days to train, in the order drawn; each the share of the wall time it loses
#: (autopar.cost.goodput: lost_to_*), the rest being steps
RUN_TERMS = {
    "steps": "training steps",
    "lost_to_checkpoints": "checkpoint writes",
    "lost_to_rework": "rework after failures",
    "lost_to_restarts": "restarts and checkpoint reads",
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
        ("days to train", never_text(float(w["days"]), "{:,.1f}")),
        ("days of steps (without checkpoints or failures)", f"{w['train_days']:,.1f}"),
        ("goodput", f"{100 * w['goodput']:.2f}%"),
    ]
    rows += [(f"lost to {RUN_TERMS[k]}", f"{100 * w[k]:.2f}%") for k in RUN_TERMS if k != "steps"]
    rows += [
        ("checkpoint (every rank's shard)", f"{w['checkpoint_gib']:,.0f} GiB"),
        ("checkpoint interval (Young/Daly)", never_text(float(w["checkpoint_interval_min"]), "{:,.1f} min")),
        ("GPU-hours", never_text(float(w["gpu_hours"]), "{:,.0f}")),
    ]
    if pd.notna(w.get("cost")):
        rows.append(("cost", money_text(float(w["cost"]))))
    if t.get("deadline_s"):
        left = t["deadline_s"] / 86_400 - w["days"]
        rows.append(
            (
                "deadline",
                f"{t['deadline_s'] / 86_400:g} days: "
                + (f"met, {left:.1f} days to spare" if left >= 0 else f"missed by {-left:.1f} days"),
            )
        )
    if t.get("budget") and pd.notna(w.get("cost")):
        left = t["budget"] - float(w["cost"])
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
    days = rows["days"].to_numpy(dtype=float)
    out = pd.DataFrame(
        {k: days * rows[k].to_numpy(dtype=float) for k in RUN_TERMS if k != "steps"},
        index=pd.Index(candidate_labels(rows), name="candidate"),
    )
    out.insert(0, "steps", rows["train_days"].to_numpy(dtype=float))
    out["days"] = days
    return out


def whatif_answers(wt: pd.DataFrame, t: dict | None) -> list[str]:
    """The what-if's answers to the run's questions (autopar.search.training.choose): the cheapest
    scenario that meets the deadline and the fastest within the budget."""
    from autopar.search.training import choose
    from autopar.spec.training_run import TrainingRun, deadline_text, money_text

    if t is None or not wt["days"].notna().any():
        return []
    run = TrainingRun(
        **{k: v for k, v in t.items() if k in ("tokens", "deadline_s", "price_per_gpu_hour", "prices_by_gpu", "budget")}
    )
    priced = bool(wt["cost"].notna().any())
    c = choose(wt["days"], wt["cost"] if priced else wt["gpu_hours"], run)

    def said(i: int | None, label: str) -> str:
        if i is None:
            return f"{label}: none."
        r = wt.iloc[i]
        cost = f", cost {money_text(r['cost'])}" if priced else ""
        return (
            f"{label}: {r['plan_name']} on {r['scenario']}, {r['days']:.1f} days, "
            f"{r['gpu_hours'] / 1e6:.3g}M GPU-hours{cost}."
        )

    deadline = f"Cheapest by {deadline_text(run.deadline_s)}" if run.deadline_s else "Cheapest"
    budget = f"Fastest within the budget of {money_text(run.budget)}" if run.budget else "Fastest"
    return [said(c["cheapest_by_deadline"], deadline), said(c["fastest_within_budget"], budget)]
