"""Stacked and grouped horizontal bars, one bar per candidate (a top-k plan or a compared layout):
where the step time, the memory, the communication and the days to train go."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autopar.figures import (
    AXES,
    DAYS,
    HIGH,
    LOST_TO_CHECKPOINTS,
    LOST_TO_RESTARTS,
    LOST_TO_REWORK,
    LOW,
    MEMORY_CAPACITY_BYTES,
    MEMORY_LABELS,
    MEMORY_TERMS,
    STEP_TIME_S,
    TIME_LABELS,
    TIME_TERMS,
)
from autopar.report.figure_base import RED, bar_height, deadline, figure_layout, floats, vline
from autopar.spec.hardware import GIB

TIME_COLOURS = {
    "compute": "#4c78a8",
    "tp": "#f58518",
    "cp": "#e45756",
    "ep": "#72b7b2",
    "pp": "#54a24b",
    "dp": "#eeca3b",
    "bubble": "#b279a2",
    "optimizer": "#9d755d",
    "offload": "#bab0ac",
    "act_offload": "#d8b5a5",
}
MEMORY_COLOURS = {
    "weights": "#4c78a8",
    "gradients": "#72b7b2",
    "optimizer": "#54a24b",
    "activations": "#f58518",
    "other": "#bab0ac",
}
AXIS_COLOURS = {"tp": "#f58518", "cp": "#e45756", "ep": "#72b7b2", "pp": "#54a24b", "dp": "#eeca3b"}
RUN_COLOURS = {
    "steps": "#4c78a8",
    LOST_TO_CHECKPOINTS: "#f58518",
    LOST_TO_REWORK: "#e45756",
    LOST_TO_RESTARTS: "#b279a2",
}
#: the candidates' axis: one bar each, top to bottom in the frame's order
CANDIDATE_AXIS = {"autorange": "reversed", "automargin": True, "type": "category"}


def time_figure(tb: pd.DataFrame, title: str = "Step time breakdown (s)") -> dict:
    """Stacked horizontal bars: one bar per candidate, one segment per step-time term; the step
    time's 80 % interval as an error bar on each bar, where the frame has one."""
    labels = list(tb.index)
    data = []
    for t in TIME_TERMS:
        x = tb[t].to_numpy(float)
        if not np.any(x > 0):
            continue
        share = np.where(tb[STEP_TIME_S] > 0, 100 * x / tb[STEP_TIME_S].to_numpy(float), 0)
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": TIME_LABELS[t],
                "y": labels,
                "x": floats(x),
                "marker": {"color": TIME_COLOURS[t]},
                "customdata": floats(share),
                "hovertemplate": f"%{{y}}<br>{TIME_LABELS[t]}: %{{x:.4f}} s (%{{customdata:.1f}}%)<extra></extra>",
            }
        )
    data += _interval_traces(tb, labels)
    layout = figure_layout(
        title,
        bar_height(len(labels)),
        barmode="stack",
        xaxis={"title": {"text": "seconds per step"}, "rangemode": "tozero"},
        yaxis=CANDIDATE_AXIS,
    )
    return {"data": data, "layout": layout}


#: the name of the step-time figure's interval trace (the error bars)
INTERVAL_NAME = "80 % interval"


def _interval_traces(tb: pd.DataFrame, labels: list) -> list[dict]:
    """The step time's 80 % interval (step_time_s_low, _high) as asymmetric error bars at the end of
    each stacked bar (a marker at the predicted step time); none where the frame has no interval
    (a run directory written before them, a comparison)."""
    if not {LOW[STEP_TIME_S], HIGH[STEP_TIME_S]} <= set(tb.columns):
        return []
    x = tb[STEP_TIME_S].to_numpy(float)
    lo, hi = tb[LOW[STEP_TIME_S]].to_numpy(float), tb[HIGH[STEP_TIME_S]].to_numpy(float)
    if not (np.isfinite(lo) | np.isfinite(hi)).any():
        return []
    return [
        {
            "type": "scatter",
            "mode": "markers",
            "name": INTERVAL_NAME,
            "y": labels,
            "x": floats(x),
            "marker": {"color": "#111", "size": 10, "symbol": "line-ns-open", "line": {"width": 1.5}},
            "error_x": {
                "type": "data",
                "symmetric": False,
                "array": floats(np.maximum(hi - x, 0)),
                "arrayminus": floats(np.maximum(x - lo, 0)),
                "color": "#111",
                "thickness": 1.5,
                "width": 6,
            },
            "customdata": [floats(pair) for pair in zip(lo, hi)],
            "hovertemplate": "%{y}<br>predicted %{x:.3f} s; 80 % interval "
            "%{customdata[0]:.3f}-%{customdata[1]:.3f} s<extra></extra>",
        }
    ]


