"""Plotly figures from the report's frames (`tables.py`). The only module of autopar that imports
plotly; it draws and decides nothing about the numbers.

Figures are built as plain plotly figure dicts and serialised with `plotly.io` without
re-validation: the figure-object validators cost a few hundred milliseconds per report, which
`autopar search` would pay on every run.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from autopar.cost.estimate import AXES, MEMORY_LABELS, MEMORY_TERMS, TIME_LABELS, TIME_TERMS
from autopar.spec.hardware import GIB

CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}
FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 12}

TIME_COLOURS = {
    "compute": "#4c78a8",
    "tp": "#f58518",
    "cp": "#e45756",
    "ep": "#72b7b2",
    "pp": "#54a24b",
    "dp": "#eeca3b",
    "bubble": "#b279a2",
    "optimizer": "#9d755d",
}
MEMORY_COLOURS = {
    "weights": "#4c78a8",
    "gradients": "#72b7b2",
    "optimizer": "#54a24b",
    "activations": "#f58518",
    "other": "#bab0ac",
}
AXIS_COLOURS = {"tp": "#f58518", "cp": "#e45756", "ep": "#72b7b2", "pp": "#54a24b", "dp": "#eeca3b"}
CATEGORY_COLOURS = {"fits": "#2ca02c", "memory": "#ff7f0e", "other rules": "#7f7f7f"}
RULE_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#1f77b4", "#d62728")


def plotly_js() -> str:
    """The plotly.js bundle shipped with the plotly package (inlined once per page)."""
    return get_plotlyjs()


def to_json(fig: dict) -> str:
    """A figure as the JSON of Plotly.newPlot's arguments ({data, layout, config}), safe to embed in
    a <script type="application/json"> element."""
    # plotly's encoder writes <, > and / as \\u escapes, so no "</script>" can appear
    return pio.to_json({"data": fig["data"], "layout": fig["layout"], "config": CONFIG}, validate=False)


def height(fig: dict) -> int:
    return int(fig["layout"].get("height", 450))


def _layout(title: str, height: float, **kw) -> dict:
    """Title top left, legend in one row above the plot on the right; axes make room for their
    tick labels and titles (automargin)."""
    for axis in ("xaxis", "yaxis"):
        kw[axis] = {"automargin": True, **kw.get(axis, {})}
    return {
        "title": {
            "text": title,
            "x": 0,
            "xanchor": "left",
            "y": 0.98,
            "yref": "container",
            "yanchor": "top",
            "font": {"size": 15},
        },
        "height": int(height),
        "margin": {"l": 10, "r": 20, "t": 80, "b": 50},
        "font": FONT,
        "plot_bgcolor": "#fafafa",
        "legend": {
            "orientation": "h",
            "y": 1.0,
            "yanchor": "bottom",
            "x": 1,
            "xanchor": "right",
            "traceorder": "normal",
        },
        "hoverlabel": {"align": "left"},
        **kw,
    }


def _floats(values) -> list:
    """JSON-safe floats (NaN/inf -> None, which plotly draws as a gap)."""
    return [None if v is None or not math.isfinite(float(v)) else float(v) for v in values]


def _bar_height(n: int) -> float:
    return 140 + 34 * max(n, 1)


def time_figure(tb: pd.DataFrame, title: str = "Step time breakdown (s)") -> dict:
    """Stacked horizontal bars: one bar per candidate, one segment per step-time term."""
    labels = list(tb.index)
    data = []
    for t in TIME_TERMS:
        x = tb[t].to_numpy(float)
        if not np.any(x > 0):
            continue
        share = np.where(tb["step_time_s"] > 0, 100 * x / tb["step_time_s"].to_numpy(float), 0)
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": TIME_LABELS[t],
                "y": labels,
                "x": _floats(x),
                "marker": {"color": TIME_COLOURS[t]},
                "customdata": _floats(share),
                "hovertemplate": f"%{{y}}<br>{TIME_LABELS[t]}: %{{x:.4f}} s (%{{customdata:.1f}}%)<extra></extra>",
            }
        )
    layout = _layout(
        title,
        _bar_height(len(labels)),
        barmode="stack",
        xaxis={"title": {"text": "seconds per step"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
    )
    return {"data": data, "layout": layout}


def memory_figure(
    mb: pd.DataFrame, headroom_gib: float = 0.0, title: str = "Memory per GPU (GiB), most loaded rank"
) -> dict:
    """Stacked horizontal bars of the memory terms per candidate, against the GPU's capacity."""
    labels = list(mb.index)
    data = []
    cap = mb["memory_capacity_bytes"].to_numpy(float)
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
                "x": _floats(x),
                "marker": {"color": MEMORY_COLOURS[t]},
                "hovertemplate": f"%{{y}}<br>{MEMORY_LABELS[t]}: %{{x:.2f}} GiB<extra></extra>",
            }
        )
    shapes, notes = [], []
    if len(cap):
        c = float(np.max(cap)) / GIB
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": c,
                "x1": c,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#d62728", "width": 2},
            }
        )
        notes.append(
            {
                "x": c,
                "y": 0,
                "xref": "x",
                "yref": "paper",
                "text": f"capacity {c:.1f} GiB",
                "showarrow": False,
                "xanchor": "right",
                "yanchor": "bottom",
                "textangle": -90,
                "font": {"color": "#d62728"},
                "bgcolor": "rgba(255,255,255,0.8)",
            }
        )
        if headroom_gib > 0:
            h = c - headroom_gib
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": h,
                    "x1": h,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": "#d62728", "width": 1, "dash": "dot"},
                }
            )
    layout = _layout(
        title,
        _bar_height(len(labels)),
        barmode="stack",
        shapes=shapes,
        annotations=notes,
        xaxis={"title": {"text": "GiB"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
    )
    return {"data": data, "layout": layout}


def comm_figure(cb: pd.DataFrame, title: str = "Communication per GPU per step (GB)") -> dict:
    """Grouped horizontal bars: bytes each GPU sends per step, per axis."""
    labels = list(cb.index)
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": a.upper(),
            "y": labels,
            "x": _floats(cb[a].to_numpy(float) / 1e9),
            "marker": {"color": AXIS_COLOURS[a]},
            "hovertemplate": f"%{{y}}<br>{a.upper()}: %{{x:.2f}} GB<extra></extra>",
        }
        for a in AXES
        if np.any(cb[a].to_numpy(float) > 0)
    ]
    layout = _layout(
        title,
        140 + 34 * max(len(labels), 1) * max(1, len(data)) / 2,
        barmode="group",
        xaxis={"title": {"text": "GB"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
    )
    return {"data": data, "layout": layout}


def scatter_figure(
    sc: pd.DataFrame,
    order: list[str],
    winner: tuple[float, float, str] | None = None,
    capacity_gib: float | None = None,
    headroom_gib: float = 0.0,
) -> dict:
    """Every evaluated plan: peak memory vs throughput, one colour per class, the Pareto front as a
    line, the winner as a star."""
    data = []
    rules = iter(RULE_COLOURS)
    for cat in order:
        s = sc[sc["category"] == cat]
        colour = CATEGORY_COLOURS.get(cat) or next(rules, "#7f7f7f")
        name = {"fits": "fits", "memory": "rejected: memory"}.get(cat, f"rejected: {cat}")
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{name} ({int(s['n_plans'].sum()):,})",
                "x": _floats(s["memory_gib"]),
                "y": _floats(s["tokens_per_s"]),
                "text": s["hover"].tolist(),
                "marker": {"color": colour, "size": 6, "opacity": 0.75 if cat == "fits" else 0.5},
                "hovertemplate": "%{text}<extra></extra>",
            }
        )
    front = sc[sc["pareto"]].sort_values("memory_gib")
    if len(front):
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"Pareto front ({len(front)})",
                "x": _floats(front["memory_gib"]),
                "y": _floats(front["tokens_per_s"]),
                "text": front["hover"].tolist(),
                "line": {"color": "#111", "width": 1.5, "shape": "hv"},
                "marker": {"color": "#111", "size": 7, "symbol": "diamond"},
                "hovertemplate": "Pareto: %{text}<extra></extra>",
            }
        )
    if winner is not None:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"best: {winner[2]}",
                "x": [winner[0]],
                "y": [winner[1]],
                "marker": {"color": "#ffd700", "size": 16, "symbol": "star", "line": {"color": "#111", "width": 1}},
                "hovertemplate": f"best: {winner[2]}<br>%{{x:.1f}} GiB, %{{y:,.0f}} tokens/s<extra></extra>",
            }
        )
    shapes = []
    if capacity_gib:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": capacity_gib,
                "x1": capacity_gib,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#d62728", "width": 1.5, "dash": "dash"},
            }
        )
        if 0 < headroom_gib < capacity_gib:  # the search's limit: capacity less the space's headroom
            h = capacity_gib - headroom_gib
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": h,
                    "x1": h,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": "#d62728", "width": 1, "dash": "dot"},
                }
            )
    plotted, total = sc.attrs.get("plotted_plans", len(sc)), sc.attrs.get("total", len(sc))
    sub = f" ({plotted:,} of {total:,} shown)" if plotted < total else f" ({total:,})"
    mem = sc["memory_gib"].to_numpy(float)
    mem = mem[np.isfinite(mem) & (mem > 0)]
    ticks = _pow2_ticks(float(mem.min()), float(mem.max())) if len(mem) else []
    layout = _layout(
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
    return {"data": data, "layout": layout}


def _pow2_ticks(lo: float, hi: float) -> list[float]:
    """Powers of two (GiB) spanning [lo, hi], for a readable log axis."""
    a, b = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    return [2.0**k for k in range(a, b + 1)]


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
                    "y": _floats(s["step_time_s"]),
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
            "y": _floats(h["best_so_far"]),
            "line": {"color": "#d62728", "width": 2, "shape": "hv"},
            "hovertemplate": "after trial %{x}: best %{y:.3f} s<extra></extra>",
        }
    )
    return {
        "data": data,
        "layout": _layout(
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
            for n, t, e in zip(tt["plan_name"], tt["trial"], tt[err].to_numpy(float))
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
                    "x": _floats(m[sel]),
                    "y": _floats(p[sel]),
                    "text": text[sel].tolist(),
                    "marker": {"color": colour, "size": 10, "symbol": symbol},
                    "hovertemplate": f"%{{text}}<br>measured %{{x:{fmt}}} {unit}<br>predicted %{{y:{fmt}}} {unit}"
                    f"<extra></extra>",
                }
            )
    square = [lo - pad, hi + pad]  # one range on both axes: the diagonal is at 45 degrees
    return {
        "data": data,
        "layout": _layout(
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
        for name, mfu in zip(wt["plan_name"], wt["mfu"].to_numpy(float))
    ]
    colours = ["#f58518" if c else "#4c78a8" for c in wt["current"]]
    data = [
        {
            "type": "bar",
            "name": "best plan",
            "x": wt["scenario"].tolist(),
            "y": _floats(wt["tokens_per_s"]),
            "text": text,
            "textposition": "auto",
            "marker": {"color": colours},
            "customdata": np.column_stack(
                [_floats(wt["step_time_s"]), _floats(wt["memory_gib"]), _floats(wt["tokens_per_s_per_gpu"])]
            ).tolist(),
            "hovertemplate": "%{x}<br>%{text}<br>%{y:,.0f} tokens/s (%{customdata[2]:,.0f} per GPU)<br>"
            "%{customdata[0]:.3f} s/step, %{customdata[1]:.1f} GiB<extra></extra>",
        }
    ]
    return {
        "data": data,
        "layout": _layout(
            "What-if: the best plan per scenario (tokens/s)",
            440,
            showlegend=False,
            xaxis={"type": "category", "automargin": True},
            yaxis={"title": {"text": "tokens/s"}, "rangemode": "tozero"},
        ),
    }


RUN_COLOURS = {
    "steps": "#4c78a8",
    "lost_to_checkpoints": "#f58518",
    "lost_to_rework": "#e45756",
    "lost_to_restarts": "#b279a2",
}


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
            "x": _floats(rb[k]),
            "marker": {"color": RUN_COLOURS[k]},
            "hovertemplate": f"%{{y}}<br>{labels[k]}: %{{x:.2f}} days<extra></extra>",
        }
        for k in labels
        if np.any(rb[k].to_numpy(float) > 0)
    ]
    shapes, notes = _deadline(deadline_days, "x")
    layout = _layout(
        title,
        _bar_height(len(names)),
        barmode="stack",
        shapes=shapes,
        annotations=notes,
        xaxis={"title": {"text": "days"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
    )
    return {"data": data, "layout": layout}


def _deadline(days: float | None, axis: str) -> tuple[list, list]:
    """A dashed red line (and its label) at the deadline along `axis` ("x" or "y")."""
    if not days:
        return [], []
    other = "y" if axis == "x" else "x"
    line = {
        "type": "line",
        f"{axis}ref": axis,
        f"{other}ref": "paper",
        f"{axis}0": days,
        f"{axis}1": days,
        f"{other}0": 0,
        f"{other}1": 1,
        "line": {"color": "#d62728", "width": 2, "dash": "dash"},
    }
    note = {
        axis: days,
        other: 0.98 if axis == "y" else 0,
        f"{axis}ref": axis,
        f"{other}ref": "paper",
        "text": f"deadline {days:g} days",
        "showarrow": False,
        "font": {"color": "#d62728"},
        "xanchor": "right",
        "yanchor": "bottom",
        "bgcolor": "rgba(255,255,255,0.8)",
    }
    return [line], [note]


def whatif_run_figure(wt: pd.DataFrame, deadline_days: float | None = None) -> dict:
    """Days to train (left axis) and cost or GPU-hours (right axis, dotted) against the GPU count,
    one line per GPU kind, sequence length and batch, with the deadline."""
    priced = bool(wt["cost"].notna().any())
    money, label = ("cost", "cost") if priced else ("gpu_hours", "GPU-hours")
    data = []
    groups = wt.groupby(["gpu", "seq_len", "global_batch_size"], sort=False)
    palette = ["#4c78a8", "#54a24b", "#b279a2", "#f58518", "#72b7b2", "#9d755d"]
    for n, ((gpu, seq, gbs), g) in enumerate(groups):
        g = g.sort_values("num_gpus")
        colour = palette[n % len(palette)]
        name = gpu if groups.ngroups == 1 or wt["gpu"].nunique() == groups.ngroups else f"{gpu}, seq {seq}, gbs {gbs}"
        x = g["num_gpus"].astype(float).tolist()
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{name}: days",
                "x": x,
                "y": _floats(g["days"]),
                "text": g["plan_name"].tolist(),
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
                "y": _floats(g[money]),
                "yaxis": "y2",
                "line": {"dash": "dot", "color": colour},
                "hovertemplate": f"%{{x}} GPUs: {label} %{{y:,.3s}}<extra></extra>",
            }
        )
    shapes, notes = _deadline(deadline_days, "y")
    counts = sorted(wt["num_gpus"].dropna().astype(float).unique())
    layout = _layout(
        f"What-if: days to train and {label} against GPUs",
        460,
        shapes=shapes,
        annotations=notes,
        xaxis={
            "title": {"text": "GPUs"},
            "type": "log",
            "tickvals": counts,
            "ticktext": [f"{int(c):,}" for c in counts],
        },
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
