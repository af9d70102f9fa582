"""The 80 % intervals and the support of a prediction (autopar.calibration.uncertainty), derived by hand on
small sets of calibration points: the regime's quantiles, the back-off to a coarser regime, the
support gaps and their words, the widening, and the leave-one-source-out coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar.calibration import support as S
from autopar.calibration import uncertainty as U
from autopar.calibration.estimate import estimate_table
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.table import PlanTable


def point(i: int, residual: float, **kw) -> S.CalibrationPoint:
    base = dict(
        row_id=str(i),
        source=f"s{i % 4}",
        profile="megatron",
        workload="dense",
        long_context=False,
        dtype="bf16",
        generation="hopper",
        gpu="h100-sxm",
        tp=8,
        pp=4,
        cp=1,
        ep=1,
        dp=16,
        zero_stage=1,
        num_gpus=512,
        ep_cross_node=False,
        residual=residual,
        params=70e9,
        categories=("dense Megatron-family",),
    )
    return S.CalibrationPoint(**(base | kw))


def type7(values, q):
    """Hyndman & Fan type 7 by hand: h = (n - 1) q, linear between the order statistics."""
    v = sorted(values)
    h = (len(v) - 1) * q
    lo = math.floor(h)
    return v[lo] + (h - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])


def test_band_is_plus_minus_the_80_percent_quantile_of_the_residuals_sizes():
    residuals = [-0.20, -0.12, -0.05, -0.02, 0.0, 0.01, 0.03, 0.06, 0.09, 0.15, 0.30]
    support = U.Support(tuple(point(i, r) for i, r in enumerate(residuals)), widening=0.0)
    band = U.regime_band(support, "megatron", "dense", False, "bf16", "hopper")
    assert band.runs == 11 and band.name == "megatron dense short context bf16 hopper"
    # sizes sorted: 0, .01, .02, .03, .05, .06, .09, .12, .15, .20, .30; type 7 at 0.8: h = 8, the 9th: 0.15
    assert type7([abs(r) for r in residuals], 0.8) == pytest.approx(0.15)
    assert (band.low, band.high) == pytest.approx((-0.15, 0.15))


def test_a_regime_of_fewer_than_ten_runs_backs_off_to_a_coarser_one():
    hopper = [point(i, 0.05) for i in range(6)]
    ampere = [point(10 + i, -0.10 + 0.02 * i, generation="ampere", gpu="a100-80gb") for i in range(6)]
    support = U.Support(tuple(hopper + ampere), 0.0)
    band = U.regime_band(support, "megatron", "dense", False, "bf16", "hopper")
    sizes = [abs(p.residual) for p in hopper + ampere]
    assert band.runs == 12 and band.name == "megatron dense short context"
    assert (band.low, band.high) == pytest.approx((-type7(sizes, 0.8), type7(sizes, 0.8)))


def test_the_band_reaches_both_ways_though_every_run_erred_one_way():
    # every run faster than predicted: a new source may err the other way (the MoE runs after
    # 2025-07 did), so the band reaches as far down as up: 0.1 + 0.01 x h, h = 11 x 0.8 = 8.8
    support = U.Support(tuple(point(i, 0.1 + 0.01 * i) for i in range(12)), 0.0)
    band = U.regime_band(support, "megatron", "dense", False, "bf16", "hopper")
    assert (band.low, band.high) == pytest.approx((-0.188, 0.188))


def test_support_gaps_and_their_words():
    model, cluster = get_preset("70b"), default_cluster("h100-sxm")
    points = [point(i, 0.0, zero_stage=3 if i < 3 else 1, dp=64 if i < 3 else 16) for i in range(12)]
    support = U.Support(tuple(points), widening=0.05)
    plans = [
        ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=512, trainer="megatron"),  # inside every reach
        ParallelPlan(tp=1, pp=1, dp=256, zero_stage=3, global_batch_size=512, trainer="megatron"),
        ParallelPlan(tp=8, pp=8, cp=2, dp=4, global_batch_size=512, trainer="megatron"),
    ]
    table = PlanTable.from_plans(plans)
    reach = S.Reach.of("megatron", points)
    gaps = S.support_gaps(table.columns, model, cluster, 8192, reach, table.columns["dtype"], slice(None))
    assert gaps[0] == 0
    assert gaps[1] == S.GAP_BIT["sharded_dp"]
    assert gaps[2] == S.GAP_BIT["pp"] | S.GAP_BIT["cp"]
    kind, why = U.support_text(int(gaps[1]), plans[1], model, cluster, 8192, support)
    assert kind == "extrapolated" and "no megatron run with ZeRO-3 beyond dp 64" in why and "nearest run" in why
    kind, why = U.support_text(0, plans[0], model, cluster, 8192, support)
    # calibrated, and checkable: the nearest published run (the points hold tp8.pp4 on 512 GPUs; the
    # nine of dp 16 are nearest to dp 8, the first of them by row id as a string "10") and what this
    # plan does differently
    assert kind == "calibrated" and "nearest run: 10 " in why
    assert "this plan: dp 8 (the run: 16), 256 GPUs (the run: 512)" in why
    # a trainer whose profile has no published run at all
    t = PlanTable.from_plans([plans[0].with_(trainer="deepspeed")])
    none = S.support_gaps(
        t.columns, model, cluster, 8192, S.Reach.of("deepspeed", points), t.columns["dtype"], slice(None)
    )
    assert none[0] == S.GAP_BIT["profile"]


def test_interval_columns_widen_per_gap():
    """step time interval = step x exp(-(high + w g)) .. step x exp(-(low - w g)), g the gaps (<= 3)."""
    model, cluster = get_preset("70b"), default_cluster("h100-sxm")
    residuals = [-0.10, -0.08, -0.04, -0.02, 0.0, 0.02, 0.03, 0.05, 0.07, 0.12]
    points = [point(i, r) for i, r in enumerate(residuals)]
    memory = tuple(np.linspace(-0.05, 0.10, 12))
    support = U.Support(tuple(points), widening=0.05, memory_residuals=memory)
    plans = [
        ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=512, trainer="megatron"),
        ParallelPlan(tp=8, pp=8, cp=2, dp=4, global_batch_size=512, trainer="megatron"),
    ]
    table = PlanTable.from_plans(plans)
    est = estimate_table(table, model, cluster, num_gpus=256)
    cols = U.interval_columns(table, est, model, cluster, 8192, support=support)
    hi = type7([abs(r) for r in residuals], 0.8)  # sizes' 80 %: h = 7.2 -> 0.08 + 0.2 x 0.02 = 0.084
    assert hi == pytest.approx(0.084)
    lo = -hi
    m_lo, m_hi = type7(memory, 0.1), type7(memory, 0.9)  # peak memory keeps its 10/90 % quantiles
    for i, g in enumerate((0, 2)):
        step = est["step_time_s"][i]
        assert cols["step_time_s_low"][i] == pytest.approx(step * math.exp(-(hi + 0.05 * g)))
        assert cols["step_time_s_high"][i] == pytest.approx(step * math.exp(-(lo - 0.05 * g)))
        tok = est["tokens_per_s_per_gpu"][i]
        assert cols["tokens_per_s_per_gpu_low"][i] == pytest.approx(tok * math.exp(lo - 0.05 * g))
        peak = est["peak_memory_bytes"][i]
        assert cols["peak_memory_bytes_high"][i] == pytest.approx(peak * math.exp(m_hi + 0.05 * g))
        assert cols["peak_memory_bytes_low"][i] == pytest.approx(peak * math.exp(m_lo - 0.05 * g))


def test_coverage_leaves_each_source_out():
    """Four sources (row i of source s(i mod 4)); each point's band comes from the other three
    sources' points. Ten points of residual 0, and the two outliers 0.5 (s2) and -0.5 (s3): the
    outliers fall outside, the rest inside. Left out, s0 and s1 see seven zeros and both outliers:
    their sizes' 80 % quantile (type 7, h = 6.4) is 0.4 x 0.5 = 0.2, a band of +-0.2 whose
    throughput interval spans exp(0.2) - exp(-0.2) of the estimate; s2 and s3 see eight zeros and
    one outlier: 0, no span. Six spans of each: the median is their mean."""
    points = [point(i, 0.0) for i in range(10)] + [point(10, 0.5), point(11, -0.5)]
    got = U.coverage(points, widening=0.0)["dense Megatron-family"]
    span = math.exp(0.2) - math.exp(-0.2)
    by_source = (1 + 1 + 2 / 3 + 2 / 3) / 4  # s0, s1: all three inside; s2, s3: two of three
    assert got == {
        "rows": 12,
        "covered": pytest.approx(10 / 12),
        "covered_by_source": pytest.approx(by_source),
        "sources": 4,
        "median_width": pytest.approx(span / 2),
    }


def test_widening_is_the_80th_percentile_of_what_extrapolated_runs_needed():
    """Ten calibrated runs at residual 0 from sources s0-s3, and five runs of one new source beyond
    every other run's tp (one gap each) with residuals 0.1 .. 0.5: each needed its own residual, so
    the widening is their 80th percentile (type 7)."""
    base = [point(i, 0.0) for i in range(12)]
    far = [point(100 + i, 0.1 * (i + 1), source="new", tp=16) for i in range(5)]
    assert U.fit_widening(base + far) == pytest.approx(type7([0.1, 0.2, 0.3, 0.4, 0.5], 0.8))


def test_runs_the_model_never_saw_are_judged_by_the_shipped_intervals():
    """Twelve shipped points spread over [-0.1, 0.1]: band = +- their sizes' 80 % quantile. Three new
    runs: one inside, one beyond the band, one beyond the band but with one support gap (tp 16 > 8)
    and the widening 0.05 that brings it inside."""
    shipped = [point(i, -0.1 + 0.2 * i / 11) for i in range(12)]
    support = U.Support(tuple(shipped), widening=0.05)
    hi = type7([abs(p.residual) for p in shipped], 0.8)
    new = [
        point(100, 0.0, source="new"),
        point(101, hi + 0.02, source="new"),
        point(102, hi + 0.02, source="new", tp=16),
    ]
    assert [U.inside(p, support) for p in new] == [True, False, True]
    got = U.coverage_against(new, support)
    # two of the three runs' intervals are the bare band +-hi, the third's one gap wider: the median is the band's
    span = math.exp(hi) - math.exp(-hi)
    assert got["dense Megatron-family"] == {
        "rows": 3,
        "covered": pytest.approx(2 / 3),
        "covered_by_source": pytest.approx(2 / 3),  # one source, "new"
        "sources": 1,
        "median_width": pytest.approx(span),
    }
    assert got["all rows"]["rows"] == 3


def test_support_text_without_any_published_run():
    """No stored calibration point at all: extrapolated, no nearest run, and no crash."""
    model, cluster = get_preset("70b"), default_cluster("h100-sxm")
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=512, trainer="megatron")
    kind, why = U.support_text(S.GAP_BIT["profile"], plan, model, cluster, 8192, U.Support((), 0.0))
    assert kind == "extrapolated" and "no published run on megatron's profile" in why and "nearest" not in why


def test_a_new_sources_widening_weights_every_source_once():
    """Sources s0-s2 publish four runs each at residual 0; source "new" two runs at 0.5. Left out,
    each of s0-s2 finds its runs inside the band of the other ten (type 7: the sizes' 80 % quantile
    of eight zeros and two 0.5s is 0.5 x (7.2 - 7) = 0.1, and its runs are at 0), and
    "new" finds its runs 0.5 above the band of the twelve zeros. With every source weighted once, 3
    of 4 sources need nothing and the fourth 0.5: the 80th percentile is 0.5 (weighted by rows it
    would be 0: 12 of 14 runs need nothing)."""
    zeros = [point(i, 0.0, source=f"s{i % 3}") for i in range(12)]
    new = [point(100 + i, 0.5, source="new") for i in range(2)]
    fitted = U.fit_new_source(zeros + new, widening=0.0)
    assert fitted == (("dense", pytest.approx(0.5)),)
    assert U.coverage(zeros + new, 0.0)["dense Megatron-family"]["covered"] == pytest.approx(12 / 14)
    assert U.coverage(zeros + new, 0.0, new_source=fitted)["dense Megatron-family"]["covered"] == 1.0
    # a class without its own figure takes the largest one
    support = U.Support((), 0.0, new_source=(("dense", 0.1), ("moe", 0.3)))
    assert support.new_source_widening("dense", False) == 0.1
    assert support.new_source_widening("dense", True) == 0.3


def test_nested_coverage_fits_nothing_on_the_fold_it_judges():
    """The sources of the test above, judged nested. "new" is judged by what s0-s2 alone give: every
    residual 0, so a band, gap widening and new-source widening of 0, and both its runs (0.5) fall
    outside. s0 is judged by what s1, s2 and "new" give: left out in turn, s1 and s2 find their
    zeros inside the band of the other eight points (type 7 over four zeros and two 0.5s: h = 4,
    0.5) and "new" finds its runs 0.5 above the band of eight zeros, so the new-source widening is
    again the 80th percentile of three folds' misses, 0.5; s0's own zeros are inside. Likewise s1
    and s2: 12 of 14, where the widening fitted with "new" in it covered all 14."""
    zeros = [point(i, 0.0, source=f"s{i % 3}") for i in range(12)]
    new = [point(100 + i, 0.5, source="new") for i in range(2)]
    assert U.nested_coverage(zeros + new)["dense Megatron-family"]["covered"] == pytest.approx(12 / 14)


def test_the_new_source_widening_reaches_every_interval():
    """Each side of the throughput band moves out by the class's new-source widening (0.1 here, the
    70B plan a dense short-context one); the memory band by its stack class's (Megatron: fused, 0.2)."""
    model, cluster = get_preset("70b"), default_cluster("h100-sxm")
    points = tuple(point(i, r) for i, r in enumerate(np.linspace(-0.1, 0.1, 10)))
    memory = tuple(np.linspace(-0.05, 0.10, 12))
    table = PlanTable.from_plans([ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=512, trainer="megatron")])
    est = estimate_table(table, model, cluster, num_gpus=256)
    plain = U.interval_columns(table, est, model, cluster, 8192, support=U.Support(points, 0.0, memory))
    wide = U.interval_columns(
        table,
        est,
        model,
        cluster,
        8192,
        support=U.Support(points, 0.0, memory, new_source=(("dense", 0.1),), memory_new_source=(("fused", 0.2),)),
    )
    assert wide["tokens_per_s_low"][0] == pytest.approx(plain["tokens_per_s_low"][0] * math.exp(-0.1))
    assert wide["step_time_s_high"][0] == pytest.approx(plain["step_time_s_high"][0] * math.exp(0.1))
    assert wide["peak_memory_bytes_high"][0] == pytest.approx(plain["peak_memory_bytes_high"][0] * math.exp(0.2))


