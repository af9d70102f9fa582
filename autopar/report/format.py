"""Number formatting shared by the HTML pages and the terminal tables (no pandas, no plotly)."""

from __future__ import annotations

import math

from autopar.spec.hardware import GIB
from autopar.spec.training_run import money_text, significant


def human_count(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


#: kind -> formatter of a finite number
KINDS = {
    "int": lambda v: f"{int(v)}",
    "s": lambda v: f"{v:.3f}",
    "s4": lambda v: f"{v:.4f}",
    "gib": lambda v: f"{v:.1f}",
    "bytes_gib": lambda v: f"{v / GIB:.2f}",
    "bytes_gb": lambda v: f"{v / 1e9:.2f}",
    "count": lambda v: f"{v:,.0f}",
    "pct": lambda v: f"{100 * v:.1f}%",
    "pct_signed": lambda v: f"{100 * v:+.1f}%",
    "tflops": lambda v: f"{v:.0f}",
    "human": human_count,
    "s_signed": lambda v: f"{v:+.3f}",
    "gib_signed": lambda v: f"{v:+.2f}",
    "days": lambda v: f"{v:,.1f}",
    "money": money_text,
}


def fmt(value, kind: str = "") -> str:
    """A cell: numbers by kind, NaN/None as '-', booleans as yes/no, the rest as text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        value = value.item()
        if isinstance(value, bool):
            return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if not math.isfinite(value):  # days of a run that never finishes: 'never', not 'inf'
            return "never" if kind == "days" and value > 0 else "-"
        return (
            KINDS[kind](value) if kind in KINDS else (significant(value, 6) if isinstance(value, float) else str(value))
        )
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


#: compare row key -> kind
COMPARE_KINDS = {
    "step_time_s": "s4",
    "step_time_s_low": "s4",
    "step_time_s_high": "s4",
    "tokens_per_s": "count",
    "tokens_per_s_per_gpu": "count",
    "model_tflops_per_gpu": "tflops",
    "mfu": "pct",
    "hfu": "pct",
    "bubble_fraction": "pct",
    "params_per_gpu": "human",
}


def compare_kind(section: str, key: str) -> str:
    if key in COMPARE_KINDS:
        return COMPARE_KINDS[key]
    if section.startswith("time"):
        return "s4"
    if section.startswith("memory"):
        return "bytes_gib"
    if section.startswith("comm"):
        return "bytes_gb"
    return ""
