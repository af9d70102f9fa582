"""The tables of `autopar compare`: every metric of several estimated layouts, aligned."""

from __future__ import annotations

import json
import math

import pandas as pd

from autopar.figures import (
    AXES,
    BUBBLE_FRACTION,
    COMM_BYTES,
    COMM_BYTES_PER_GPU,
    FITS,
    HFU,
    HIGH,
    INTERVAL,
    LOW,
    MEM,
    MEMORY_BYTES,
    MEMORY_CAPACITY_BYTES,
    MEMORY_LABELS,
    MEMORY_TERMS,
    MFU,
    MODEL_TFLOPS_PER_GPU,
    NUM_MICROBATCHES,
    PARAMS_PER_GPU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    STEP_TIME_S,
    SUPPORT,
    TIME,
    TIME_LABELS,
    TIME_S,
    TIME_TERMS,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
)
from autopar.report.trial_tables import trial_name
from autopar.spec.hardware import GIB

# ---- compare: layouts side by side ---------------------------------------------------------------

#: The rows a comparison ranks, and which way: "lower" or "higher" is better whatever the layouts
#: (the step time and what follows from it for one question, the peak memory and its headroom, the
#: pessimistic end of the step time's interval). Every other row is not ranked: the plan's knobs;
#: the parts of a total (the time, memory and traffic terms, parameters per GPU, the bubble
#: fraction), which one layout trades for another (ZeRO sheds weight memory for DP traffic, a
#: pipeline adds a bubble to shed TP traffic), so only their total says which is better; HFU, which
#: counts the recomputed forward (autopar.cost.flops), so more recompute raises it with no work
#: done; and the interval's optimistic end.
BETTER: dict[str, str] = {
    STEP_TIME_S: "lower",
    TOKENS_PER_S: "higher",
    TOKENS_PER_S_PER_GPU: "higher",
    MODEL_TFLOPS_PER_GPU: "higher",
    MFU: "higher",
    PEAK_MEMORY_BYTES: "lower",
    "headroom_bytes": "higher",
    HIGH[STEP_TIME_S]: "lower",
}

#: (section, key, label) rows of a comparison; key is a path into Estimate.to_dict()
#: ("plan.tp", "time_s.compute", ...); which way a row ranks: BETTER
COMPARE_ROWS: tuple[tuple[str, str, str], ...] = (
    ("layout", "name", "name"),
    *(
        ("layout", f"plan.{k}", k)
        for k in (
            "trainer",
            "tp",
            "cp",
            "pp",
            "vpp",
            "dp",
            "ep",
            "etp",
            "zero_stage",
            "sequence_parallel",
            "micro_batch_size",
            "global_batch_size",
            NUM_MICROBATCHES,
            "pp_schedule",
            "recompute",
            "recompute_layers",
            "recompute_modules",
            "dtype",
            "main_grads_fp32",
            "tp_comm_overlap",
            "compile",
        )
    ),
    ("layout", "layout", "stage layout"),
    ("verdict", FITS, FITS.header),
    ("verdict", "reasons", "reasons"),
    ("time (s)", STEP_TIME_S, "step time"),
    *(("time (s)", f"{TIME_S}.{t}", TIME_LABELS[t]) for t in TIME_TERMS),
    ("throughput", TOKENS_PER_S, "tokens/s"),
    ("throughput", TOKENS_PER_S_PER_GPU, "tokens/s per GPU"),
    ("throughput", MODEL_TFLOPS_PER_GPU, "model TFLOP/s per GPU"),
    ("throughput", MFU, "MFU"),
    ("throughput", HFU, "HFU"),
    ("throughput", BUBBLE_FRACTION, "bubble fraction"),
    ("memory (GiB)", PEAK_MEMORY_BYTES, "peak memory"),
    *(("memory (GiB)", f"{MEMORY_BYTES}.{t}", MEMORY_LABELS[t]) for t in MEMORY_TERMS),
    ("memory (GiB)", MEMORY_CAPACITY_BYTES, "capacity"),
    ("memory (GiB)", "headroom_bytes", "headroom"),
    ("memory (GiB)", PARAMS_PER_GPU, "parameters per GPU"),
    *(("comm per GPU per step (GB)", f"{COMM_BYTES_PER_GPU}.{a}", a.upper()) for a in AXES),
    # how sure (autopar.calibration.uncertainty)
    ("how sure", SUPPORT, SUPPORT.header),
    ("how sure", LOW[STEP_TIME_S], "step time, 80 % interval low"),
    ("how sure", HIGH[STEP_TIME_S], "step time, 80 % interval high"),
)
#: display scale of a row's raw value, by section
COMPARE_SCALE = {"memory (GiB)": GIB, "comm per GPU per step (GB)": 1e9}


