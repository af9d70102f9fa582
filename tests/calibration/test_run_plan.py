"""A published run's plan where its row is silent: the recompute of Megatron-Bridge's library recipe.

megatron-bridge 0.2.0rc6 (2025-10-06, the last 0.2 build on PyPI before NeMo 25.11) and 0.3.0
(NeMo 26.02), `recipes/qwen/qwen3_moe.py`:
`qwen3_30b_a3b_pretrain_config` passes `enable_recompute=True`, and `_qwen3_moe_common` then sets
`recompute_granularity = "full"`, `recompute_method = "uniform"`, `recompute_num_layers = 1`
(every layer recomputed); the Qwen3-235B-A22B recipe leaves `enable_recompute` at its default,
False; the 25.09 branch (0.1.0rc4) has no Qwen3 recipe at all.
"""

from __future__ import annotations

import pytest

from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs


@pytest.fixture(scope="module")
def by_row():
    cases, _ = build_cases(load_runs(None))
    return {str(c.row_id): c for c in cases}


@pytest.mark.parametrize("row", ["59", "65", "70"])  # Qwen3-30B-A3B: 25.11 H100, 25.11 B200, 26.02 H100
def test_bridge_qwen3_30b_rows_recompute_every_layer_as_their_recipe(by_row, row):
    case = by_row[row]
    assert case.source in ("bridge-25.11", "bridge-26.02")
    assert (case.plan.recompute, case.plan.recompute_layers) == ("full", None)
    assert any("Megatron-Bridge library recipe" in a for a in case.assumptions)


@pytest.mark.parametrize("row", ["53", "60", "66", "71"])  # 25.09's Qwen3-30B; Qwen3-235B of 25.11, 26.02
def test_other_bridge_rows_keep_no_recompute(by_row, row):
    case = by_row[row]
    assert case.plan.recompute == "none"
    assert "recompute not stated: assumed none" in case.assumptions
