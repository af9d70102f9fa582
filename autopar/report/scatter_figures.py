"""The scatter of every evaluated plan (`scatter_tables.scatter_frame`): peak memory against
throughput, one colour per class, each point's 80 % interval of throughput as an error bar, the
Pareto front as a line, the winner as a star and the GPU's capacity as a line."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from autopar.figures import HIGH, LOW, MEMORY_GIB, TOKENS_PER_S
from autopar.report.figure_base import figure_layout, floats, vline
from autopar.report.scatter_tables import FIT_CLASS

CATEGORY_COLOURS = {FIT_CLASS: "#2ca02c", "memory": "#ff7f0e", "other rules": "#7f7f7f"}
RULE_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#1f77b4", "#d62728")


def scatter_figure(
    sc: pd.DataFrame,
    order: list[str],
    winner: tuple[float, float, str] | None = None,
    capacity_gib: float | None = None,
    headroom_gib: float = 0.0,
) -> dict:
    """Every evaluated plan: peak memory vs throughput, one colour per class, the Pareto front as a
    line, the winner as a star; each point's 80 % interval of throughput as a vertical error bar,
    where the run has intervals. winner: (memory GiB, tokens/s, name)."""
    data = _class_traces(sc, order) + _front_traces(sc) + _winner_traces(winner)
    return {"data": data, "layout": _scatter_layout(sc, _capacity_lines(capacity_gib, headroom_gib))}


def _class_traces(sc: pd.DataFrame, order: list[str]) -> list[dict]:
    """One trace of markers per colour class, in legend order."""
    data = []
    rules = iter(RULE_COLOURS)
    for cat in order:
        s = sc[sc["category"] == cat]
        colour = CATEGORY_COLOURS.get(cat) or next(rules, "#7f7f7f")
        name = {FIT_CLASS: FIT_CLASS, "memory": "rejected: memory"}.get(cat, f"rejected: {cat}")
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{name} ({int(s['n_plans'].sum()):,})",
                "x": floats(s[MEMORY_GIB]),
                "y": floats(s[TOKENS_PER_S]),
                "text": s["hover"].tolist(),
                "marker": {"color": colour, "size": 6, "opacity": 0.75 if cat == FIT_CLASS else 0.5},
                "hovertemplate": "%{text}<extra></extra>",
                **_error_y(s, colour, 0.35 if cat == FIT_CLASS else 0.15),
            }
        )
    return data


def _error_y(s: pd.DataFrame, colour: str, alpha: float) -> dict:
    """The points' 80 % interval of throughput as asymmetric vertical error bars (tokens_per_s_low
    and _high); none where the run has no intervals (a run directory written before them)."""
    if not {LOW[TOKENS_PER_S], HIGH[TOKENS_PER_S]} <= set(s.columns):
        return {}
    y = s[TOKENS_PER_S].to_numpy(float)
    lo, hi = s[LOW[TOKENS_PER_S]].to_numpy(float), s[HIGH[TOKENS_PER_S]].to_numpy(float)
    if not np.isfinite(lo).any() and not np.isfinite(hi).any():
        return {}
    return {
        "error_y": {
            "type": "data",
            "symmetric": False,
            "array": floats(np.maximum(hi - y, 0)),
            "arrayminus": floats(np.maximum(y - lo, 0)),
            "color": _faint(colour, alpha),
            "thickness": 0.75,
            "width": 0,
        }
    }


def _faint(colour: str, alpha: float) -> str:
    """'#rrggbb' as a translucent rgba(), so thousands of error bars do not hide the points."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _front_traces(sc: pd.DataFrame) -> list[dict]:
    """The Pareto front as a staircase, least memory first (none without a front)."""
    front = sc[sc["pareto"]].sort_values(MEMORY_GIB)
    if not len(front):
        return []
    return [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": f"Pareto front ({len(front)})",
            "x": floats(front[MEMORY_GIB]),
            "y": floats(front[TOKENS_PER_S]),
            "text": front["hover"].tolist(),
            "line": {"color": "#111", "width": 1.5, "shape": "hv"},
            "marker": {"color": "#111", "size": 7, "symbol": "diamond"},
            "hovertemplate": "Pareto: %{text}<extra></extra>",
        }
    ]


def _winner_traces(winner: tuple[float, float, str] | None) -> list[dict]:
    """The best plan as a star (none when nothing fits)."""
    if winner is None:
        return []
    return [
        {
            "type": "scatter",
            "mode": "markers",
            "name": f"best: {winner[2]}",
            "x": [winner[0]],
            "y": [winner[1]],
            "marker": {"color": "#ffd700", "size": 16, "symbol": "star", "line": {"color": "#111", "width": 1}},
            "hovertemplate": f"best: {winner[2]}<br>%{{x:.1f}} GiB, %{{y:,.0f}} tokens/s<extra></extra>",
        }
    ]


def _capacity_lines(capacity_gib: float | None, headroom_gib: float) -> list[dict]:
    """The GPU's capacity (dashed) and the search's limit, capacity less the space's headroom
    (dotted)."""
    if not capacity_gib:
        return []
    shapes = [vline(capacity_gib, 1.5, "dash")]
    if 0 < headroom_gib < capacity_gib:
        shapes.append(vline(capacity_gib - headroom_gib, 1, "dot"))
    return shapes


def _scatter_layout(sc: pd.DataFrame, shapes: list[dict]) -> dict:
    """The title says how many plans are drawn; memory on a log axis ticked at powers of two."""
    plotted, total = sc.attrs.get("plotted_plans", len(sc)), sc.attrs.get("total", len(sc))
    sub = f" ({plotted:,} of {total:,} shown)" if plotted < total else f" ({total:,})"
    mem = sc[MEMORY_GIB].to_numpy(float)
    mem = mem[np.isfinite(mem) & (mem > 0)]
    ticks = _pow2_ticks(float(mem.min()), float(mem.max())) if len(mem) else []
    layout = figure_layout(
        f"Every evaluated plan{sub}: peak memory vs throughput",
        600,
        shapes=shapes,
        xaxis={
            "title": {"text": "peak memory per GPU (GiB, log scale)"},
            "type": "log",
            **({"tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]} if ticks else {}),
        },
        yaxis={"title": {"text": "tokens/s"}, "automargin": True},
        hovermode="closest",
    )
    layout["margin"]["t"] = 110
    layout["legend"].update(x=0, xanchor="left")
    return layout


def _pow2_ticks(lo: float, hi: float) -> list[float]:
    """Powers of two (GiB) spanning [lo, hi], for a readable log axis."""
    a, b = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    return [2.0**k for k in range(a, b + 1)]
