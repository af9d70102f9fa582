"""What every figure of the report shares: the layout (title, legend, margins, font), JSON-safe
numbers, the red vertical lines of capacities and deadlines, and serialisation. The only module of
autopar that reads plotly (its plotly.js bundle): the figure modules (`breakdown_figures`, `scatter_figures`,
`trial_figures`) build plain figure dicts from the report's frames and decide nothing about the
numbers.

Figures are plain plotly figure dicts, serialised as plotly.io's json engine writes them
(`plotly.io.to_json(validate=False)`: compact, NaN and infinities as null, <, > and / escaped) with
the json module, and the page inlines the plotly.js bundle of the plotly package: importing
plotly.io and its encoder costs `autopar search` about 0.1 s a run, the figure-object validators a
few hundred milliseconds more. tests/report/test_figure_json.py holds both to plotly's own.
"""

from __future__ import annotations

import json
import math
from importlib.util import find_spec
from pathlib import Path

import numpy as np

CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}
FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 12}
RED = "#d62728"


#: what plotly.io's json engine escapes (plotly/io/_json.py `_swap_json`): no "</script>" or "<!--"
#: can appear in the JSON a <script type="application/json"> element holds
_SCRIPT_SAFE = (("<", "\\u003c"), (">", "\\u003e"), ("/", "\\u002f"))


def plotly_js() -> str:
    """The plotly.js bundle shipped with the plotly package (plotly/package_data/plotly.min.js, what
    `plotly.offline.get_plotlyjs` reads), inlined once per page; found without importing plotly."""
    spec = find_spec("plotly")
    assert spec is not None and spec.submodule_search_locations, "plotly is a dependency of autopar"
    bundle = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    return bundle.read_text(encoding="utf-8")


def to_json(fig: dict) -> str:
    """A figure as the JSON of Plotly.newPlot's arguments ({data, layout, config}), safe to embed in
    a <script type="application/json"> element."""
    obj = {"data": fig["data"], "layout": fig["layout"], "config": CONFIG}
    text = json.dumps(obj, separators=(",", ":"), default=_plain)
    if "NaN" in text or "Infinity" in text:  # as plotly's encoder: non-finite numbers become null
        text = json.dumps(json.loads(text, parse_constant=lambda _: None), separators=(",", ":"))
    for unsafe, escaped in _SCRIPT_SAFE:  # str.replace: str.translate is ten times slower on megabytes
        text = text.replace(unsafe, escaped)
    return text


def _plain(value):
    """numpy arrays and scalars as the lists and numbers plotly's encoder writes for them."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"a report figure holds a {type(value).__name__}, which JSON cannot hold")


def height(fig: dict) -> int:
    return int(fig["layout"].get("height", 450))


def figure_layout(title: str, height: float, **kw) -> dict:
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


def floats(values) -> list:
    """JSON-safe floats (NaN/inf -> None, which plotly draws as a gap)."""
    return [None if v is None or not math.isfinite(float(v)) else float(v) for v in values]


def bar_height(n: int) -> float:
    """The height of a horizontal bar chart of n bars."""
    return 140 + 34 * max(n, 1)


def vline(x: float, width: float, dash: str | None = None) -> dict:
    """A red vertical line across the plot at x (a capacity or a limit)."""
    line = {"color": RED, "width": width, **({"dash": dash} if dash else {})}
    return {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1, "line": line}


def deadline(days: float | None, axis: str) -> tuple[list, list]:
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
        "line": {"color": RED, "width": 2, "dash": "dash"},
    }
    note = {
        axis: days,
        other: 0.98 if axis == "y" else 0,
        f"{axis}ref": axis,
        f"{other}ref": "paper",
        "text": f"deadline {days:g} days",
        "showarrow": False,
        "font": {"color": RED},
        "xanchor": "right",
        "yanchor": "bottom",
        "bgcolor": "rgba(255,255,255,0.8)",
    }
    return [line], [note]
