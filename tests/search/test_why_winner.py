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


def test_a_moe_winner_says_what_decides_its_ep_size() -> None:
    """Against the fastest fitting plan at another EP size (not the runner-up at the same size): the
    step-time terms that differ and the memory, by hand from the rows below."""
    from autopar.search.results import ep_choice_line

    def plan(name, size, mem, **times):
        return _row(name, mem, **times).to_dict() | {"ep": size, "fits": True, "trainer": "megatron"}

    winner = plan("dp8.ep8", 8, 60, compute=9.5, ep=0.5)
    rows = [winner, plan("dp8.ep8-b", 8, 50, compute=9.9, ep=0.5), plan("dp8.ep4", 4, 70, compute=10.3)]
    pool = pd.DataFrame(rows + [plan("dp8.ep2", 2, 75, compute=11.0)])
    line = ep_choice_line(pd.Series(winner), pool)
    # 10.3 / 10.0 - 1 = 3.0 %; compute 10.3 - 9.5 = 0.8 s saved; 0.5 s of all-to-all paid; 70 - 60 GiB
    assert line == (
        "Why EP 8: the fastest plan at another EP size, dp8.ep4 (EP 4), is 3.0% slower per step; against it "
        "EP 8 has 0.8 s less compute, 0.5 s more EP all-to-all (exposed), and 10.0 GiB less memory."
    )
    assert ep_choice_line(pd.Series(winner), pool[pool["ep"] == 8]) == ""  # no other EP size
