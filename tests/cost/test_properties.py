"""Property tests of the cost model on random valid plans (hypothesis).

Each property is a monotonicity or proportionality stated by the seeds or by the formulas the
model implements (16N / ZeRO sharding, (p-1)/(m+p-1), Korthikanti's activations, per-call
collective payloads); the plans are drawn from small grids over presets and filtered with
`plan.problems(...) == []`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autopar.calibration.estimate import estimate
from autopar.cost.pipeline import bubble_fraction
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.table import SCHED

CLUSTER = default_cluster("h100-sxm")
MODELS = {n: get_preset(n) for n in ("llama3-8b", "llama3-70b", "mixtral-8x7b")}
SEQ = 4096
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)


@st.composite
def plans(
    draw,
    *,
    tp=(1, 2, 4, 8),
    pp=(1, 2, 3, 4, 8),
    allow_vpp=True,
    zero=(0, 1, 2, 3),
    recompute=("none", "selective", "full"),
):
    """(model name, plan) on a small grid; ep only for the MoE preset (dividing 8 experts and
    tp*dp); interleaving only with m a multiple of pp."""
    name = draw(st.sampled_from(sorted(MODELS)))
    t = draw(st.sampled_from(tp))
    p = draw(st.sampled_from(pp))
    d = draw(st.sampled_from((1, 2, 4, 8)))
    mbs = draw(st.sampled_from((1, 2)))
    vpp = draw(st.sampled_from((1, 2))) if (allow_vpp and p > 1) else 1
    k = draw(st.integers(1, 4))
    m = k * p if vpp > 1 else draw(st.integers(1, 16))
    ep = 1
    if MODELS[name].moe is not None:
        ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (t * d) % (e * t) == 0]))
    plan = ParallelPlan(
        tp=t,
        pp=p,
        dp=d,
        ep=ep,
        vpp=vpp,
        micro_batch_size=mbs,
        global_batch_size=m * mbs * d,
        zero_stage=draw(st.sampled_from(zero)),
        recompute=draw(st.sampled_from(recompute)),
        main_grads_fp32=draw(st.booleans()),
    )
    return name, plan


def ok(name: str, plan: ParallelPlan) -> bool:
    return plan.problems(MODELS[name], num_gpus=plan.num_gpus, seq_len=SEQ) == []


def est(name: str, plan: ParallelPlan):
    e = estimate(plan, MODELS[name], CLUSTER, num_gpus=plan.num_gpus, seq_len=SEQ)
    assert e.valid
    return e


def stage(e, rank: int, what: str) -> float:
    """One pipeline rank's figure from the estimate's per-stage breakdown."""
    st = e.extra["stages"][rank]
    return st["comm_bytes"][what.removeprefix("comm_bytes_")] if what.startswith("comm_bytes_") else st[what]


# ---- weights per GPU --------------------------------------------------------------------------------


@SETTINGS
@given(plans(tp=(1, 2, 4)))
def test_more_tp_never_increases_weights_per_gpu(drawn) -> None:
    # every matrix is sharded 1/t (seed TP §2.3 "Weights: 1/T_p of the original"); norms replicated
    name, plan = drawn
    wider = plan.with_(tp=2 * plan.tp, etp=2 * plan.tp, sequence_parallel=True)
    assume(ok(name, plan) and ok(name, wider))
    a, b = est(name, plan), est(name, wider)
    assert b.params_per_gpu <= a.params_per_gpu
    for cand in range(plan.pp):  # same layout (same pp, vpp): the same ranks
        assert stage(a, cand, "rank") == stage(b, cand, "rank")
        assert stage(b, cand, "params") <= stage(a, cand, "params")
    if plan.zero_stage < 3:  # weights = 2 B x params of the memory rank, on whichever rank that is
        assert b.memory_bytes["weights"] <= 2 * a.params_per_gpu


@SETTINGS
@given(plans(pp=(1, 2, 3, 4)), st.sampled_from((2, 3, 4, 5)))
def test_more_pp_never_increases_weights_per_gpu(drawn, factor) -> None:
    name, plan = drawn
    deeper = plan.with_(pp=plan.pp * factor, vpp=1, pp_schedule="1f1b")
    base = plan.with_(vpp=1, pp_schedule="1f1b")
    assume(ok(name, base) and ok(name, deeper))
    a, b = est(name, base), est(name, deeper)
    assert b.params_per_gpu <= a.params_per_gpu


def test_pp_increase_that_is_not_a_multiple_can_raise_weights_per_gpu() -> None:
    # Why the property above multiplies pp: auto layouts switch rule. llama3-8b (32 layers) tp1:
    # pp12 does not divide -> embedding and loss count as layers: 34/12 -> [1, 3 x 10, 1];
    # pp16 divides -> even [2 x 16]. By hand (layer 218,103,808 + 2*4096 = 218,112,000 params;
    # embedding = LM head = 128256*4096 = 525,336,576; final norm 4096), the most loaded GPU:
    #   pp12: last = 1 layer + head + norm = 743,452,672 (middle 3 layers = 654,336,000)
    #   pp16: last = 2 layers + head + norm = 961,564,672
    layer, emb, norm = 218_112_000, 525_336_576, 4096
    a = est("llama3-8b", ParallelPlan(pp=12, global_batch_size=12))
    b = est("llama3-8b", ParallelPlan(pp=16, global_batch_size=16))
    assert a.layout.startswith("[1, 10x3, 1]")
    assert a.params_per_gpu == layer + emb + norm == 743_452_672
    assert b.params_per_gpu == 2 * layer + emb + norm == 961_564_672


# ---- bubble ------------------------------------------------------------------------------------------


@SETTINGS
@given(st.sampled_from(sorted(SCHED)), st.integers(2, 32), st.integers(1, 256), st.integers(1, 8))
def test_bubble_falls_as_m_grows(schedule, p, m, v) -> None:
    v = v if schedule == "interleaved-1f1b" else 1
    f = lambda mm: float(bubble_fraction(np.array(SCHED[schedule]), np.array(p), np.array(mm), np.array(v)))  # noqa: E731
    assert 0 < f(m + 1) < f(m) < 1
    # closed form (p-1)/(m+p-1), divided by v (interleaved) or 3 (ZB-H1)
    div = {"interleaved-1f1b": v, "zero-bubble": 3}.get(schedule, 1)
    assert f(m) == pytest.approx((p - 1) / (m + p - 1) / div, rel=1e-12)


@SETTINGS
@given(plans(pp=(2, 4, 8)))
def test_estimate_bubble_falls_as_global_batch_grows(drawn) -> None:
    name, plan = drawn
    more = plan.with_(global_batch_size=2 * plan.global_batch_size)
    assume(ok(name, plan) and ok(name, more))
    a, b = est(name, plan), est(name, more)
    assert b.bubble_fraction < a.bubble_fraction
    assert b.num_microbatches == 2 * a.num_microbatches


# ---- ZeRO ------------------------------------------------------------------------------------------


@SETTINGS
@given(plans(zero=(0, 1)))
def test_zero_stage_0_to_2_never_increases_memory(drawn) -> None:
    # ZeRO-1 shards the 12 optimizer bytes, ZeRO-2 also the gradients (reference A.1 / ZeRO paper)
    name, plan = drawn
    nxt = plan.with_(zero_stage=plan.zero_stage + 1)
    assume(ok(name, plan) and ok(name, nxt))
    a, b = est(name, plan), est(name, nxt)
    assert b.peak_memory_bytes <= a.peak_memory_bytes
    for cand in range(plan.pp):
        assert stage(b, cand, "memory_bytes") <= stage(a, cand, "memory_bytes")


@SETTINGS
@given(plans(zero=(2,), tp=(1, 2, 4, 8), pp=(1, 2, 4)))
def test_zero3_never_increases_memory_when_it_shards(drawn) -> None:
    # ZeRO-3 shards the bf16 weights (saves 2 P (1 - 1/dp) bytes) but holds two gathered layers
    # (4 B x the largest layer) for FSDP. With dp*cp >= 2 (and expert-dp >= 2 for MoE) and >= 4
    # layers per rank the saving, >= P >= 4 layers' params, covers the buffers.
    name, plan = drawn
    z3 = plan.with_(zero_stage=3)
    assume(plan.dp * plan.cp >= 2 and plan.expert_dp >= 2)
    assume(ok(name, plan) and ok(name, z3))
    a, b = est(name, plan), est(name, z3)
    assert b.peak_memory_bytes <= a.peak_memory_bytes


# ---- recompute -------------------------------------------------------------------------------------


@SETTINGS
@given(plans(recompute=("selective",)))
def test_full_recompute_never_stores_more_than_selective(drawn) -> None:
    # full keeps 2h per token per layer (+ one layer's working set) vs selective's whole layer
    # (Korthikanti Table 2); every rank here has >= 4 layers
    name, plan = drawn
    full = plan.with_(recompute="full")
    assume(ok(name, plan) and ok(name, full))
    a, b = est(name, plan), est(name, full)
    assert b.peak_memory_bytes <= a.peak_memory_bytes
    for cand in range(plan.pp):
        assert stage(b, cand, "memory_bytes") <= stage(a, cand, "memory_bytes")
    # same states (weights/grads/optimizer) on the same rank: only activations (and the 5 % on them) moved
    if a.extra["memory_rank"] == b.extra["memory_rank"]:
        assert b.memory_bytes["activations"] <= a.memory_bytes["activations"]
        for k in ("weights", "gradients", "optimizer"):
            assert b.memory_bytes[k] == a.memory_bytes[k]


# ---- communication payloads -----------------------------------------------------------------------


@SETTINGS
@given(plans(zero=(0, 1, 2, 3)))
def test_dp_payload_scales_with_grad_bytes_per_param(drawn) -> None:
    # DP reduces the gradients: fp32 main grads (4 B) vs bf16 (2 B). ZeRO-0 all-reduce: payload =
    # grads only -> exactly x2. ZeRO-1 reduce-scatters grads once + all-gathers bf16 weights once:
    # the difference is (4 - 2) B x params. ZeRO-2/3 reduce-scatter every microbatch (x m) to keep
    # the gradients sharded, except under pipelining, which reduces once after the last one.
    name, plan = drawn
    f32, b16 = plan.with_(main_grads_fp32=True), plan.with_(main_grads_fp32=False)
    assume(ok(name, f32))
    # a group of one GPU reduces nothing (test_axis_of_size_one_carries_no_payload)
    assume(plan.dp * plan.cp > 1 and (MODELS[name].moe is None or plan.expert_dp > 1))
    a, b = est(name, f32), est(name, b16)
    m = plan.num_microbatches
    for cand in range(plan.pp):
        fa, fb = stage(a, cand, "comm_bytes_dp"), stage(b, cand, "comm_bytes_dp")
        params = stage(a, cand, "params")
        if plan.zero_stage == 0:
            assert fa == pytest.approx(2 * fb, rel=1e-12)
            assert fb == pytest.approx(2 * params, rel=1e-12)
        else:
            times = m if plan.zero_stage >= 2 and plan.pp == 1 else 1
            assert fa - fb == pytest.approx(2 * params * times, rel=1e-9)


@SETTINGS
@given(plans(pp=(2, 3, 4, 8)))
def test_pp_payload_proportional_to_microbatches(drawn) -> None:
    name, plan = drawn
    more = plan.with_(global_batch_size=3 * plan.global_batch_size)
    assume(ok(name, plan) and ok(name, more))
    a, b = est(name, plan), est(name, more)
    assert b.num_microbatches == 3 * a.num_microbatches
    assert a.comm_bytes_per_gpu["pp"] > 0
    assert b.comm_bytes_per_gpu["pp"] == pytest.approx(3 * a.comm_bytes_per_gpu["pp"], rel=1e-12)


@SETTINGS
@given(plans(pp=(1,), allow_vpp=False))
def test_pp_payload_is_zero_without_pipeline(drawn) -> None:
    name, plan = drawn
    assume(ok(name, plan))
    assert est(name, plan).comm_bytes_per_gpu["pp"] == 0


@SETTINGS
@given(plans(tp=(2, 4, 8)))
def test_tp_payload_linear_in_micro_batch_size(drawn) -> None:
    # every per-microbatch TP collective's buffer is (tokens of the microbatch) x (h or 1) x bytes:
    # linear in b at a fixed number of microbatches. The once-per-step all-reduce of the SP norm
    # gradients does not depend on b: it is the same in both, so the difference is 2x the linear part.
    name, plan = drawn
    one = plan.with_(micro_batch_size=1, global_batch_size=plan.num_microbatches * plan.dp)
    two = plan.with_(micro_batch_size=2, global_batch_size=2 * plan.num_microbatches * plan.dp)
    three = plan.with_(micro_batch_size=3, global_batch_size=3 * plan.num_microbatches * plan.dp)
    assume(ok(name, one) and ok(name, two) and ok(name, three))
    a, b, c = est(name, one), est(name, two), est(name, three)
    assert a.num_microbatches == c.num_microbatches
    assert a.comm_bytes_per_gpu["tp"] > 0
    per_b = b.comm_bytes_per_gpu["tp"] - a.comm_bytes_per_gpu["tp"]
    assert c.comm_bytes_per_gpu["tp"] - a.comm_bytes_per_gpu["tp"] == pytest.approx(2 * per_b, rel=1e-9)
    step_part = a.comm_bytes_per_gpu["tp"] - per_b
    assert step_part >= -1e-6 * a.comm_bytes_per_gpu["tp"]
    if not one.sequence_parallel:  # no SP: no per-step term at all
        assert step_part == pytest.approx(0.0, abs=1e-6 * a.comm_bytes_per_gpu["tp"])


# ---- an axis of size one -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,plan,axis",
    [
        ("llama3-8b", ParallelPlan(tp=1, pp=1, dp=1, global_batch_size=1), "cp"),
        ("llama3-8b", ParallelPlan(tp=1, pp=1, dp=1, global_batch_size=1), "pp"),
        pytest.param("llama3-8b", ParallelPlan(tp=1, pp=2, dp=4, global_batch_size=8), "tp"),
        pytest.param("llama3-8b", ParallelPlan(tp=8, pp=2, dp=1, global_batch_size=8), "dp"),
        pytest.param("mixtral-8x7b", ParallelPlan(tp=2, pp=2, dp=4, ep=1, global_batch_size=8), "ep"),
    ],
    ids=["cp1", "pp1", "tp1", "dp1", "ep1"],
)
def test_axis_of_size_one_carries_no_payload(name, plan, axis) -> None:
    assert ok(name, plan)
    e = est(name, plan)
    assert e.time_s.get(axis, 0.0) == 0.0  # the model already agrees nothing is sent in time
    assert e.comm_bytes_per_gpu[axis] == 0.0


def test_zero3_fsdp_buffers_only_when_it_shards() -> None:
    # dp*cp = 1: ZeRO-3 shards nothing and gathers nothing, so it costs what ZeRO-2 costs. With
    # dp = 2 it holds 2 gathered layers x 2 B (FSDP prefetch). llama3-8b at tp8, one layer's params
    # on a GPU by hand:
    #   attention 4096*(4096 + 1024 + 1024) + 4096*4096 = 41,943,040
    #   MLP 3*4096*14336 = 176,160,768; /8 -> 27,262,976; + 2 RMSNorms 8,192 = 27,271,168
    #   buffers 4 B x 27,271,168 = 109,084,672 B in "other"
    name = "llama3-8b"
    z2 = ParallelPlan(tp=8, pp=4, dp=1, global_batch_size=4, zero_stage=2)
    a, b = est(name, z2), est(name, z2.with_(zero_stage=3))
    assert b.peak_memory_bytes == a.peak_memory_bytes
    z2 = ParallelPlan(tp=8, pp=4, dp=2, global_batch_size=4, zero_stage=2)
    a, b = est(name, z2), est(name, z2.with_(zero_stage=3))
    assert b.memory_bytes["other"] - a.memory_bytes["other"] == pytest.approx(109_084_672, rel=1e-12)
