"""The report's top-k, in one step from a run (autopar.report.run_data) to plain pandas frames:
the plans of top.json, the best plan per trainer, and where each candidate's step time and memory
go. Also the columns of the plans frame the report reads (checked when a run is loaded).

Every frame keeps the raw numbers of the run (seconds, bytes, tokens/s, fractions) next to derived
display units (GiB), so tests can compare them with the estimates exactly.

How sure (autopar.calibration.uncertainty): the top-k rows carry each figure's 80 % interval as
`<figure>_low` / `<figure>_high` and `support` ("calibrated" | "extrapolated") with
`support_reason`, from top.json's entries where they have them, else from scatter.parquet's
columns (the support then from `support_gaps`); NaN and "" in a run directory written before the
intervals.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from autopar.calibration.support import GAP_BIT, GAP_NAMES
from autopar.calibration.uncertainty import support_word
from autopar.figures import (
    BUBBLE_FRACTION,
    DOMINANT_COST,
    HIGH,
    INTERVAL,
    INTERVAL_FIGURES,
    LAYOUT_TEXT,
    LOW,
    MEM,
    MEMORY_CAPACITY_BYTES,
    MEMORY_GIB,
    MEMORY_TERMS,
    MFU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    STEP_TIME_S,
    SUPPORT,
    SUPPORT_GAPS,
    SUPPORT_REASON,
    TIME,
    TIME_TERMS,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    VARIANT_OF,
    VS_BEST,
    VS_LEADER,
)
from autopar.report.run_data import RunData
from autopar.search.results import STRUCTURE_KEY, best_per_trainer, ranked, top_plans
from autopar.spec.hardware import GIB
from autopar.spec.plan import FIELDS

#: the interval columns of a run's frames (scatter.parquet, plans.parquet); optional: a run
#: directory written before the intervals has none
INTERVAL_COLUMNS = tuple(bound[f] for f in INTERVAL_FIGURES for bound in (LOW, HIGH))

TOP_COLUMNS = (
    "rank",
    "label",
    PLAN_NAME,
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
    LAYOUT_TEXT,
    PEAK_MEMORY_BYTES,
    MEMORY_GIB,
    "memory_capacity_gib",
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    MFU,
    BUBBLE_FRACTION,
    DOMINANT_COST,
    "trainer",
    "trainers",
    "variants",
    *INTERVAL_COLUMNS,
    SUPPORT,
    SUPPORT_REASON,
)


def winner(run: RunData) -> pd.Series | None:
    """The best plan that fits (the first of the top-k), or None."""
    top = top_rows(run)
    return None if top.empty else top.iloc[0]


def top_rows(run: RunData) -> pd.DataFrame:
    """The top-k rows, in top.json's order: distinct plans, each on its fastest trainer, with every
    trainer that runs it (`trainers`, which the search priced plan by plan). Built once per loaded
    run (RunData.derived); each caller gets its own copy to change."""
    if "top_rows" not in run.derived:
        run.derived["top_rows"] = _top_rows(run)
    return run.derived["top_rows"].copy()


def _top_rows(run: RunData) -> pd.DataFrame:
    entries = run.top.get("top", []) if isinstance(run.top.get("top"), list) else []
    k = len(entries) if entries else int(run.search.get("options", {}).get("top_k", 10))
    if not k:
        return with_uncertainty(run.plans.iloc[:0])
    if (
        entries
        and "plan_index" in run.plans.columns
        and all(isinstance(e, dict) and "plan_index" in e for e in entries)
    ):
        first = run.plans.drop_duplicates("plan_index")  # keeps the frame's index (the scatter's keys)
        pos = pd.Index(first["plan_index"]).get_indexer([int(e["plan_index"]) for e in entries])
        if (pos >= 0).all():
            rows = first.iloc[pos]
            rows = rows.assign(
                trainers=[
                    ", ".join(e.get("trainers") or [str(e.get("trainer", ""))]) + _with_flags(e) for e in entries
                ],
                variants=[_count(e.get("variants")) for e in entries],
            )
            return with_uncertainty(rows, entries)
    if "trainer" not in run.plans.columns:  # a run directory from before trainers were searched
        return with_uncertainty(ranked(run.plans).head(k).assign(trainer="megatron", trainers="megatron"))
    return with_uncertainty(top_plans(run.plans, k))


def _count(value: object) -> int:
    """A top.json count, 0 where the entry has none (a run directory written before variants)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


