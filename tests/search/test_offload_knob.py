"""The optimizer-offload knob of a search space (autopar.search.space FLOAT_KNOBS): the default space
leaves it at 0, a space file lists shares to search, and a search where nothing fits says when
offloading the optimizer would fit the closest plan (autopar.search.run.offload_hint)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autopar.errors import InputError
from autopar.search.enumerate import enumerate_plans, knob_choices
from autopar.search.evaluate import evaluate
from autopar.search.run import offload_hint
from autopar.search.space import load_space, space_from_dict
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.table import PlanTable


def _q(model: str, gpus: int, gbs: int) -> Question:
    return Question(
        model=get_preset(model),
        num_gpus=gpus,
        cluster=default_cluster("h100-sxm"),
        seq_len=4096,
        global_batch_size=gbs,
        trainers=("megatron",),
    )


def test_the_default_space_does_not_offload() -> None:
    assert knob_choices(load_space("default"), _q("llama3-8b", 16, 64))["optimizer_offload"] == [0.0]


def test_a_space_file_searches_the_listed_shares() -> None:
    """tp 8 x dp 2, ZeRO-1, no recompute, mbs 1: one layout, so the plans are the three shares."""
    knobs = {"tp": [8], "pp": [1], "cp": [1], "zero": [1], "mbs": [1], "recompute": ["none"]}
    space = space_from_dict({"knobs": knobs | {"optimizer_offload": [0, 0.5, 1]}}, "test")
    table = enumerate_plans(space, _q("llama3-8b", 16, 64))
    assert sorted(np.unique(table.optimizer_offload)) == [0.0, 0.5, 1.0]
    assert len(table) == 3


@pytest.mark.parametrize("bad", [[1.5], [-0.5], ["half"], [True]])
def test_a_share_outside_0_to_1_is_refused(bad) -> None:
    with pytest.raises(InputError, match="optimizer_offload"):
        space_from_dict({"knobs": {"optimizer_offload": bad}}, "test")


def test_nothing_fits_names_the_offload_that_would() -> None:
    """70B on 8 H100 with tp 8, ZeRO-1 over one data-parallel rank: 12 B x P / 8 = 98.6 GiB of Adam
    states per GPU alone exceed the 79.6 GiB; offloaded, the plan fits."""
    q = _q("llama3-70b", 8, 8)
    plan = ParallelPlan(tp=8, dp=1, zero_stage=1, global_batch_size=8, recompute="full")
    closest = evaluate(PlanTable.from_plans([plan]), q, 0.0)
    assert not closest["fits"].iloc[0]
    assert 12 * q.model.params_total / 8 / 2**30 == pytest.approx(98.6, rel=1e-3)
    hint = offload_hint(q, closest, [], 0.0)
    assert "--optimizer-offload 1" in hint and "--trainer megatron" in hint
    assert offload_hint(q, pd.DataFrame(), [], 0.0) == ""
