"""Number formatting shared by the HTML pages and the terminal tables (no pandas, no plotly)."""

from __future__ import annotations

import math

from autopar.figures import (
    BUBBLE_FRACTION,
    HFU,
    HIGH,
    LOW,
    MFU,
    MODEL_TFLOPS_PER_GPU,
    PARAMS_PER_GPU,
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
)
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


#: compare row key -> kind (the figures' own)
COMPARE_KINDS: dict[str, str] = {
    f: f.kind
    for f in (
        STEP_TIME_S,
        LOW[STEP_TIME_S],
        HIGH[STEP_TIME_S],
        TOKENS_PER_S,
        TOKENS_PER_S_PER_GPU,
        MODEL_TFLOPS_PER_GPU,
        MFU,
        HFU,
        BUBBLE_FRACTION,
        PARAMS_PER_GPU,
    )
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
