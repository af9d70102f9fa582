"""Golden files: the shipped examples' results are those recorded in data/ (a refactor must not
move a figure). After an intended change of the cost model, rerun
`.venv/bin/python tests/golden/regenerate.py` and say why in the commit.

Floats are compared to a relative 1e-9, not bit for bit: numpy and pandas are not pinned, and their
reductions (quantiles, sums) may round the last bit differently from one release or CPU to the next
(a clean-clone CI failed on 15.65397032387548 against 15.653970323875482). Any change of the cost
model moves a figure by far more than 1e-9."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from golden_cases import ESTIMATES, SEARCHES
from golden_runner import run_estimate, run_search

DATA = Path(__file__).resolve().parent / "data"
RTOL = 1e-9


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


def test_assert_close_catches_a_real_difference():
    assert_close({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 * (1 + 1e-12)]})
    with pytest.raises(AssertionError, match=r"\.a\[1\]"):
        assert_close({"a": [1.0, 2.0]}, {"a": [1.0, 2.0 * (1 + 1e-6)]})
    with pytest.raises(AssertionError, match="keys"):
        assert_close({"a": 1}, {"b": 1})


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_matches_golden(name, tmp_path):
    plans, top = run_search(SEARCHES[name], tmp_path / name)
    golden = pd.read_parquet(DATA / f"{name}.plans.parquet")
    pd.testing.assert_frame_equal(plans, golden, check_exact=False, rtol=RTOL, atol=0.0)
    assert_close(top, json.loads((DATA / f"{name}.top.json").read_text()), name)


@pytest.mark.parametrize("name", sorted(ESTIMATES))
def test_estimate_matches_golden(name, tmp_path):
    assert_close(
        run_estimate(ESTIMATES[name], tmp_path), json.loads((DATA / f"{name}.estimate.json").read_text()), name
    )
