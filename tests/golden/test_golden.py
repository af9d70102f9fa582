"""Golden files: the shipped examples' results are exactly those recorded in data/ (a refactor
must not move a single bit). After an intended change of the cost model, rerun
`.venv/bin/python tests/golden/regenerate.py` and say why in the commit."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from golden_cases import ESTIMATES, SEARCHES
from golden_runner import run_estimate, run_search

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search_matches_golden(name, tmp_path):
    plans, top = run_search(SEARCHES[name], tmp_path / name)
    golden = pd.read_parquet(DATA / f"{name}.plans.parquet")
    pd.testing.assert_frame_equal(plans, golden, check_exact=True)
    assert top == json.loads((DATA / f"{name}.top.json").read_text())


@pytest.mark.parametrize("name", sorted(ESTIMATES))
def test_estimate_matches_golden(name, tmp_path):
    assert run_estimate(ESTIMATES[name], tmp_path) == json.loads((DATA / f"{name}.estimate.json").read_text())
