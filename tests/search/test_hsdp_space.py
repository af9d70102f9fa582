"""Hybrid sharding (HSDP) as a search knob: `dp_shard` lists shard-group sizes besides "all" (ZeRO
shards over every dp x cp rank); a size is a plan only where it divides the data-parallel ranks, is
fewer of them and ZeRO shards something, and the trainers' `hsdp` capability keeps the ZeRO stages
each runs it with (torchtitan's FSDP2 data_parallel_shard_degree with ZeRO-2/3, Megatron's
distributed-optimizer instances with ZeRO-1)."""

from __future__ import annotations

from autopar.calibration.estimate import estimate_table
from autopar.search.enumerate import enumerate_plans, knob_choices
from autopar.search.results import frame
from autopar.search.space import load_space, space_from_dict
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.table import TRAINER

H100 = default_cluster("h100-sxm")
ONE_LAYOUT = {"tp": [1], "pp": [1], "cp": [1], "mbs": [1], "recompute": ["none"]}


def _q(trainers: tuple[str, ...]) -> Question:
    return Question(
        model=get_preset("llama3-8b"), num_gpus=16, cluster=H100, seq_len=4096, global_batch_size=64, trainers=trainers
    )


def test_the_shipped_spaces_shard_over_every_rank() -> None:
    for name in ("default", "dense-large", "long-context", "moe", "local"):
        assert knob_choices(load_space(name), _q(("megatron",)))["dp_shard"] == [-1]


def test_a_space_file_searches_the_listed_shard_sizes() -> None:
    # dp 16: ZeRO-0 shards nothing (all only); ZeRO-3 takes all and 4; 16 is every rank (all again)
    # and 5 divides nothing
    knobs = ONE_LAYOUT | {"zero": [0, 3], "dp_shard": ["all", 4, 5, 16]}
    table = enumerate_plans(space_from_dict({"knobs": knobs}, "test"), _q(("torchtitan",)))
    assert sorted(zip(table.zero_stage.tolist(), table.dp_shard.tolist())) == [(0, -1), (3, -1), (3, 4)]
    names = set(
        frame(table, estimate_table(table, get_preset("llama3-8b"), H100, num_gpus=16, seq_len=4096))["plan_name"]
    )
    assert names == {"dp16", "dp16.hsdp4"}


def test_each_trainer_runs_hybrid_sharding_with_its_own_zero_stages() -> None:
    knobs = ONE_LAYOUT | {"zero": [1, 3], "dp_shard": ["all", 8]}
    table = enumerate_plans(space_from_dict({"knobs": knobs}, "test"), _q(("megatron", "torchtitan")))
    est = estimate_table(table, get_preset("llama3-8b"), H100, num_gpus=16, seq_len=4096)
    names = {v: k for k, v in TRAINER.items()}
    hybrid = {
        (names[int(t)], int(z))
        for t, z, s, ok in zip(table.trainer, table.zero_stage, table.dp_shard, est["valid"])
        if s == 8 and ok
    }
    assert hybrid == {("megatron", 1), ("torchtitan", 3)}
