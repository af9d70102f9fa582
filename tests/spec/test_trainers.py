"""The trainers' capability table (autopar/spec/data/trainers.toml) as data: complete, sourced, and
read the same way by `autopar trainers`, the search's rules and ParallelPlan.problems."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autopar.errors import InputError
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.trainer_rules import KINDS
from autopar.spec.trainers import ALL_TRAINERS, get_trainer, parse_trainers, trainers
from autopar.spec.trainers import KINDS as TABLE_KINDS


def test_every_trainer_states_every_capability_with_its_source():
    assert set(TABLE_KINDS) | {"recipes"} == set(KINDS), "every kind in the table has a rule, every rule a kind"
    for key, t in trainers().items():
        assert set(t.capabilities) == set(TABLE_KINDS), key
        for c in t.capabilities.values():
            assert c.source.strip(), f"{key}:{c.kind} has no source"


def test_unknown_trainer_is_one_line_with_did_you_mean():
    with pytest.raises(InputError, match="did you mean 'deepspeed'"):
        get_trainer("dpeespeed")
    assert parse_trainers(None) == ("megatron", "nemo", "bridge", "torchtitan", "deepspeed")
    assert parse_trainers(None, "local") == ("autopar",)
    assert parse_trainers("torchtitan, megatron") == ("torchtitan", "megatron")


def test_a_knob_the_trainer_lacks_names_the_limit_and_the_fix():
    problems = ParallelPlan(tp=8, pp=4, cp=2, dp=4, global_batch_size=512, trainer="deepspeed").problems(
        get_preset("llama3-70b"), num_gpus=256
    )
    assert problems == [p for p in problems if "DeepSpeed cannot run" in p]
    cp = [p for p in problems if "context parallelism (cp = 2)" in p]
    assert cp and "use --cp 1, or --trainer megatron / torchtitan" in cp[0]


def test_nemo_runs_only_models_with_a_recipe():
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=512, trainer="nemo")
    assert plan.problems(get_preset("llama3-70b"), num_gpus=256) == []
    assert any("has no recipe for llama2-13b" in p for p in plan.problems(get_preset("llama2-13b"), num_gpus=256))


def test_autopar_trainers_json_lists_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "autopar", "trainers", "--json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data) == list(ALL_TRAINERS)
    assert data["deepspeed"]["capabilities"]["cp"]["value"] is False
    assert data["megatron"]["profile"] == "megatron" and data["torchtitan"]["profile"] == "torchtitan"


@pytest.mark.parametrize("trainer", ["megatron", "nemo", "bridge"])
def test_tp_overlap_needs_tensor_and_sequence_parallelism_on_megatron_core(trainer):
    """megatron/training/arguments.py turns sequence parallelism off at TP 1 and refuses the TP
    overlap without it; megatron-core's model_parallel_config.py refuses SP without TP."""
    model = get_preset("llama3-8b")
    at_tp1 = ParallelPlan(tp=1, dp=8, global_batch_size=64, tp_comm_overlap=True, trainer=trainer)
    assert any("without tensor parallelism" in p for p in at_tp1.problems(model, num_gpus=8))
    without_sp = ParallelPlan(tp=2, dp=4, global_batch_size=64, tp_comm_overlap=True, sequence_parallel=False)
    assert any(
        "without sequence parallelism" in p for p in without_sp.with_(trainer=trainer).problems(model, num_gpus=8)
    )
    ok = ParallelPlan(tp=2, dp=4, global_batch_size=64, tp_comm_overlap=True, sequence_parallel=True, trainer=trainer)
    assert ok.problems(model, num_gpus=8) == []


def test_async_tp_at_tp_1_is_a_no_op_for_torchtitan():
    """torchtitan applies async TP inside its TP plan only: at TP 1 the flag changes nothing, and is
    not refused (only without --compile at TP > 1)."""
    model = get_preset("llama3-8b")
    plan = ParallelPlan(tp=1, dp=8, global_batch_size=64, tp_comm_overlap=True, trainer="torchtitan")
    assert not any("TP communication overlap" in p for p in plan.problems(model, num_gpus=8))
