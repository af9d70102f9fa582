"""The headroom rule (autopar.search.margins.headroom_pick): between plans the margin cannot tell
apart, the one that fits even at the top of its memory interval is ranked first, at most
`headroom_trade` slower; the runner-up's margin from paired residuals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from autopar.calibration.margin import PairedMargin
from autopar.search.margins import headroom_pick, plan_margin
from autopar.search.results import best_per_trainer, rank_first_for_headroom

GIB = 2**30
#: half-width scale x sqrt(base^2 + k per_knob^2): 0.1 at 0 knobs, sqrt(0.01 + 0.0025 k) else
LOOSE = PairedMargin(base=0.1, per_knob=0.05, scale=1.0, pairs=100)


def _plan(name: str, step: float, mem: float, mem_top: float, tp: int = 4, trainer: str = "megatron", **kw) -> dict:
    return {
        "plan_name": name,
        "trainer": trainer,
        "fits": True,
        "step_time_s": step,
        "rank_time_s": step,
        "step_time_s_low": step * 0.9,
        "step_time_s_high": step * 1.1,
        "peak_memory_bytes": mem * GIB,
        "peak_memory_bytes_high": mem_top * GIB,
        "memory_capacity_bytes": 80 * GIB,
        "tp": tp,
        "pp": kw.get("pp", 4),
        "vpp": kw.get("vpp", 1),
        "cp": 1,
        "ep": 1,
        "dp": kw.get("dp", 16),
        "micro_batch_size": 1,
        "recompute": "none",
        "zero_stage": 1,
        "dtype": "bf16",
    }


def _frame(*plans: dict) -> pd.DataFrame:
    return pd.DataFrame(list(plans))


def test_a_leader_at_the_edge_gives_way_to_a_plan_that_fits_at_the_top_of_its_interval() -> None:
    df = _frame(
        _plan("edge", 10.0, 76.0, 85.0),
        _plan("also-edge", 10.1, 77.0, 86.0),
        _plan("roomy", 10.2, 60.0, 66.0, tp=8, pp=2),
    )
    pick = headroom_pick(df, LOOSE)
    assert pick is not None and pick.position == 2
    line = pick.line(df, "edge", 0.0)
    # 10.2 / 10.0 - 1 = 2.0 %; tp and pp apart: half-width sqrt(0.01 + 2 x 0.0025) = 0.1225
    lo, hi = 100 * math.expm1(math.log(1.02) - math.sqrt(0.015)), 100 * math.expm1(math.log(1.02) + math.sqrt(0.015))
    assert line.startswith("roomy is ranked first for headroom: 2.0 % slower than edge (10.000 s)")
    assert f"2 layout knobs apart: 80 % interval {lo:+.1f} % to {hi:+.1f} %" in line
    assert "(66.0 of 80.0 GiB)" in line and "the faster plan's reaches 85.0 GiB" in line


def test_no_swap_when_the_leader_fits_at_the_top_of_its_interval() -> None:
    df = _frame(_plan("fast", 10.0, 70.0, 79.0), _plan("roomy", 10.1, 50.0, 55.0))
    assert headroom_pick(df, LOOSE) is None


def test_no_swap_beyond_the_trade_or_the_margin() -> None:
    df = _frame(_plan("edge", 10.0, 76.0, 85.0), _plan("roomy", 10.6, 60.0, 66.0, tp=8))  # 6 % slower
    assert headroom_pick(df, LOOSE) is None  # the default trade is 5 %
    assert headroom_pick(df, LOOSE, trade=0.10) is not None
    assert headroom_pick(df, LOOSE, trade=0.0) is None  # the rule off
    tight = PairedMargin(base=0.001, per_knob=0.001, scale=1.0, pairs=100)  # 2 % is then a real margin
    df2 = _frame(_plan("edge", 10.0, 76.0, 85.0), _plan("roomy", 10.2, 60.0, 66.0, tp=8))
    assert headroom_pick(df2, tight) is None


def test_the_space_headroom_counts_against_the_top_of_the_interval() -> None:
    df = _frame(_plan("a", 10.0, 70.0, 79.0), _plan("b", 10.1, 60.0, 66.0, tp=8))
    assert headroom_pick(df, LOOSE, headroom_gib=0.0) is None
    pick = headroom_pick(df, LOOSE, headroom_gib=2.0)  # 79 GiB > 80 - 2
    assert pick is not None and "(66.0 of 78.0 GiB usable)" in pick.line(df, "a", 2.0)


def test_the_pick_leads_every_trainer_of_its_profile_and_only_there() -> None:
    pool = _frame(
        _plan("edge", 10.0, 76.0, 85.0),
        _plan("edge", 10.0, 76.0, 85.0, trainer="nemo"),
        _plan("roomy", 10.2, 60.0, 66.0, tp=8),
        _plan("roomy", 10.2, 60.0, 66.0, tp=8, trainer="nemo"),
        _plan("roomy", 12.0, 62.0, 70.0, tp=8, trainer="torchtitan"),
        _plan("tt-fast", 11.0, 70.0, 78.0, tp=2, trainer="torchtitan"),
    )
    ranked_pool, line = rank_first_for_headroom(pool, LOOSE, 0.0)
    assert line is not None and line.startswith("roomy is ranked first")
    assert ranked_pool["rank_group"].tolist() == [1, 1, 0, 0, 1, 1]  # torchtitan's roomy is another profile
    best = best_per_trainer(ranked_pool, LOOSE, 0.0, 0.05)
    assert best["megatron"]["plan_name"] == "roomy" and best["nemo"]["plan_name"] == "roomy"
    assert best["torchtitan"]["plan_name"] == "tt-fast"  # fits at the top of its own interval


def test_plans_of_different_profiles_combine_their_own_intervals() -> None:
    a = pd.Series(_plan("a", 10.0, 70, 75))
    b = pd.Series(_plan("b", 11.0, 70, 75, trainer="torchtitan"))
    m = plan_margin(a, b, LOOSE)
    assert m.basis == "priced by different profiles"
    own = math.log(11.0 / 9.9)  # each plan's wider side: ln(t / (0.9 t))
    assert m.half_width == pytest.approx(math.hypot(own, own))
    assert m.separated == (math.log(1.1) > m.half_width)
