"""An Optuna trial's value comes from one completion of its structure: the fastest that fits, else
the valid one closest to fitting. The trial prices its completions on the search's light columns
and only that one in full; the reference below prices every completion in full and picks by the
same rule, as the trials did before."""

from __future__ import annotations

import pytest

from autopar.search.enumerate import build_table, knob_choices
from autopar.search.evaluate import best_completion, evaluate
from autopar.search.optuna_driver import completion_values


def _structure(space, q, **outer):
    choices = knob_choices(space, q)
    picks = {a: 0 for a in ("tp", "cp", "pp", "ep", "etp", "dtype", "tp_comm_overlap")}
    picks |= {a: choices[a].index(v) for a, v in outer.items()}
    return build_table(space, q, completion_values(picks, choices), choices)


def _reference(df):
    """The selection the trials made on the full frame (autopar.search.optuna_driver._score)."""
    fit, valid = df[df["fits"]], df[df["valid"]]
    if len(fit):
        return fit.loc[fit["rank_time_s"].idxmin()]
    if len(valid):
        return valid.loc[valid["memory_miss_gib"].idxmin()]
    return df.iloc[0]


@pytest.mark.parametrize(("model", "gpus", "outer"), [("llama3-70b", 64, {"tp": 4, "pp": 2}), ("405b", 64, {})])
def test_the_trials_completion_is_the_one_full_pricing_picks(sh, model, gpus, outer) -> None:
    # 70B on tp4 pp2 fits; 405B on 64 GPUs with no model parallelism does not, so the closest wins
    q, space = sh.question(model, gpus, "default")
    table = _structure(space, q, **outer)
    headroom = float(space.constraints["memory_headroom_gib"])
    full = evaluate(table, q, headroom)
    want = _reference(full)
    got, i = best_completion(table, q, headroom)
    assert len(got) == 1 and bool(got["fits"].iloc[0]) == bool(want["fits"])
    assert got["plan_name"].iloc[0] == want["plan_name"]
    for column in ("rank_time_s", "step_time_s", "peak_memory_bytes", "memory_miss_gib", "mfu"):
        assert float(got[column].iloc[0]) == pytest.approx(float(want[column]), rel=1e-12, abs=1e-12), column
    assert i == int(want.name)  # the same row of the table (the frame's index is the table's order)
    if model == "405b":
        assert not full["fits"].any() and full["valid"].any()
