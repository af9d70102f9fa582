"""Golden files: the shipped examples' results are those recorded in data/ (a refactor must not
move a figure, nor a refit of the profiles reorder a ranking). After an intended change of the cost
model, rerun `.venv/bin/python tests/golden/regenerate.py` and say why in the commit.

Rankings, layouts, names and every integer are compared exactly; floats to a relative `RTOL` of
0.2 %: a refit of the profiles moves the shipped examples' figures by a few hundredths of a percent
(the constants are stored to 4 digits: autopar.cost.profiles STORED_DIGITS), which is no change of
the cost model's answer, while any change of a mechanism moves them by more. numpy and pandas are
not pinned either, and their reductions may round the last bits differently."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from golden_cases import ESTIMATES, SEARCHES
from golden_runner import run_estimate, run_search

DATA = Path(__file__).resolve().parent / "data"
RTOL = 2e-3


def assert_close(got: object, want: object, where: str = "") -> None:
    """Equal JSON values, floats within RTOL; the path of the first difference in the message."""
    if isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, (int, float)) and isinstance(want, (int, float)), f"{where}: {got!r} != {want!r}"
        same = (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=RTOL, abs_tol=0.0)
        assert same, f"{where}: {got!r} != {want!r}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def assert_frame_close(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal frames, float columns within RTOL, the rest exact: pandas' assert_frame_equal column by
    column, the float ones inexact (check_exact=False on a categorical column compares it value by
    value in Python: most of a golden search's time)."""
    pd.testing.assert_index_equal(got.columns, want.columns)
    pd.testing.assert_index_equal(got.index, want.index)
    for c in want.columns:
        inexact = pd.api.types.is_float_dtype(want[c].dtype)
        pd.testing.assert_series_equal(
            got[c], want[c], check_exact=not inexact, rtol=RTOL, atol=0.0, obj=f"column '{c}'"
        )


def test_assert_frame_close_catches_a_real_difference():
    want = pd.DataFrame({"x": [1.0, 2.0], "name": pd.Categorical(["a", "b"]), "n": [1, 2]})
    assert_frame_close(want.assign(x=[1.0, 2.0 * (1 + 1e-4)]), want)
    with pytest.raises(AssertionError, match="column .x."):
        assert_frame_close(want.assign(x=[1.0, 2.0 * (1 + 1e-2)]), want)
    with pytest.raises(AssertionError, match="column .name."):
        assert_frame_close(want.assign(name=pd.Categorical(["a", "c"])), want)
    with pytest.raises(AssertionError, match="column .n."):
        assert_frame_close(want.assign(n=[1, 3]), want)


def test_assert_close_catches_a_real_difference():
    assert_close({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 * (1 + 1e-4)]})
    with pytest.raises(AssertionError, match=r"\.a\[1\]"):
        assert_close({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 * (1 + 1e-2)]})
    with pytest.raises(AssertionError, match="keys"):
        assert_close({"a": 1}, {"b": 1})


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_matches_golden(name, tmp_path):
    plans, top = run_search(SEARCHES[name], tmp_path / name)
    golden = pd.read_parquet(DATA / f"{name}.plans.parquet")
    assert_frame_close(plans, golden)
    assert_close(top, json.loads((DATA / f"{name}.top.json").read_text()), name)


@pytest.mark.parametrize("name", sorted(ESTIMATES))
def test_estimate_matches_golden(name, tmp_path):
    assert_close(
        run_estimate(ESTIMATES[name], tmp_path), json.loads((DATA / f"{name}.estimate.json").read_text()), name
    )
