"""The report's top-k, in one step from a run (autopar.report.run_data) to plain pandas frames:
the plans of top.json, the best plan per trainer, and where each candidate's step time and memory
go. Also the columns of the plans frame the report reads (checked when a run is loaded).

Every frame keeps the raw numbers of the run (seconds, bytes, tokens/s, fractions) next to derived
display units (GiB), so tests can compare them with the estimates exactly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autopar.cost.estimate import MEMORY_TERMS, TIME_TERMS
from autopar.report.run_data import RunData
from autopar.search.results import best_per_trainer, ranked, top_plans
from autopar.spec.hardware import GIB

#: scatter.parquet columns the report reads
REQUIRED_COLUMNS = (
    (
        "plan_name",
        "fits",
        "valid",
        "rejected_by",
        "peak_memory_bytes",
        "memory_capacity_bytes",
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "bubble_fraction",
        "dominant_cost",
        "tp",
        "cp",
        "pp",
        "vpp",
        "dp",
        "ep",
        "zero_stage",
        "micro_batch_size",
        "pp_schedule",
        "recompute",
        "layout_text",
    )
    + tuple(f"time_{t}" for t in TIME_TERMS)
    + tuple(f"mem_{t}" for t in MEMORY_TERMS)
)

TOP_COLUMNS = (
    "rank",
    "label",
    "plan_name",
    "tp",
    "cp",
    "pp",
    "vpp",
    "dp",
    "ep",
    "pp_schedule",
    "recompute",
    "zero_stage",
    "micro_batch_size",
    "layout_text",
    "peak_memory_bytes",
    "memory_gib",
    "memory_capacity_gib",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "bubble_fraction",
    "dominant_cost",
    "trainer",
    "trainers",
)


def winner(run: RunData) -> pd.Series | None:
    """The best plan that fits (the first of the top-k), or None."""
    top = top_rows(run)
    return None if top.empty else top.iloc[0]


def top_rows(run: RunData) -> pd.DataFrame:
    """The top-k rows, in top.json's order: distinct plans, each on its fastest trainer, with every
    trainer that runs it (`trainers`, which the search priced plan by plan)."""
    entries = run.top.get("top", []) if isinstance(run.top.get("top"), list) else []
    k = len(entries) if entries else int(run.search.get("options", {}).get("top_k", 10))
    if not k:
        return run.plans.iloc[:0]
    if (
        entries
        and "plan_index" in run.plans.columns
        and all(isinstance(e, dict) and "plan_index" in e for e in entries)
    ):
        first = run.plans.drop_duplicates("plan_index")  # keeps the frame's index (the scatter's keys)
        pos = pd.Index(first["plan_index"]).get_indexer([int(e["plan_index"]) for e in entries])
        if (pos >= 0).all():
            rows = first.iloc[pos]
            return rows.assign(trainers=[", ".join(e.get("trainers") or [str(e.get("trainer", ""))]) for e in entries])
    if "trainer" not in run.plans.columns:  # a run directory from before trainers were searched
        return ranked(run.plans).head(k).assign(trainer="megatron", trainers="megatron")
    return top_plans(run.plans, k)


def trainer_table(run: RunData) -> pd.DataFrame:
    """The fastest plan that fits per searched trainer, and how much slower than the overall best."""
    if "trainer" not in run.plans.columns:
        return pd.DataFrame()
    best = {t: r for t, r in best_per_trainer(run.plans).items()}
    rows = [r.to_frame().T.assign(trainer=t) for t, r in best.items() if r is not None]
    if not rows:
        return pd.DataFrame()
    out = pd.concat(rows, ignore_index=True)
    out["memory_gib"] = out["peak_memory_bytes"].astype(float) / GIB
    out["vs_best"] = out["step_time_s"].astype(float) / out["step_time_s"].astype(float).min() - 1
    return out


def candidate_labels(top: pd.DataFrame) -> list[str]:
    """'#1 NAME', '#2 NAME', ...: the candidates' labels in the breakdowns."""
    return [f"#{i} {n}" for i, n in enumerate(top["plan_name"].astype(str), start=1)]


def top_table(run: RunData) -> pd.DataFrame:
    """The top-k table: one row per candidate, raw estimate numbers (plus GiB for display)."""
    top = top_rows(run).copy()
    top.insert(0, "rank", np.arange(1, len(top) + 1))
    top.insert(1, "label", candidate_labels(top))
    top["memory_gib"] = top["peak_memory_bytes"] / GIB
    top["memory_capacity_gib"] = top["memory_capacity_bytes"] / GIB
    return top.loc[:, list(TOP_COLUMNS)].reset_index(drop=True)


def time_breakdown(rows: pd.DataFrame, labels: list[str] | None = None) -> pd.DataFrame:
    """Step-time terms (seconds) per candidate; the terms sum to step_time_s."""
    out = pd.DataFrame(
        {t: rows[f"time_{t}"].to_numpy(dtype=float) for t in TIME_TERMS},
        index=pd.Index(labels or candidate_labels(rows), name="candidate"),
    )
    out["step_time_s"] = rows["step_time_s"].to_numpy(dtype=float)
    return out


def memory_breakdown(rows: pd.DataFrame, labels: list[str] | None = None) -> pd.DataFrame:
    """Memory terms per candidate (bytes); they sum to peak_memory_bytes. Plus the capacity."""
    out = pd.DataFrame(
        {t: rows[f"mem_{t}"].to_numpy(dtype=float) for t in MEMORY_TERMS},
        index=pd.Index(labels or candidate_labels(rows), name="candidate"),
    )
    out["peak_memory_bytes"] = rows["peak_memory_bytes"].to_numpy(dtype=float)
    out["memory_capacity_bytes"] = rows["memory_capacity_bytes"].to_numpy(dtype=float)
    return out