#: short names of the plan fields a variant can change (the others print as their field name)
_VARIANT_NAMES = {
    "micro_batch_size": "mbs",
    "zero_stage": "ZeRO",
    "layout": "stages",
    "sequence_parallel": "SP",
    "tp_comm_overlap": "TP overlap",
    "main_grads_fp32": "fp32 grads",
    "moe_dispatch": "dispatch",
    "moe_dispatcher": "dispatcher",
    "ep_comm_overlap": "EP overlap",
}
#: the plan fields a variant differs from its leader in: every field of the plan key outside the
#: structure (autopar.search.results.STRUCTURE_KEY), so a new knob is named without a list to edit
_VARIANT_FIELDS = {
    f.name: _VARIANT_NAMES.get(f.name, f.name.replace("_", " "))
    for f in FIELDS
    if f.plan_key and f.name not in STRUCTURE_KEY and f.name != "global_batch_size"
}


def variant_table(run: RunData) -> pd.DataFrame:
    """The variants top.json folds under the top plans (autopar.search.results.STRUCTURE_KEY: the
    same process grid, schedule and recompute; another mbs, ZeRO stage, stage layout or flag): of
    which rank each is a variant, what it changes, and how much slower it is."""
    entries, top = _of_type(run.top, "variants", list), _of_type(run.top, "top", list)
    rows = []
    for v in entries:
        rank = v.get(VARIANT_OF) if isinstance(v, dict) else None
        if not isinstance(rank, int) or not 1 <= rank <= len(top) or not isinstance(top[rank - 1], dict):
            continue
        lead = top[rank - 1]
        plan, lead_plan = v.get("plan") or {}, lead.get("plan") or {}
        changes = [
            f"{name} {_shown(lead_plan.get(f))} -> {_shown(plan.get(f))}"
            for f, name in _VARIANT_FIELDS.items()
            if plan.get(f) != lead_plan.get(f)
        ]
        step, lead_step = float(v.get(STEP_TIME_S, math.nan)), float(lead.get(STEP_TIME_S, math.nan))
        rows.append(
            {
                VARIANT_OF: rank,
                PLAN_NAME: str(v.get(PLAN_NAME, "")),
                "changes": ", ".join(changes) or "the trainer",
                MEMORY_GIB: float(v.get(PEAK_MEMORY_BYTES, math.nan)) / GIB,
                STEP_TIME_S: step,
                VS_LEADER: step / lead_step - 1 if lead_step > 0 else math.nan,
                "trainers": ", ".join(str(t) for t in v.get("trainers") or [v.get("trainer", "")]),
            }
        )
    out = pd.DataFrame(rows, columns=VARIANT_COLUMNS)
    return out.sort_values([VARIANT_OF, STEP_TIME_S], kind="stable").reset_index(drop=True)


VARIANT_COLUMNS = (VARIANT_OF, PLAN_NAME, "changes", MEMORY_GIB, STEP_TIME_S, VS_LEADER, "trainers")


def _of_type(doc: dict, key: str, kind: type):
    """doc[key] when it is of `kind` (a list or a dict), else an empty one: a run directory written
    before the key, or a corrupt one, shows nothing rather than failing."""
    value = doc.get(key)
    return value if isinstance(value, kind) else kind()


