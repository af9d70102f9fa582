"""The tables of `autopar compare`: every metric of several estimated layouts, aligned."""

from __future__ import annotations

import json
import math

import pandas as pd

from autopar.cost.figures import AXES, MEMORY_LABELS, MEMORY_TERMS, TIME_LABELS, TIME_TERMS
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
    "step_time_s": "lower",
    "tokens_per_s": "higher",
    "tokens_per_s_per_gpu": "higher",
    "model_tflops_per_gpu": "higher",
    "mfu": "higher",
    "peak_memory_bytes": "lower",
    "headroom_bytes": "higher",
    "step_time_s_high": "lower",
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
            "num_microbatches",
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
    ("verdict", "fits", "fits"),
    ("verdict", "reasons", "reasons"),
    ("time (s)", "step_time_s", "step time"),
    *(("time (s)", f"time_s.{t}", TIME_LABELS[t]) for t in TIME_TERMS),
    ("throughput", "tokens_per_s", "tokens/s"),
    ("throughput", "tokens_per_s_per_gpu", "tokens/s per GPU"),
    ("throughput", "model_tflops_per_gpu", "model TFLOP/s per GPU"),
    ("throughput", "mfu", "MFU"),
    ("throughput", "hfu", "HFU"),
    ("throughput", "bubble_fraction", "bubble fraction"),
    ("memory (GiB)", "peak_memory_bytes", "peak memory"),
    *(("memory (GiB)", f"memory_bytes.{t}", MEMORY_LABELS[t]) for t in MEMORY_TERMS),
    ("memory (GiB)", "memory_capacity_bytes", "capacity"),
    ("memory (GiB)", "headroom_bytes", "headroom"),
    ("memory (GiB)", "params_per_gpu", "parameters per GPU"),
    *(("comm per GPU per step (GB)", f"comm_bytes_per_gpu.{a}", a.upper()) for a in AXES),
    # how sure (autopar.calibration.uncertainty)
    ("how sure", "support", "support"),
    ("how sure", "step_time_s_low", "step time, 80 % interval low"),
    ("how sure", "step_time_s_high", "step time, 80 % interval high"),
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
        e["headroom_bytes"] = e["memory_capacity_bytes"] - e["peak_memory_bytes"]
        e["reasons"] = "; ".join(e.get("reasons") or [])
        e["step_time_s_low"], e["step_time_s_high"] = e.get("step_time_s_interval") or (None, None)
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
            "plan_name": e.get("name", ""),
            "step_time_s": e["step_time_s"],
            "peak_memory_bytes": e["peak_memory_bytes"],
            "memory_capacity_bytes": e["memory_capacity_bytes"],
            "tokens_per_s": e["tokens_per_s"],
        }
        r |= {f"time_{t}": e["time_s"][t] for t in TIME_TERMS}
        r |= {f"mem_{t}": e["memory_bytes"][t] for t in MEMORY_TERMS}
        r |= {f"comm_bytes_{a}": e["comm_bytes_per_gpu"][a] for a in AXES}
        data.append(r)
    return pd.DataFrame(data, index=pd.Index(labels, name="candidate"))


def comm_breakdown(rows: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """Bytes each GPU sends per step, per parallel axis."""
    return pd.DataFrame(
        {a: rows[f"comm_bytes_{a}"].to_numpy(float) for a in AXES}, index=pd.Index(labels, name="candidate")
    )
