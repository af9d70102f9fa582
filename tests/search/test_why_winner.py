"""The one-line explanation of the winner (autopar.search.results.why_winner)."""

from __future__ import annotations

import pandas as pd

from autopar.search.results import TIME_TERMS, why_winner


def _row(name: str, mem_gib: float, **times: float) -> pd.Series:
    row = {
        "plan_name": name,
        "step_time_s": 0.0,
        "peak_memory_bytes": mem_gib * 2**30,
        "pp_schedule": "1f1b",
        "recompute": "none",
        "zero_stage": 1,
        "micro_batch_size": 1,
        "dtype": "bf16",
        "tp_comm_overlap": False,
        "layout_text": "",
    }
    row |= {f"time_{t}": times.get(t, 0.0) for t in TIME_TERMS}
    row["step_time_s"] = sum(times.values())
    return pd.Series(row)


def test_names_the_terms_that_differ() -> None:
    line = why_winner(_row("tp2", 10, compute=1.0, tp=0.1), _row("dp2", 10, compute=1.0, dp=0.3))
    assert line.startswith("tp2 beats the runner-up, dp2, by 18.2% per step: ")  # 1.3 s / 1.1 s
    assert "0.3 s less DP comm (exposed)" in line and "0.1 s more TP comm (exposed)" in line


def test_a_tie_on_time_says_so_and_names_the_memory_saved() -> None:
    winner = _row("dp2", 10, compute=1.0)
    runner = _row("dp2", 12, compute=1.0)
    runner["zero_stage"] = 0
    line = why_winner(winner, runner)
    # the same layout twice: the line names what differs, not the layout again
    assert line == (
        "dp2 ties the runner-up, the same layout with ZeRO 0 (not 1), on predicted step time; 2 GiB less memory."
    )
    assert ": ." not in why_winner(winner, _row("dp2", 10, compute=1.0))


def test_negligible_differences_are_not_listed() -> None:
    line = why_winner(_row("a", 10, compute=1.0, dp=0.0, tp=1e-7), _row("b", 10, compute=1.0, dp=0.02))
    assert line.endswith("per step: 0.02 s less DP comm (exposed).")