def test_memory_new_source_widening_covers_a_left_out_source():
    """Peak-memory residuals: sources a-c six figures each at 0, source d six at -0.2. Left out, a-c
    sit inside the others' band (its 10 % quantile of 12 zeros and 6 x -0.2 is -0.2) and d 0.2 below
    the band of 18 zeros. One class of stack: one source of four needs 0.2, so the weighted 80th
    percentile is 0.2. With d a PyTorch stack of its own: the fused stacks need nothing and the
    PyTorch ones 0.2."""
    figures = [(s, 0.0) for s in "abc" for _ in range(6)] + [("d", -0.2)] * 6
    one = U.fit_memory_new_source(figures, class_of=lambda s: "fused")
    assert one == (("fused", pytest.approx(0.2)),)
    assert U.memory_coverage(figures, class_of=lambda s: "fused")["covered"] == pytest.approx(18 / 24)
    assert U.memory_coverage(figures, one, class_of=lambda s: "fused")["covered"] == 1.0
    # nested: d judged by the widening a-c alone give (0: their figures are all 0) falls outside;
    # a judged by b, c and d's (0.2, as above) and the band of their figures is inside
    assert U.nested_memory_coverage(figures, class_of=lambda s: "fused")["covered"] == pytest.approx(18 / 24)
    two = U.fit_memory_new_source(figures, class_of=lambda s: "torch" if s == "d" else "fused")
    assert two == (("fused", 0.0), ("torch", pytest.approx(0.2)))
    support = U.Support((), 0.0, memory_new_source=two)
    assert support.memory_new_source_widening("fused") == 0.0
    assert support.memory_new_source_widening("torch") == pytest.approx(0.2)
    # the classes of the bundled sources: torchtitan's stacks are PyTorch ones, BLOOM's and nanotron's fused
    assert [U.source_memory_class(s) for s in ("torchtitan-2024-12", "bloom", "nanotron")] == [
        "torch",
        "fused",
        "fused",
    ]