def _path(d: object, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def compare_table(labels: list[str], estimates: list[dict]) -> pd.DataFrame:
    """Every metric of every compared plan, aligned: one row per metric, one column per plan (raw
    values: seconds, bytes, fractions), plus `differs` (not all equal) and `best` (the labels with
    the best value, for ranked numeric rows that differ)."""
    if len(labels) != len(estimates) or len(set(labels)) != len(labels):
        raise ValueError("compare_table needs one unique label per estimate")
    ests = []
    for e in estimates:
        e = dict(e)
        e["name"] = e.get("name") or trial_name(e.get("plan", {}), "?")
        e["headroom_bytes"] = e[MEMORY_CAPACITY_BYTES] - e[PEAK_MEMORY_BYTES]
        e["reasons"] = "; ".join(e.get("reasons") or [])
        e[LOW[STEP_TIME_S]], e[HIGH[STEP_TIME_S]] = e.get(INTERVAL[STEP_TIME_S]) or (None, None)
        ests.append(e)
    rows = []
    for section, key, label in COMPARE_ROWS:
        better = BETTER.get(key, "")
        vals = [_path(e, key) for e in ests]
        if key in ("plan.recompute_layers", "plan.recompute_modules") and all(v is None for v in vals):
            continue
        differs = len({json.dumps(v, sort_keys=True, default=str) for v in vals}) > 1
        best = ""
        if better and differs and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            target = min(vals) if better == "lower" else max(vals)
            best = ", ".join(lab for lab, v in zip(labels, vals) if math.isclose(v, target, rel_tol=1e-12, abs_tol=0))
        rows.append(
            {
                "section": section,
                "key": key,
                "metric": label,
                "better": better,
                "scale": COMPARE_SCALE.get(section, 1.0),
                **dict(zip(labels, vals)),
                "differs": differs,
                "best": best,
            }
        )
    return pd.DataFrame(rows)


def estimate_rows(labels: list[str], estimates: list[dict]) -> pd.DataFrame:
    """Estimate dicts as plans.parquet-style rows (time_*, mem_*, ...), for the breakdown frames."""
    data = []
    for e in estimates:
        r = {
            PLAN_NAME: e.get("name", ""),
            STEP_TIME_S: e[STEP_TIME_S],
            PEAK_MEMORY_BYTES: e[PEAK_MEMORY_BYTES],
            MEMORY_CAPACITY_BYTES: e[MEMORY_CAPACITY_BYTES],
            TOKENS_PER_S: e[TOKENS_PER_S],
        }
        r |= {TIME[t]: e[TIME_S][t] for t in TIME_TERMS}
        r |= {MEM[t]: e[MEMORY_BYTES][t] for t in MEMORY_TERMS}
        r |= {COMM_BYTES[a]: e[COMM_BYTES_PER_GPU][a] for a in AXES}
        data.append(r)
    return pd.DataFrame(data, index=pd.Index(labels, name="candidate"))


def comm_breakdown(rows: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """Bytes each GPU sends per step, per parallel axis."""
    return pd.DataFrame(
        {a: rows[COMM_BYTES[a]].to_numpy(float) for a in AXES}, index=pd.Index(labels, name="candidate")
    )
