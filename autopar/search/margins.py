"""Ranking under uncertainty: how far apart two plans are under the model's own error, and the
headroom rule that prefers, between plans the model cannot tell apart, one that fits even at the
top of its memory interval.

- The margin of plan b over plan a is ln(t_b / t_a). Two plans of one performance profile share
  part of their error, so its 80 % interval comes from paired published runs
  (autopar.calibration.margin: wider the more layout knobs they differ in); plans of different
  profiles combine their own intervals. "Cannot tell apart" means that interval holds 0.
- The headroom rule: the fastest plan's peak memory has an 80 % interval too
  (autopar.calibration.uncertainty). When its top lies beyond the GPU's memory (the plan may well
  not fit), and a plan the margin cannot separate from it stays inside at the top of its own
  interval, that plan is ranked first, and the line says what it costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autopar.calibration.margin import PAIR_KNOBS, PairedMargin, knobs_apart, unpaired_half_width
from autopar.calibration.uncertainty import support_points
from autopar.figures import HIGH, LOW, MEMORY_CAPACITY_BYTES, PEAK_MEMORY_BYTES, PLAN_NAME, STEP_TIME_S
from autopar.spec.hardware import GIB
from autopar.spec.trainers import get_trainer


@dataclass(frozen=True)
class Margin:
    """Plan b against plan a: ln(t_b / t_a) and the half-width of its 80 % interval."""

    log_ratio: float
    half_width: float
    #: what the interval stands on, in words ("2 layout knobs apart", "priced by different profiles")
    basis: str

    @property
    def separated(self) -> bool:
        """Whether the interval excludes a tie: the ranking holds under the model's own error."""
        return abs(self.log_ratio) > self.half_width

    def percent_range(self) -> tuple[float, float]:
        """The interval of t_b / t_a - 1, in percent."""
        return 100 * math.expm1(self.log_ratio - self.half_width), 100 * math.expm1(self.log_ratio + self.half_width)


def _knobs(row: pd.Series) -> dict:
    """A result row's PAIR_KNOBS (what is recomputed as one value: the mode, its modules and layers)."""
    out = {k: row[k] for k in PAIR_KNOBS if k in row.index}
    out["recompute"] = tuple(str(row.get(k, "")) for k in ("recompute", "recompute_modules", "recompute_layers"))
    return out


def _own_half_width(row: pd.Series) -> float:
    """A plan's own log half-width of step time (the wider side of its interval)."""
    t, lo, hi = (float(row.get(k, math.nan)) for k in (STEP_TIME_S, LOW[STEP_TIME_S], HIGH[STEP_TIME_S]))
    if not (t > 0 and lo > 0 and hi > 0):
        return math.nan
    return max(math.log(hi / t), math.log(t / lo))


def plan_margin(a: pd.Series, b: pd.Series, margin: PairedMargin | None) -> Margin:
    """Plan b against plan a (rows of the search's results, each on its trainer)."""
    ratio = math.log(float(b[STEP_TIME_S]) / float(a[STEP_TIME_S]))
    same_profile = get_trainer(str(a["trainer"])).profile == get_trainer(str(b["trainer"])).profile
    if same_profile and margin is not None:
        k = knobs_apart(_knobs(a), _knobs(b))
        return Margin(ratio, margin.half_width(k), f"{k} layout knob{'' if k == 1 else 's'} apart")
    basis = "priced by different profiles" if not same_profile else "with no fitted margin model"
    return Margin(ratio, unpaired_half_width(_own_half_width(a), _own_half_width(b)), basis)


def stored_margin() -> PairedMargin | None:
    """The shipped margin model (data/profiles.cv.json), or None where it was not fitted."""
    return support_points().margin


@dataclass(frozen=True)
class HeadroomPick:
    """The plan the headroom rule ranks first (`position`: its row in the ranked frame), against the
    fastest (row 0): the margin between them and the memory they may reach."""

    position: int
    margin: Margin
    usable_bytes: float  # the GPU's memory less the space's headroom

    def line(self, fit: pd.DataFrame, lead_text: str, headroom_gib: float) -> str:
        """Why, in one line; `lead_text` names the fastest plan against the pick (its layout, or
        what differs when the two share one)."""
        lead, pick = fit.iloc[0], fit.iloc[self.position]
        lo, hi = self.margin.percent_range()
        slower = 100 * math.expm1(self.margin.log_ratio)
        room = self.usable_bytes / GIB
        usable = f"{room:.1f} GiB usable" if headroom_gib > 0 else f"{room:.1f} GiB"
        return (
            f"{pick[PLAN_NAME]} is ranked first for headroom: {slower:.1f} % slower than {lead_text} "
            f"({float(lead[STEP_TIME_S]):.3f} s), a difference the model cannot resolve ({self.margin.basis}: "
            f"80 % interval {lo:+.1f} % to {hi:+.1f} %); it stays within memory at the top of its interval "
            f"({_memory_top(pick) / GIB:.1f} of {usable}), where the faster plan's reaches "
            f"{_memory_top(lead) / GIB:.1f} GiB."
        )


def _memory_top(row: pd.Series) -> float:
    return float(row.get(HIGH[PEAK_MEMORY_BYTES], row[PEAK_MEMORY_BYTES]))


#: the largest share of predicted step time the search gives up to rank a plan first for headroom,
#: unless the space sets `headroom_trade`. A policy, not physics: a plan at the edge of its memory
#: interval may still run (it stays listed), while a slower plan costs every step of the run; 5 %
#: covers the gap between the fastest plans and NVIDIA's recipes, which leave a fifth of the GPU free
#: (llama3 70B tp4 pp4 vpp5 cp2: 55.8 of 79.6 GiB by autopar's model)
HEADROOM_TRADE = 0.05


def headroom_pick(
    fit: pd.DataFrame, margin: PairedMargin | None, headroom_gib: float = 0.0, trade: float = HEADROOM_TRADE
) -> HeadroomPick | None:
    """Over fitting plans in rank order (`fit`): when the first's memory interval reaches beyond the
    GPU's memory (less the space's headroom), the fastest plan that stays inside at the top of its
    own, is at most `trade` slower, and that the margin cannot separate from the first; None
    otherwise (or without intervals)."""
    if fit.empty or trade <= 0 or HIGH[PEAK_MEMORY_BYTES] not in fit.columns:
        return None
    lead = fit.iloc[0]
    room = fit[MEMORY_CAPACITY_BYTES].to_numpy(dtype=float) - headroom_gib * GIB
    if _memory_top(lead) <= room[0]:
        return None
    time = fit[STEP_TIME_S].to_numpy(dtype=float)
    safe = fit[HIGH[PEAK_MEMORY_BYTES]].to_numpy(dtype=float) <= room
    for i in np.flatnonzero(safe & (time <= time[0] * (1 + trade))):
        m = plan_margin(lead, fit.iloc[i], margin)
        if not m.separated:
            return HeadroomPick(int(i), m, float(room[0]))
    return None