def test_the_memory_band_is_the_stacks_own_when_it_has_enough_runs():
    """Twelve fused-stack peaks spread over [-0.05, 0.05] and twelve PyTorch-stack ones over
    [0.1, 0.3]: a Megatron plan's memory band is the fused peaks' 10/90 % quantiles alone; with only
    five fused peaks it falls back to all of them."""
    model, cluster = get_preset("70b"), default_cluster("h100-sxm")
    fused, torch_ = list(np.linspace(-0.05, 0.05, 12)), list(np.linspace(0.1, 0.3, 12))
    table = PlanTable.from_plans([ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=512, trainer="megatron")])
    est = estimate_table(table, model, cluster, num_gpus=256)
    peak = est["peak_memory_bytes"][0]
    support = U.Support((), 0.0, tuple(fused + torch_), memory_classes=("fused",) * 12 + ("torch",) * 12)
    cols = U.interval_columns(table, est, model, cluster, 8192, support=support)
    assert cols["peak_memory_bytes_high"][0] == pytest.approx(peak * math.exp(type7(fused, 0.9)))
    assert cols["peak_memory_bytes_low"][0] == pytest.approx(peak * math.exp(type7(fused, 0.1)))
    few = U.Support((), 0.0, tuple(fused[:5] + torch_), memory_classes=("fused",) * 5 + ("torch",) * 12)
    cols = U.interval_columns(table, est, model, cluster, 8192, support=few)
    assert cols["peak_memory_bytes_high"][0] == pytest.approx(peak * math.exp(type7(fused[:5] + torch_, 0.9)))
