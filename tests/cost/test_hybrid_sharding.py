"""Hybrid sharding (--dp-shard, HSDP): the dense states shard over dp_shard ranks instead of the
whole dp x cp group, and each gradient reduction adds an all-reduce of the shard across its copies.
Every figure is derived by hand from the ZeRO paper's byte counts and the collectives' payload rule
(autopar.cost.comm.payload: a reduce-scatter and an all-reduce hand over the whole buffer, an
all-gather its 1/n shard)."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.calibration.estimate import estimate
from autopar.cost.collectives import Group, Links, collective_seconds
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan, PlanError
from autopar.spec.presets import resolve_model

GIB = 2**30


@pytest.fixture(scope="module")
def setting():
    return resolve_model("70b"), default_cluster("h100-sxm")


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=64, micro_batch_size=1, global_batch_size=64, recompute="full")
    return ParallelPlan(**(base | kw))


def _estimate(setting, plan):
    model, cluster = setting
    return estimate(plan, model, cluster, num_gpus=plan.num_gpus, seq_len=8192)


def test_fsdp_states_shard_over_the_shard_group(setting) -> None:
    """torchtitan FSDP2 (ZeRO-3) keeps fp32 weights, fp32 gradients and Adam's 8 bytes per
    parameter sharded: with shards of 8 ranks each GPU holds P/8 of them, not P/64."""
    model, _ = setting
    p = model.params_total
    full = _estimate(setting, _plan(zero_stage=3, trainer="torchtitan"))
    hsdp = _estimate(setting, _plan(zero_stage=3, trainer="torchtitan", dp_shard=8))
    for est, shard in ((full, 64), (hsdp, 8)):
        assert est.memory_bytes["weights"] == pytest.approx(4 * p / shard, rel=1e-9)
        assert est.memory_bytes["gradients"] == pytest.approx(4 * p / shard, rel=1e-9)
        assert est.memory_bytes["optimizer"] == pytest.approx(8 * p / shard, rel=1e-9)
    assert hsdp.memory_bytes["activations"] == full.memory_bytes["activations"]


def test_distributed_optimizer_instances_shard_the_optimizer(setting) -> None:
    """Megatron's distributed optimizer with dp x cp / dp_shard instances: 12 bytes of fp32 master
    and Adam state per parameter over dp_shard ranks; weights (2 B) and fp32 main gradients (4 B)
    stay whole."""
    model, _ = setting
    p = model.params_total
    est = _estimate(setting, _plan(zero_stage=1, dp_shard=16))
    assert est.memory_bytes["optimizer"] == pytest.approx(12 * p / 16, rel=1e-9)
    assert est.memory_bytes["weights"] == pytest.approx(2 * p, rel=1e-9)
    assert est.memory_bytes["gradients"] == pytest.approx(4 * p, rel=1e-9)


def test_the_shards_all_reduce_adds_its_payload(setting) -> None:
    """One microbatch of ZeRO-3: a reduce-scatter of the fp32 gradients (4P handed over), two
    all-gathers of the bf16 weights (2P/n each) and, with shards of 8, an all-reduce of the 4P/8
    shard across the 8 copies."""
    model, _ = setting
    p = model.params_total
    full = _estimate(setting, _plan(zero_stage=3, trainer="torchtitan"))
    hsdp = _estimate(setting, _plan(zero_stage=3, trainer="torchtitan", dp_shard=8))
    assert full.comm_bytes_per_gpu["dp"] == pytest.approx(4 * p + 2 * (2 * p / 64), rel=1e-9)
    assert hsdp.comm_bytes_per_gpu["dp"] == pytest.approx(4 * p + 2 * (2 * p / 8) + 4 * p / 8, rel=1e-9)


def test_the_reduction_runs_inside_the_node_then_across(setting) -> None:
    """With shards of 8 on nodes of 8 the reduce-scatter stays on NVLink (8 ranks in one node) and
    the all-reduce of the shard crosses 8 nodes with one rank each: the reduction's seconds are the
    two collectives priced on those groups, bucket by bucket (n equal buckets of the trainer's
    bucket size, each call at its own message size)."""
    from autopar.cost.comm_terms import comm_terms
    from autopar.cost.price import prepare
    from autopar.spec.table import PlanTable

    model, cluster = setting
    plan = _plan(zero_stage=1, dp_shard=8)
    prepared = prepare(PlanTable.from_plans([plan]), model, cluster, num_gpus=64, seq_len=8192)
    terms = comm_terms(prepared.x, model, cluster, prepared.params)
    grads = 4.0 * float(np.ravel(prepared.params.dense)[0])
    links = Links.of(cluster)

    def group(size, per_node):
        return Group(np.array([size]), np.array([per_node]), np.array([size // per_node]))

    k = cluster.constants
    n = np.ceil(float(np.ravel(prepared.params.dense)[0]) / max(k.dp_bucket_params, 8 * k.dp_bucket_params_per_rank))
    assert n > 1
    bucket = grads / n
    by_hand = n * (
        collective_seconds("reduce_scatter", bucket, group(8, 8), links)
        + collective_seconds("all_reduce", bucket / 8, group(8, 1), links)
    )
    assert float(np.ravel(terms.dp_reduce.seconds)[0]) == pytest.approx(float(by_hand[0]), rel=1e-9)
    # the last bucket is what the backward cannot hide
    assert float(np.ravel(terms.dp_reduce_tail)[0]) == pytest.approx(float(by_hand[0]) / n, rel=1e-9)


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(dp_shard=3), "does not divide"),
        (dict(dp_shard=8, zero_stage=0), "ZeRO 1, 2 or 3"),
        (dict(dp_shard=0), "positive integer"),
    ],
)
def test_a_shard_that_cannot_be_is_refused(kw, needle) -> None:
    with pytest.raises(PlanError, match=needle):
        _plan(**kw)


def test_trainers_without_hybrid_sharding_refuse_it(setting) -> None:
    """DeepSpeed partitions over the whole data-parallel group; Megatron offers the partial
    distributed optimizer (ZeRO-1) only; a mixture-of-experts model is not priced with it."""
    assert any(
        "hybrid sharding" in r for r in _estimate(setting, _plan(zero_stage=1, dp_shard=8, trainer="deepspeed")).reasons
    )
    assert any("hybrid sharding" in r for r in _estimate(setting, _plan(zero_stage=3, dp_shard=8)).reasons)
    assert _estimate(setting, _plan(zero_stage=1, dp_shard=8)).valid  # valid (70B does not fit on dp alone)
    _, cluster = setting
    moe = resolve_model("qwen3-30b-a3b")
    est = estimate(_plan(zero_stage=1, dp_shard=8, ep=8), moe, cluster, num_gpus=64, seq_len=4096)
    assert any("mixture-of-experts" in r for r in est.reasons)
