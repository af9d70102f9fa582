"""The report's tables of what ran besides the analytic search: Optuna's history, the measured
trials (predicted vs measured) and a what-if's best plan per scenario."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from autopar.figures import (
    COST,
    DAYS,
    GOODPUT,
    GPU_HOURS,
    INTERVAL,
    MEMORY_CAPACITY_BYTES,
    MEMORY_GIB,
    MFU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
)
from autopar.report.answer_text import scenario_label
from autopar.report.run_data import RunData
from autopar.report.top_tables import winner
from autopar.spec.hardware import GIB

# ---- Optuna ----------------------------------------------------------------------------------------


def optuna_history(run: RunData) -> pd.DataFrame:
    """Optuna's trials in order: objective (step time), feasible, best feasible so far. Empty when
    the search was exhaustive."""
    hist = run.search.get("history") or []
    df = pd.DataFrame(hist, columns=["number", STEP_TIME_S, "feasible", "best_so_far"])
    if df.empty:
        return df
    for c in (STEP_TIME_S, "best_so_far"):
        df[c] = pd.to_numeric(df[c], errors="coerce").replace([np.inf, -np.inf], np.nan)
    df["feasible"] = df["feasible"].astype(bool)
    return df.sort_values("number", kind="stable").reset_index(drop=True)


# ---- trials: predicted vs measured --------------------------------------------------------------


def _num(d: dict, key: str) -> float:
    v: Any = d.get(key) if isinstance(d, dict) else None  # a JSON value: float() decides
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def trial_name(plan: dict, fallback: str) -> str:
    try:
        from autopar.spec.plan import ParallelPlan

        return ParallelPlan.from_dict(plan).describe()
    except Exception:  # a plan dict from a newer/older trials layer: its file name will do
        return fallback


def relative_error(predicted, measured):
    """(predicted - measured) / measured: positive = the model over-predicts."""
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(measured > 0, (predicted - measured) / measured, np.nan)


def _trial_kind(t: dict) -> str:
    """How the trial ran: full size, as a proxy (scaled back), with the user's own trainer, or not at
    all here."""
    kind = str(t.get("kind") or ("proxy" if t.get("proxy") else ""))
    if t.get("status") == "not-runnable" or kind == "not-runnable":
        return "not run"
    if t.get("measured_with"):  # autopar.measured.own_run: the trainer's own code ran the plan
        return f"{t['measured_with']}" + (" (other hardware)" if t.get("cross_hardware") else "")
    return kind or "full"


def _trial_note(t: dict) -> str:
    """What a proxy changed, or why a trial did not run or failed."""
    if t.get("status") not in ("ok", "pruned", None) or _trial_kind(t) == "not run":
        return "; ".join(str(r) for r in t.get("reasons") or [])
    proxy = t.get("proxy") or {}
    return str(proxy.get("summary") or ", ".join(proxy.get("changes") or []))


def trials_table(trials: list[dict], intervals: dict | None = None) -> pd.DataFrame:
    """One row per trialled plan: how it ran (full / proxy / not run), predicted and measured step
    time and peak memory (a proxy's scaled back to the plan), the errors (absolute: predicted -
    measured; relative: / measured), the proxy's own measured and predicted step time, a note:
    what the proxy changed, or why the trial did not run; and the step time's 80 % interval before
    and after calibration (`intervals`: search.json's measured.intervals.plans, by trial key)."""
    rows = []
    intervals = intervals if isinstance(intervals, dict) else {}
    for t in trials:
        pred, meas = t.get("predicted") or {}, t.get("measured") or {}
        own = proxy if isinstance(proxy := meas.get("proxy"), dict) else {}
        key = str(t.get("_file", "")).removesuffix(".json")
        mine = got if isinstance(got := intervals.get(key), dict) else {}
        before = _pair(pred.get(INTERVAL[STEP_TIME_S]))
        after = _pair(mine.get("after"))
        rows.append(
            {
                "trial": str(t.get("_file", "")).removesuffix(".json"),
                PLAN_NAME: trial_name(t.get("plan") or {}, str(t.get("_file", "?"))),
                "status": str(t.get("status", "ok" if meas else "")),
                "kind": _trial_kind(t),
                "predicted_step_time_s": _num(pred, STEP_TIME_S),
                "measured_step_time_s": _num(meas, STEP_TIME_S),
                "predicted_peak_memory_bytes": _num(pred, PEAK_MEMORY_BYTES),
                "measured_peak_memory_bytes": _num(meas, PEAK_MEMORY_BYTES),
                "proxy_step_time_s": _num(own, STEP_TIME_S),
                "proxy_predicted_step_time_s": _num(own, "predicted_step_time_s"),
                "note": _trial_note(t),
                "interval_before_low": before[0],
                "interval_before_high": before[1],
                "interval_after_low": after[0],
                "interval_after_high": after[1],
            }
        )
    cols = [
        "trial",
        PLAN_NAME,
        "status",
        "kind",
        "predicted_step_time_s",
        "measured_step_time_s",
        "predicted_peak_memory_bytes",
        "measured_peak_memory_bytes",
        "proxy_step_time_s",
        "proxy_predicted_step_time_s",
        "note",
        "interval_before_low",
        "interval_before_high",
        "interval_after_low",
        "interval_after_high",
    ]
    df = pd.DataFrame(rows, columns=cols)
    df["step_time_error_s"] = df["predicted_step_time_s"] - df["measured_step_time_s"]
    df["step_time_error"] = relative_error(df["predicted_step_time_s"], df["measured_step_time_s"])
    df["predicted_memory_gib"] = df["predicted_peak_memory_bytes"] / GIB
    df["measured_memory_gib"] = df["measured_peak_memory_bytes"] / GIB
    df["memory_error_gib"] = df["predicted_memory_gib"] - df["measured_memory_gib"]
    df["memory_error"] = relative_error(df["predicted_peak_memory_bytes"], df["measured_peak_memory_bytes"])
    return df


def _pair(v) -> tuple[float, float]:
    """[low, high] of a trial file or search.json as two floats (NaN where absent or not numbers)."""
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        return float(v[0]), float(v[1])
    return math.nan, math.nan


def trials_summary(df: pd.DataFrame) -> dict:
    """Mean absolute relative error of step time and memory over the trials that have both numbers."""

    def mape(col: str) -> float:
        return float(np.nanmean(np.abs(df[col]))) if df[col].notna().any() else math.nan

    return {"trials": int(len(df)), "step_time_mape": mape("step_time_error"), "memory_mape": mape("memory_error")}


# ---- what-if: the best plan per scenario ---------------------------------------------------------

WHATIF_COLUMNS = (
    "scenario",
    "num_gpus",
    "gpu",
    "seq_len",
    "global_batch_size",
    PLAN_NAME,
    "pp_schedule",
    "recompute",
    "zero_stage",
    "micro_batch_size",
    PEAK_MEMORY_BYTES,
    MEMORY_GIB,
    "memory_capacity_gib",
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    MFU,
    "plans_fit",
    "run_dir",
    "current",
    DAYS,
    GOODPUT,
    GPU_HOURS,
    COST,
)
#: the whole-run figures a scenario has with --tokens (NaN without)
WHATIF_RUN = (DAYS, GOODPUT, GPU_HOURS, COST)


def whatif_table(runs: list[RunData], current: Path | None = None) -> pd.DataFrame:
    """One row per scenario: the question's knobs and its best plan (NaN numbers: nothing fits)."""
    rows = []
    cur = Path(current).resolve() if current is not None else None
    for r in runs:
        q = r.question
        w = winner(r)
        row: dict[str, Any] = {
            "scenario": scenario_label(q),
            "num_gpus": q.get("num_gpus"),
            "gpu": q.get("cluster", {}).get("gpu"),
            "seq_len": q.get("seq_len"),
            "global_batch_size": q.get("global_batch_size"),
            "plans_fit": r.plans_fit,
            "run_dir": str(r.run_dir),
            "current": cur is not None and Path(r.run_dir).resolve() == cur,
        }
        if w is None:
            nothing: dict[str, Any] = {
                PLAN_NAME: "nothing fits",
                "pp_schedule": "",
                "recompute": "",
                "zero_stage": np.nan,
                "micro_batch_size": np.nan,
                PEAK_MEMORY_BYTES: np.nan,
                MEMORY_GIB: np.nan,
                "memory_capacity_gib": np.nan,
                STEP_TIME_S: np.nan,
                TOKENS_PER_S: np.nan,
                TOKENS_PER_S_PER_GPU: np.nan,
                MFU: np.nan,
                **{k: np.nan for k in WHATIF_RUN},
            }
            row.update(nothing)
        else:
            row.update(
                {
                    k: w[k]
                    for k in (
                        PLAN_NAME,
                        "pp_schedule",
                        "recompute",
                        "zero_stage",
                        "micro_batch_size",
                        PEAK_MEMORY_BYTES,
                        STEP_TIME_S,
                        TOKENS_PER_S,
                        TOKENS_PER_S_PER_GPU,
                        MFU,
                    )
                }
            )
            row[MEMORY_GIB] = w[PEAK_MEMORY_BYTES] / GIB
            row["memory_capacity_gib"] = w[MEMORY_CAPACITY_BYTES] / GIB
            row.update({k: float(w[k]) if k in w.index else np.nan for k in WHATIF_RUN})
        rows.append(row)
    return pd.DataFrame(rows, columns=list(WHATIF_COLUMNS))
