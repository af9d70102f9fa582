"""Figures of what ran besides the analytic search (`trial_tables`): Optuna's optimisation
history, the measured trials against their predictions, and a what-if's best plan per scenario
(throughput; days to train and cost against the GPU count)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from autopar.figures import (
    COST,
    DAYS,
    GPU_HOURS,
    MEMORY_GIB,
    MFU,
    PLAN_NAME,
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
)
from autopar.report.figure_base import deadline, figure_layout, floats


def history_figure(h: pd.DataFrame) -> dict:
    """Optuna's optimisation history: each trial's predicted step time and the best so far."""
    data = []
    for feasible, name, colour in ((True, "trial (fits)", "#4c78a8"), (False, "trial (predicted OOM)", "#ff7f0e")):
        s = h[h["feasible"] == feasible]
        if len(s):
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": name,
                    "x": s["number"].tolist(),
                    "y": floats(s[STEP_TIME_S]),
                    "marker": {"color": colour, "size": 6},
                    "hovertemplate": "trial %{x}: %{y:.3f} s<extra></extra>",
                }
            )
    data.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "best so far",
            "x": h["number"].tolist(),
            "y": floats(h["best_so_far"]),
            "line": {"color": "#d62728", "width": 2, "shape": "hv"},
            "hovertemplate": "after trial %{x}: best %{y:.3f} s<extra></extra>",
        }
    )
    return {
        "data": data,
        "layout": figure_layout(
            "Optuna optimisation history",
            420,
            xaxis={"title": {"text": "trial"}},
            yaxis={"title": {"text": "predicted step time (s)"}, "automargin": True},
        ),
    }


def _parity(tt: pd.DataFrame, pred: str, meas: str, err: str, unit: str, title: str, fmt: str) -> dict:
    p, m = tt[pred].to_numpy(float), tt[meas].to_numpy(float)
    ok = np.isfinite(p) & np.isfinite(m)
    lo = float(np.min(np.concatenate([p[ok], m[ok]]))) if ok.any() else 0.0
    hi = float(np.max(np.concatenate([p[ok], m[ok]]))) if ok.any() else 1.0
    pad = 0.05 * (hi - lo or hi or 1.0)
    text = np.array(
        [
            f"{n} ({t})<br>error {100 * e:+.1f}%" if math.isfinite(e) else f"{n} ({t})"
            for n, t, e in zip(tt[PLAN_NAME], tt["trial"], tt[err].to_numpy(float))
        ],
        dtype=object,
    )
    proxy = (tt["kind"] == "proxy").to_numpy() if "kind" in tt.columns else np.zeros(len(tt), bool)
    data = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "predicted = measured",
            "x": [lo - pad, hi + pad],
            "y": [lo - pad, hi + pad],
            "line": {"color": "#999", "dash": "dash"},
            "hoverinfo": "skip",
        }
    ]
    for sel, name, colour, symbol in (
        (~proxy, "trialled plan", "#4c78a8", "circle"),
        (proxy, "proxy (scaled back)", "#f58518", "diamond"),
    ):
        if sel.any() or name == "trialled plan":
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": name,
                    "x": floats(m[sel]),
                    "y": floats(p[sel]),
                    "text": text[sel].tolist(),
                    "marker": {"color": colour, "size": 10, "symbol": symbol},
                    "hovertemplate": f"%{{text}}<br>measured %{{x:{fmt}}} {unit}<br>predicted %{{y:{fmt}}} {unit}"
                    f"<extra></extra>",
                }
            )
    square = [lo - pad, hi + pad]  # one range on both axes: the diagonal is at 45 degrees
    return {
        "data": data,
        "layout": figure_layout(
            title,
            420,
            xaxis={"title": {"text": f"measured ({unit})"}, "range": square},
            yaxis={"title": {"text": f"predicted ({unit})"}, "range": square},
        ),
    }


def trials_figures(tt: pd.DataFrame) -> list[dict]:
    """Predicted vs measured step time and peak memory, one point per trialled plan."""
    return [
        _parity(
            tt,
            "predicted_step_time_s",
            "measured_step_time_s",
            "step_time_error",
            "s",
            "Trials: predicted vs measured step time",
            ".3f",
        ),
        _parity(
            tt,
            "predicted_memory_gib",
            "measured_memory_gib",
            "memory_error",
            "GiB",
            "Trials: predicted vs measured peak memory",
            ".1f",
        ),
    ]


def whatif_figure(wt: pd.DataFrame) -> dict:
    """The best plan per scenario: its throughput, labelled with the layout and MFU."""
    text = [
        name if not math.isfinite(mfu) else f"{name}<br>{100 * mfu:.1f}% MFU"
        for name, mfu in zip(wt[PLAN_NAME], wt[MFU].to_numpy(float))
    ]
    colours = ["#f58518" if c else "#4c78a8" for c in wt["current"]]
    data = [
        {
            "type": "bar",
            "name": "best plan",
            "x": wt["scenario"].tolist(),
            "y": floats(wt[TOKENS_PER_S]),
            "text": text,
            "textposition": "auto",
            "marker": {"color": colours},
            "customdata": np.column_stack(
                [floats(wt[STEP_TIME_S]), floats(wt[MEMORY_GIB]), floats(wt[TOKENS_PER_S_PER_GPU])]
            ).tolist(),
            "hovertemplate": "%{x}<br>%{text}<br>%{y:,.0f} tokens/s (%{customdata[2]:,.0f} per GPU)<br>"
            "%{customdata[0]:.3f} s/step, %{customdata[1]:.1f} GiB<extra></extra>",
        }
    ]
    return {
        "data": data,
        "layout": figure_layout(
            "What-if: the best plan per scenario (tokens/s)",
            440,
            showlegend=False,
            xaxis={"type": "category", "automargin": True},
            yaxis={"title": {"text": "tokens/s"}, "rangemode": "tozero"},
        ),
    }


def whatif_run_figure(wt: pd.DataFrame, deadline_days: float | None = None) -> dict:
    """Days to train (left axis) and cost or GPU-hours (right axis, dotted) against the GPU count,
    one line per GPU kind, sequence length and batch, with the deadline."""
    priced = bool(wt[COST].notna().any())
    money, label = (COST, COST.header) if priced else (GPU_HOURS, GPU_HOURS.header)
    data = []
    for name, colour, g in _gpu_count_lines(wt):
        x = g["num_gpus"].astype(float).tolist()
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{name}: days",
                "x": x,
                "y": floats(g[DAYS]),
                "text": g[PLAN_NAME].tolist(),
                "line": {"color": colour},
                "hovertemplate": "%{x} GPUs: %{y:.1f} days<br>%{text}<extra></extra>",
            }
        )
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{name}: {label}",
                "x": x,
                "y": floats(g[money]),
                "yaxis": "y2",
                "line": {"dash": "dot", "color": colour},
                "hovertemplate": f"%{{x}} GPUs: {label} %{{y:,.3s}}<extra></extra>",
            }
        )
    shapes, notes = deadline(deadline_days, "y")
    layout = figure_layout(
        f"What-if: days to train and {label} against GPUs",
        460,
        shapes=shapes,
        annotations=notes,
        xaxis=_gpus_axis(wt),
        yaxis={"title": {"text": "days to train"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": label},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "automargin": True,
        },
    )
    return {"data": data, "layout": layout}


def whatif_mfu_figure(wt: pd.DataFrame) -> dict:
    """MFU of the best plan per scenario against the GPU count, one line per GPU kind, sequence
    length and batch (how well each GPU count uses its GPUs)."""
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": name,
            "x": g["num_gpus"].astype(float).tolist(),
            "y": floats(100 * g[MFU].astype(float)),
            "text": g[PLAN_NAME].tolist(),
            "line": {"color": colour},
            "hovertemplate": "%{x} GPUs: %{y:.1f}% MFU<br>%{text}<extra></extra>",
        }
        for name, colour, g in _gpu_count_lines(wt)
    ]
    layout = figure_layout(
        "What-if: MFU of the best plan against GPUs",
        420,
        xaxis=_gpus_axis(wt),
        yaxis={"title": {"text": "MFU (%)"}, "rangemode": "tozero"},
    )
    return {"data": data, "layout": layout}


def _gpu_count_lines(wt: pd.DataFrame):
    """(name, colour, rows by GPU count) of each line of a figure against the GPU count: one per GPU
    kind, sequence length and batch of the what-if."""
    groups = wt.groupby(["gpu", "seq_len", "global_batch_size"], sort=False)
    palette = ["#4c78a8", "#54a24b", "#b279a2", "#f58518", "#72b7b2", "#9d755d"]
    for n, ((gpu, seq, gbs), g) in enumerate(groups):
        name = gpu if groups.ngroups == 1 or wt["gpu"].nunique() == groups.ngroups else f"{gpu}, seq {seq}, gbs {gbs}"
        yield name, palette[n % len(palette)], g.sort_values("num_gpus")


def _gpus_axis(wt: pd.DataFrame) -> dict:
    """The GPU count, log scale, a tick at each count of the what-if."""
    counts = sorted(wt["num_gpus"].dropna().astype(float).unique())
    return {"title": {"text": "GPUs"}, "type": "log", "tickvals": counts, "ticktext": [f"{int(c):,}" for c in counts]}