def _shown(value: object) -> str:
    """A plan value as the variants table prints it: on/off, 'auto' for a default left to the trainer."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "auto"
    if isinstance(value, list):
        return "/".join(str(x) for x in value)
    return str(value)


def dropped_trainers(run: RunData) -> pd.DataFrame:
    """Each searched trainer with no plan that fits, and why: the capability line that rules it out
    for every plan of the space (top.json `trainers_ruled_out`), else memory (its valid plans all
    exceed the GPU)."""
    searched = _of_type(run.question, "trainers", list)
    per, ruled = _of_type(run.top, "per_trainer", dict), _of_type(run.top, "trainers_ruled_out", dict)
    rows = [
        {"trainer": str(t), "why": str(ruled.get(t) or "no plan of the space fits in memory with this trainer")}
        for t in searched
        if t in per and per[t] is None
    ]
    return pd.DataFrame(rows, columns=["trainer", "why"])


def gap_text(gaps: int) -> str:
    """The support gaps of a bitmask (autopar.calibration.support.GAP_NAMES) in a few words, for
    rows the run's JSON does not describe."""
    names = [n for n in GAP_NAMES if gaps & GAP_BIT[n]]
    if not names:
        return "within the published runs of its profile"
    return "beyond every published run of its profile in: " + ", ".join(names)


def _pair(value) -> tuple[float, float] | None:
    """An interval of the run's JSON, [low, high], as two finite floats; None for anything else."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    try:
        lo, hi = float(value[0]), float(value[1])
    except OverflowError:  # an integer beyond any float
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def with_uncertainty(rows: pd.DataFrame, entries: list | None = None) -> pd.DataFrame:
    """The rows with every interval column (INTERVAL_COLUMNS) and `support` / `support_reason`.
    `entries`: the run's JSON of the same plans, in order (top.json's `top`): their
    `<figure>_interval` pairs and `support` / `support_reason` win over the frame's columns. Where
    neither has them (an older run directory): NaN and ""."""
    n = len(rows)
    out = {}
    for f in INTERVAL_FIGURES:
        lo = rows[LOW[f]].to_numpy(float).copy() if LOW[f] in rows.columns else np.full(n, np.nan)
        hi = rows[HIGH[f]].to_numpy(float).copy() if HIGH[f] in rows.columns else np.full(n, np.nan)
        for i, e in enumerate(entries or []):
            if (pair := _pair(e.get(INTERVAL[f]) if isinstance(e, dict) else None)) is not None:
                lo[i], hi[i] = pair
        out[LOW[f]], out[HIGH[f]] = lo, hi
    support, reason = [""] * n, [""] * n
    if SUPPORT_GAPS in rows.columns:
        for i, g in enumerate(rows[SUPPORT_GAPS].tolist()):
            if g is not None and g == g:  # not NaN
                support[i] = support_word(int(g))
                reason[i] = gap_text(int(g))
    for i, e in enumerate(entries or []):
        if isinstance(e, dict) and isinstance(e.get(SUPPORT), str):
            support[i], reason[i] = e[SUPPORT], str(e.get(SUPPORT_REASON, ""))
    out[SUPPORT], out[SUPPORT_REASON] = support, reason
    return rows.assign(**out)


def trainer_table(run: RunData) -> pd.DataFrame:
    """Each searched trainer's plan as top.json's `per_trainer` names it (the search's choice: the
    fastest that fits, or the one the headroom rule ranks first), else the fastest that fits; and how
    much slower than the overall best."""
    if "trainer" not in run.plans.columns:
        return pd.DataFrame()
    best = {t: _chosen(run, t, r) for t, r in best_per_trainer(run.plans).items()}
    rows = [r.to_frame().T.assign(trainer=t) for t, r in best.items() if r is not None]
    if not rows:
        return pd.DataFrame()
    out = pd.concat(rows, ignore_index=True)
    out = with_uncertainty(out, [_trainer_entry(run, r) for _, r in out.iterrows()])
    out[MEMORY_GIB] = out[PEAK_MEMORY_BYTES].astype(float) / GIB
    out[VS_BEST] = out[STEP_TIME_S].astype(float) / out[STEP_TIME_S].astype(float).min() - 1
    return out


def _chosen(run: RunData, trainer: str, fastest: pd.Series | None) -> pd.Series | None:
    """The trainer's plan top.json's `per_trainer` names, when the run kept it; else `fastest`."""
    per = run.top.get("per_trainer")
    e = per.get(trainer) if isinstance(per, dict) else None
    if fastest is None or not isinstance(e, dict) or "plan_index" not in run.plans.columns:
        return fastest
    rows = run.plans[(run.plans["plan_index"] == e.get("plan_index")) & (run.plans["trainer"] == trainer)]
    return rows.iloc[0] if len(rows) else fastest


def _trainer_entry(run: RunData, row: pd.Series) -> dict | None:
    """top.json's `per_trainer` entry of the row's trainer, when it is the row's plan."""
    per = run.top.get("per_trainer")
    e = per.get(str(row["trainer"])) if isinstance(per, dict) else None
    if isinstance(e, dict) and "plan_index" in row.index and e.get("plan_index") == row["plan_index"]:
        return e
    return None


