"""Pricing once per run of equal plans (autopar.cost.runs.on_runs, autopar.spec.stages._distinct,
autopar.calibration.estimate's pipeline-depth bands) gives exactly what pricing every plan gives."""

from __future__ import annotations

import numpy as np

from autopar.calibration.estimate import _MIN_BAND, _by_pipeline_depth, estimate_per_trainer, estimate_table
from autopar.cost.runs import on_runs
from autopar.search.enumerate import enumerate_plans
from autopar.search.space import space_from_dict
from autopar.spec.hardware import default_cluster
from autopar.spec.plan_fields import TRAINER
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.stages import _distinct


def _runs(rng, n: int, values) -> np.ndarray:
    """n plans in runs of 1-30 equal values drawn from `values`."""
    out = []
    while len(out) < n:
        out += [rng.choice(values)] * int(rng.integers(1, 30))
    return np.asarray(out[:n])


def test_on_runs_equals_the_function_on_every_plan():
    rng = np.random.default_rng(7)
    n = 5000
    nbytes = _runs(rng, n, [1e6, 3e6, np.nan, 2.5e8])
    per_rank = np.stack([_runs(rng, n, [1.0, 2.0]), _runs(rng, n, [4.0, 8.0])])  # (ranks, plans)
    column = np.array([[2.0], [3.0]])  # one value for every plan (C, 1)
    seen = []

    def fn(a, b, c, d):
        seen.append(np.shape(a)[-1])
        return np.sqrt(a) * b + c * d

    got = on_runs(fn, nbytes, per_rank, column, 0.5)
    want = np.sqrt(nbytes) * per_rank + column * 0.5
    np.testing.assert_array_equal(got, want)
    assert got.shape == (2, n)
    # the function saw one plan per run: fewer than half the plans
    changes = 1 + np.count_nonzero((nbytes[1:] != nbytes[:-1]) | (per_rank[:, 1:] != per_rank[:, :-1]).any(axis=0))
    assert seen == [changes] and changes < n // 2


def test_on_runs_prices_every_plan_when_runs_are_short_or_few_plans():
    calls = []

    def fn(a):
        calls.append(len(a))
        return a * 2

    alternating = np.tile([1.0, 2.0], 2000)
    np.testing.assert_array_equal(on_runs(fn, alternating), alternating * 2)
    few = np.ones(10)
    np.testing.assert_array_equal(on_runs(fn, few), few * 2)
    assert calls == [4000, 10]


def test_distinct_ranks_drop_each_plans_repeats():
    # three plans: ranks 0,0,0,3 / 0,1,1,1 / 0,1,2,3 (sorted, as _costed_ranks sorts them)
    ranks = np.array([[0, 0, 0], [0, 1, 1], [0, 1, 2], [3, 1, 3]])
    want = np.array([[0, 0, 0], [3, 1, 1], [3, 1, 2], [3, 1, 3]])
    np.testing.assert_array_equal(_distinct(ranks), want)
    # two plans of one rank each: one row
    np.testing.assert_array_equal(_distinct(np.array([[0, 2], [0, 2], [0, 2]])), np.array([[0, 2]]))


def test_depth_bands_cover_every_plan_once_and_join_small_bands():
    pp = np.array([1] * 5000 + [2] * 10 + [4] * 5000 + [16] * 3)
    parts = _by_pipeline_depth(pp)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(pp)))
    assert all(len(p) >= _MIN_BAND for p in parts)
    assert [sorted(set(pp[p].tolist())) for p in parts] == [[1], [2, 4, 16]]


def test_banded_search_pricing_equals_pricing_the_whole_table(monkeypatch):
    """A space with every pipeline depth: each band priced apart gives the figures of the whole
    table priced at once (estimate_table, search=True). Bands of 500 plans, so that this small
    space has several."""
    monkeypatch.setattr("autopar.calibration.estimate._MIN_BAND", 500)
    model = get_preset("llama3-70b")
    cluster = default_cluster("h100-sxm")
    knobs = {
        "tp": [2, 4, 8],
        "pp": [1, 2, 4, 8, 16],
        "vpp": [1, 2],
        "cp": [1, 2],
        "zero": [1, 3],
        "mbs": [1, 2, 4],
        "recompute": ["none", "selective", "full"],
        "pp_schedule": ["1f1b", "gpipe"],
    }
    table = enumerate_plans(
        space_from_dict({"name": "b", "knobs": knobs}, "test"), Question(model, 256, cluster, 8192, 512)
    )
    assert len(_by_pipeline_depth(np.asarray(table.pp))) >= 4
    (banded,) = estimate_per_trainer(table, model, cluster, ("megatron",), num_gpus=256, seq_len=8192)
    whole = estimate_table(
        table.with_columns(trainer=TRAINER["megatron"]), model, cluster, num_gpus=256, seq_len=8192, search=True
    )
    np.testing.assert_array_equal(banded["valid"], whole["valid"])
    priced = np.asarray(whole["valid"], dtype=bool)  # the search prices no plan its rules reject
    assert priced.sum() > 3000
    for col in ("step_time_s", "peak_memory_bytes", "fits"):
        np.testing.assert_array_equal(np.asarray(banded[col])[priced], np.asarray(whole[col])[priced], err_msg=col)
