"""Streaming enumeration (autopar.search.enumerate.Enumerator): the chunks of a space hold exactly the
plans of the one-shot enumeration, each once, whatever the chunk size: canonical rows are decided row
by row, never by comparing rows across a chunk."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.search.enumerate import Enumerator, enumerate_plans
from autopar.search.space import load_space, space_names
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.table import PlanTable

CASES = [("llama3-70b", 256), ("deepseek-v3", 1024), ("qwen3-30b-a3b", 64), ("tiny", 2)]


def _keys(t: PlanTable) -> np.ndarray:
    cols = [c for c in t.columns if c != "global_batch_size"]
    return np.stack([t.columns[c].astype(np.float64) for c in cols], axis=1)


@pytest.mark.parametrize("space_name", space_names())
@pytest.mark.parametrize("model,gpus", CASES, ids=[m for m, _ in CASES])
def test_chunks_equal_one_shot_and_hold_each_plan_once(space_name, model, gpus):
    m = get_preset(model)
    q = Question(m, gpus, default_cluster("h100-sxm"), m.seq_len, 512)
    space = load_space(space_name)
    whole = enumerate_plans(space, q)
    keys = _keys(whole)
    assert len(np.unique(keys, axis=0)) == len(whole), "a plan appears twice"
    e = Enumerator(space, q)
    for size in (997, 1 << 14):
        parts = [t for _, _, t in e.chunks(size)]
        assert sum(len(t) for t in parts) == len(whole)
        np.testing.assert_array_equal(np.concatenate([_keys(t) for t in parts]), keys)
        assert all(t.layouts is e.layouts for t in parts)
