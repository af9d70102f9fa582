"""The report writes its figures as plotly.io's json engine does and inlines plotly's own bundle,
without importing plotly.io (autopar.report.figure_base): plotly itself is the reference."""

from __future__ import annotations

import math

import numpy as np
import plotly.io as pio
from plotly.offline import get_plotlyjs

from autopar.report import figure_base as F
from autopar.report.html import write_report


def _plotly(fig: dict) -> str:
    return pio.to_json({"data": fig["data"], "layout": fig["layout"], "config": F.CONFIG}, validate=False)


def test_the_bundle_is_plotlys() -> None:
    assert F.plotly_js() == get_plotlyjs()


def test_awkward_values_are_written_as_plotly_writes_them() -> None:
    fig = {
        "data": [
            {
                "type": "scatter",
                "x": np.array([1.0, np.nan, np.inf, -np.inf]),
                "y": [1, 2.5, math.nan, np.float32(0.1)],
                "text": ["</script><script>alert(1)</script>", "<!-- a/b -->", "é ☃ \u2028", "NaN", "Infinity"],
                "customdata": np.array([[1, 2], [3, 4]], dtype=np.int64),
                "marker": {"size": np.int64(7), "showscale": np.bool_(True)},
            }
        ],
        "layout": {"title": {"text": "a < b > c / d"}, "height": 450, "shapes": []},
    }
    got = F.to_json(fig)
    assert got == _plotly(fig)
    assert "</" not in got and "<!--" not in got


def test_every_figure_of_a_report_is_written_as_plotly_writes_it(run70, tmp_path, monkeypatch) -> None:
    seen: list[dict] = []
    original = F.to_json

    def recording(fig: dict) -> str:
        seen.append(fig)
        return original(fig)

    monkeypatch.setattr(F, "to_json", recording)
    write_report(run70, out=tmp_path / "r.html")
    assert len(seen) >= 4  # the breakdowns, the scatter, the Pareto front ...
    for fig in seen:
        assert original(fig) == _plotly(fig)