def _with_flags(entry: dict) -> str:
    """', megatron (with --fp8-recipe delayed --fp8-param-gather on)' for the trainers that run an FP8
    plan once its FP8 settings are named (top.json `trainers_with_flags`, `fp8_flags`); '' without."""
    more, flags = entry.get("trainers_with_flags"), entry.get("fp8_flags")
    if not isinstance(more, list) or not isinstance(flags, str) or not more:
        return ""
    return "".join(f", {t} (with {flags})" for t in more if isinstance(t, str))


def candidate_labels(top: pd.DataFrame) -> list[str]:
    """'#1 NAME', '#2 NAME', ...: the candidates' labels in the breakdowns."""
    return [f"#{i} {n}" for i, n in enumerate(top[PLAN_NAME].astype(str), start=1)]


def top_table(run: RunData) -> pd.DataFrame:
    """The top-k table: one row per candidate, raw estimate numbers (plus GiB for display)."""
    top = top_rows(run).copy()
    top.insert(0, "rank", np.arange(1, len(top) + 1))
    top.insert(1, "label", candidate_labels(top))
    top[MEMORY_GIB] = top[PEAK_MEMORY_BYTES] / GIB
    top["memory_capacity_gib"] = top[MEMORY_CAPACITY_BYTES] / GIB
    return top.loc[:, list(TOP_COLUMNS)].reset_index(drop=True)


def time_breakdown(rows: pd.DataFrame, labels: list[str] | None = None) -> pd.DataFrame:
    """Step-time terms (seconds) per candidate; the terms sum to step_time_s. Plus the step time's
    80 % interval (step_time_s_low, step_time_s_high) where the rows have one."""
    out = pd.DataFrame(
        {t: rows[TIME[t]].to_numpy(dtype=float) for t in TIME_TERMS},
        index=pd.Index(labels or candidate_labels(rows), name="candidate"),
    )
    out[STEP_TIME_S] = rows[STEP_TIME_S].to_numpy(dtype=float)
    for bound in (LOW[STEP_TIME_S], HIGH[STEP_TIME_S]):  # the step time's 80 % interval, where the rows have one
        if bound in rows.columns:
            out[bound] = rows[bound].to_numpy(dtype=float)
    return out


def memory_breakdown(rows: pd.DataFrame, labels: list[str] | None = None) -> pd.DataFrame:
    """Memory terms per candidate (bytes); they sum to peak_memory_bytes. Plus the capacity."""
    out = pd.DataFrame(
        {t: rows[MEM[t]].to_numpy(dtype=float) for t in MEMORY_TERMS},
        index=pd.Index(labels or candidate_labels(rows), name="candidate"),
    )
    out[PEAK_MEMORY_BYTES] = rows[PEAK_MEMORY_BYTES].to_numpy(dtype=float)
    out[MEMORY_CAPACITY_BYTES] = rows[MEMORY_CAPACITY_BYTES].to_numpy(dtype=float)
    return out
