"""The winner's pipeline stages: memory per stage against the GPU's capacity, and the timeline of
one step per stage (a Gantt-like stacked bar: forward, backward, waiting, bubble, then the step's
tail), from the frames of autopar.report.stage_tables."""

from __future__ import annotations

import pandas as pd

from autopar.figures import MEMORY_GIB
from autopar.report.breakdown_figures import CANDIDATE_AXIS, TIME_COLOURS, capacity_marks
from autopar.report.figure_base import bar_height, figure_layout, floats
from autopar.report.stage_tables import TIMELINE_LABELS

TIMELINE_COLOURS = {
    "forward": "#6baed6",
    "backward": TIME_COLOURS["compute"],
    "waiting": "#d9d9d9",
    "bubble": TIME_COLOURS["bubble"],
    "dp": TIME_COLOURS["dp"],
    "tp_step": TIME_COLOURS["tp"],
    "optimizer": TIME_COLOURS["optimizer"],
}
STAGE_COLOUR = "#4c78a8"


def stage_memory_figure(sm: pd.DataFrame, headroom_gib: float = 0.0) -> dict:
    """One horizontal bar per pipeline stage: its peak memory per GPU, against the capacity."""
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": "peak memory per GPU",
            "y": sm["label"].tolist(),
            "x": floats(sm[MEMORY_GIB]),
            "marker": {"color": STAGE_COLOUR},
            "customdata": floats(100 * sm["share_of_capacity"]),
            "hovertemplate": "%{y}<br>%{x:.2f} GiB (%{customdata:.1f}% of the GPU)<extra></extra>",
        }
    ]
    shapes, notes = capacity_marks(float(sm["capacity_gib"].iloc[0]), headroom_gib) if len(sm) else ([], [])
    layout = figure_layout(
        "The winner's memory per GPU, per pipeline stage (GiB)",
        bar_height(len(sm)),
        showlegend=False,
        shapes=shapes,
        annotations=notes,
        xaxis={"title": {"text": "GiB"}, "rangemode": "tozero"},
        yaxis=CANDIDATE_AXIS,
    )
    return {"data": data, "layout": layout}


def timeline_figure(tl: pd.DataFrame) -> dict:
    """One bar per stage along the step's time axis, one segment per part (stacked from the step's
    start, so each segment sits where its part begins); a dotted line where the pipeline ends."""
    labels = tl["label"].tolist()
    data = []
    for part, name in TIMELINE_LABELS.items():
        if not (tl[part] > 0).any():
            continue
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "y": labels,
                "x": floats(tl[part]),
                "marker": {"color": TIMELINE_COLOURS[part]},
                "customdata": [floats(p) for p in zip(tl[f"start_{part}"], tl[f"start_{part}"] + tl[part])],
                "hovertemplate": f"%{{y}}<br>{name}: %{{x:.3f}} s "
                "(%{customdata[0]:.3f}-%{customdata[1]:.3f} s)<extra></extra>",
            }
        )
    end = float(tl["pipeline_s"].iloc[0]) if len(tl) else 0.0
    shapes = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": end,
            "x1": end,
            "y0": 0,
            "y1": 1,
            "line": {"color": "#333", "width": 1, "dash": "dot"},
        }
    ]
    notes = [
        {
            "x": end,
            "y": 0,
            "xref": "x",
            "yref": "paper",
            "text": "pipeline ends",
            "showarrow": False,
            "xanchor": "right",
            "yanchor": "bottom",
            "textangle": -90,
            "font": {"color": "#333"},
            "bgcolor": "rgba(255,255,255,0.8)",
        }
    ]
    layout = figure_layout(
        "The winner's step, per pipeline stage (s): the cost model's schedule",
        bar_height(len(labels)) + 40,
        barmode="stack",
        shapes=shapes,
        annotations=notes,
        xaxis={"title": {"text": "seconds from the start of the step"}, "rangemode": "tozero"},
        yaxis=CANDIDATE_AXIS,
    )
    return {"data": data, "layout": layout}
