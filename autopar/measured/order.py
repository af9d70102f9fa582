"""The order the measured stage runs its candidates in: spread over layouts (`diverse`), and the
plans the model cannot separate from the leader first (`unresolved_first`, by the margin of
autopar.search.margins)."""

from __future__ import annotations

import pandas as pd

from autopar.calibration.margin import PairedMargin
from autopar.figures import HIGH, INTERVAL, LOW, STEP_TIME_S, SUPPORT
from autopar.search.margins import plan_margin, stored_margin


def diverse(keys: list[str], cands: dict[str, dict]) -> list[str]:
    """The ranking reordered round-robin over layouts (axes, schedule, recomputation), fastest first
    within each, so the top-K measured spans axes, schedules, recomputation, micro-batches and ZeRO
    stages, not one layout's near-ties."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        p = cands[k]["plan"]
        layout = (p["tp"], p["pp"], p["vpp"], p.get("cp", 1), p["dp"], p.get("pp_schedule"), p.get("recompute"))
        groups.setdefault(".".join(map(str, layout)), []).append(k)
    out: list[str] = []
    i = 0
    while len(out) < len(keys):
        for g in groups.values():
            if i < len(g):
                out.append(g[i])
        i += 1
    return out


def unresolved_first(ranking: list[str], cands: dict[str, dict], margin: PairedMargin | None = None) -> list[str]:
    """The order the measured stage runs plans in: the leader (the ranking's first) first; then the
    plans the model cannot tell from it, the extrapolated before the calibrated (a measurement
    settles most where the model knows least); then the rest. Each group keeps the ranking's order.
    "Cannot tell from it": the margin's 80 % interval holds a tie (autopar.search.margins, `margin`
    default the shipped model) for candidates with their plan; by overlapping step-time intervals
    for those without. Candidates without intervals count as unresolved and calibrated."""
    if not ranking:
        return []
    lead = cands[ranking[0]]
    lead_high = lead["predicted"].get(INTERVAL[STEP_TIME_S], [0.0, float("inf")])[1]
    model = stored_margin() if margin is None else margin

    def separated(c: dict) -> bool:
        p = c["predicted"]
        if "plan" in c and "plan" in lead and INTERVAL[STEP_TIME_S] in p:
            return plan_margin(_row(lead), _row(c), model).separated
        return p.get(INTERVAL[STEP_TIME_S], [p[STEP_TIME_S]])[0] > lead_high

    def group(k: str) -> int:
        if separated(cands[k]):
            return 3
        return 1 if cands[k]["predicted"].get(SUPPORT) == "extrapolated" else 2

    rest = sorted(ranking[1:], key=lambda k: group(k))  # stable: the ranking's order within a group
    return ranking[:1] + rest


def _row(c: dict) -> pd.Series:
    """A candidate as a results row for the margin: its plan's knobs, its trainer, its step time and
    interval."""
    p = c["predicted"]
    lo, hi = p.get(INTERVAL[STEP_TIME_S], [p[STEP_TIME_S], p[STEP_TIME_S]])
    plan = {k: (tuple(v) if isinstance(v, list) else v) for k, v in c["plan"].items()}
    return pd.Series(plan | {STEP_TIME_S: p[STEP_TIME_S], LOW[STEP_TIME_S]: lo, HIGH[STEP_TIME_S]: hi})