def memory_figure(
    mb: pd.DataFrame, headroom_gib: float = 0.0, title: str = "Memory per GPU (GiB), most loaded rank"
) -> dict:
    """Stacked horizontal bars of the memory terms per candidate, against the GPU's capacity."""
    labels = list(mb.index)
    data = []
    cap = mb[MEMORY_CAPACITY_BYTES].to_numpy(float)
    for t in MEMORY_TERMS:
        x = mb[t].to_numpy(float) / GIB
        if not np.any(x > 0):
            continue
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": MEMORY_LABELS[t],
                "y": labels,
                "x": floats(x),
                "marker": {"color": MEMORY_COLOURS[t]},
                "hovertemplate": f"%{{y}}<br>{MEMORY_LABELS[t]}: %{{x:.2f}} GiB<extra></extra>",
            }
        )
    shapes, notes = capacity_marks(float(np.max(cap)) / GIB, headroom_gib) if len(cap) else ([], [])
    layout = figure_layout(
        title,
        bar_height(len(labels)),
        barmode="stack",
        shapes=shapes,
        annotations=notes,
        xaxis={"title": {"text": "GiB"}, "rangemode": "tozero"},
        yaxis=CANDIDATE_AXIS,
    )
    return {"data": data, "layout": layout}


def capacity_marks(capacity_gib: float, headroom_gib: float = 0.0) -> tuple[list, list]:
    """The GPU's capacity as a red vertical line with its label, and the search's limit (capacity
    less the headroom) as a dotted one, on a GiB x axis."""
    c = capacity_gib
    note = {
        "x": c,
        "y": 0,
        "xref": "x",
        "yref": "paper",
        "text": f"capacity {c:.1f} GiB",
        "showarrow": False,
        "xanchor": "right",
        "yanchor": "bottom",
        "textangle": -90,
        "font": {"color": RED},
        "bgcolor": "rgba(255,255,255,0.8)",
    }
    shapes = [vline(c, 2)] + ([vline(c - headroom_gib, 1, "dot")] if headroom_gib > 0 else [])
    return shapes, [note]


def comm_figure(cb: pd.DataFrame, title: str = "Communication per GPU per step (GB)") -> dict:
    """Grouped horizontal bars: bytes each GPU sends per step, per axis."""
    labels = list(cb.index)
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": a.upper(),
            "y": labels,
            "x": floats(cb[a].to_numpy(float) / 1e9),
            "marker": {"color": AXIS_COLOURS[a]},
            "hovertemplate": f"%{{y}}<br>{a.upper()}: %{{x:.2f}} GB<extra></extra>",
        }
        for a in AXES
        if np.any(cb[a].to_numpy(float) > 0)
    ]
    layout = figure_layout(
        title,
        140 + 34 * max(len(labels), 1) * max(1, len(data)) / 2,
        barmode="group",
        xaxis={"title": {"text": "GB"}, "rangemode": "tozero"},
        yaxis=CANDIDATE_AXIS,
    )
    return {"data": data, "layout": layout}


def run_figure(
    rb: pd.DataFrame,
    labels: dict[str, str],
    deadline_days: float | None = None,
    title: str = "Days to train: steps, and what checkpoints and failures add",
) -> dict:
    """Stacked horizontal bars of the days to train per candidate, one segment per part of the run
    (the goodput terms), with the deadline as a line."""
    names = list(rb.index)
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": labels[k],
            "y": names,
            "x": floats(rb[k]),
            "marker": {"color": RUN_COLOURS[k]},
            "hovertemplate": f"%{{y}}<br>{labels[k]}: %{{x:.2f}} days<extra></extra>",
        }
        for k in labels
        if np.any(rb[k].to_numpy(float) > 0)
    ]
    shapes, notes = deadline(deadline_days, "x")
    layout = figure_layout(
        title,
        bar_height(len(names)),
        barmode="stack",
        shapes=shapes,
        annotations=notes,
        xaxis={"title": {"text": DAYS.unit}, "rangemode": "tozero"},
        yaxis=CANDIDATE_AXIS,
    )
    return {"data": data, "layout": layout}
