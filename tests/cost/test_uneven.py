"""Uneven pipeline stages: auto layouts for layer counts that do not divide, the step time of an
uneven layout (the slowest stage sets the pace), which stage the memory check picks, and layouts
that cannot run.
"""

from __future__ import annotations

import pytest

from autopar.calibration.estimate import estimate
from autopar.spec.hardware import GIB, default_cluster
from autopar.spec.layout import PipelineLayout, auto_layout
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.stages import stage_profiles
from autopar.spec.table import PlanTable

CLUSTER = default_cluster("h100-sxm")
K = CLUSTER.constants


# ---- auto layouts of real configs ---------------------------------------------------------------


def test_405b_1024_gpus_tp8_pp8_vpp8_cp2_is_valid_with_auto_layout() -> None:
    # Llama 3.1 405B (126 layers) at 1024 GPUs: tp8 pp8 vpp8 cp2 -> dp = 1024 / (8*8*2) = 8; gbs 512,
    # seq 8192 -> m = 512 / 8 = 64 (a multiple of pp, as interleaving needs).
    # Auto layout: 126 layers + embedding + loss counted as one layer each = 128 units over
    # 8 x 8 = 64 virtual stages = 2 each; the first gives one unit to the embedding, the last to
    # the loss: [1, 2 x 62, 1] (Megatron-Bridge's 405B recipe).
    model = get_preset("llama3.1-405b")
    assert model.num_layers == 126
    plan = ParallelPlan(tp=8, pp=8, vpp=8, cp=2, dp=8, global_batch_size=512, micro_batch_size=1)
    assert plan.num_gpus == 1024 and plan.num_microbatches == 64
    assert plan.problems(model, num_gpus=1024, seq_len=8192) == []
    expected = (1,) + (2,) * 62 + (1,)
    assert len(expected) == 64 and sum(expected) == 126
    assert auto_layout(126, 8, 8).stages == expected
    assert plan.resolved_layout(126).stages == expected
    est = estimate(plan, model, CLUSTER, num_gpus=1024, seq_len=8192)
    assert est.valid
    assert est.layout.startswith("[1, 62x2, 1]")
    # rank r holds virtual stages r, r+8, ..., r+56: rank 0 and rank 7 hold 1 + 7*2 = 15 layers,
    # the others 8*2 = 16; the busiest middle rank is the earliest with 16: rank 1
    assert PipelineLayout(expected).rank_layers(8) == [15, 16, 16, 16, 16, 16, 16, 15]
    assert [st["layers"] for st in est.extra["stages"]] == [15, 16, 16, 16, 16, 16, 16, 15]
    # bubble: (p-1)/(m+p-1)/v = 7/71/8
    assert est.bubble_fraction == pytest.approx(7 / 71 / 8, rel=1e-12)


def test_deepseek_v3_pp16_is_valid_with_auto_layout() -> None:
    # DeepSeek-V3: 61 layers, first 3 dense. pp16: 61 + 2 = 63 units / 16 = 3 rem 15; the
    # remainder goes to the 14 middle stages then the last: [3, 4 x 14, 4]; minus the embedding
    # unit on the first and the loss unit on the last: [2, 4 x 14, 3] (sum 2 + 56 + 3 = 61).
    model = get_preset("deepseek-v3")
    assert model.num_layers == 61
    plan = ParallelPlan(tp=2, pp=16, dp=8, ep=8, global_batch_size=256)
    assert plan.problems(model, num_gpus=256) == []
    expected = (2,) + (4,) * 14 + (3,)
    assert auto_layout(61, 16, 1).stages == expected
    # stage profiles by hand: rank 0 = layers 0-1 (dense, < first_k_dense = 3); rank 1 = layers
    # 2-5 (layer 2 dense, 3-5 MoE); ranks 2-14 = 4 MoE layers each; rank 15 = layers 58-60 (MoE).
    st = stage_profiles(PlanTable.from_plans([plan]), model, every_rank=True)
    assert list(st.dense_layers[:, 0]) == [2, 1] + [0] * 14
    assert list(st.moe_layers[:, 0]) == [0, 3] + [4] * 13 + [3]
    assert list(st.active[:, 0]) == [True] * 16
    est = estimate(plan, model, CLUSTER, num_gpus=256)
    assert est.valid
    assert est.layout.startswith("[2, 14x4, 3]")


# ---- step time of an uneven layout ----------------------------------------------------------------


def _step_by_hand(est, p: int, m: int, v: int) -> float:
    """step = m * max_stage(t_mb) / (1 - bubble) + exposed DP + optimizer + the once-per-step TP
    all-reduce of the SP norm gradients, bubble = (p-1)/(m+p-1)/v."""
    f = (p - 1) / (m + p - 1) / v
    pace = max(st["time_per_mb_s"] for st in est.extra["stages"])
    return m * pace / (1 - f) + est.time_s["dp"] + est.time_s["optimizer"] + est.extra["time_tp_per_step"]


@pytest.mark.parametrize("layout", [(21, 20, 20, 19), (20, 20, 20, 20), (19, 20, 20, 21), (10, 30, 25, 15)])
def test_step_time_is_the_slowest_stage_pace(layout) -> None:
    model = get_preset("llama3-70b")
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=256, layout=PipelineLayout(layout))
    assert plan.problems(model, num_gpus=256, seq_len=4096) == []
    est = estimate(plan, model, CLUSTER, num_gpus=256, seq_len=4096)
    m = 256 // 8
    assert est.step_time_s == pytest.approx(_step_by_hand(est, 4, m, 1), rel=1e-12)
    times = {st["rank"]: st["time_per_mb_s"] for st in est.extra["stages"]}
    assert est.extra["pace_rank"] == max(times, key=times.get)
    pace = max(times.values())
    f = 3 / (m + 3)
    assert est.time_s["bubble"] == pytest.approx(m * pace * f / (1 - f), rel=1e-9)


def test_step_time_interleaved_405b() -> None:
    model = get_preset("llama3.1-405b")
    plan = ParallelPlan(tp=8, pp=8, vpp=8, cp=2, dp=8, global_batch_size=512)
    est = estimate(plan, model, CLUSTER, num_gpus=1024, seq_len=8192)
    assert est.step_time_s == pytest.approx(_step_by_hand(est, 8, 64, 8), rel=1e-12)


def test_moving_a_layer_from_stage0_to_the_last_makes_the_last_stage_the_pace() -> None:
    # llama3-70b tp8 pp4: [21, 20, 20, 19] -> rank 0 (21 layers) is slower than the last rank
    # (19 layers + LM head: 2 h V_pad = 2*8192*129024 FLOPs/token ~ 1.2 layers of GEMMs);
    # move one layer from stage 0 to the last: [20, 20, 20, 20] -> the last rank (20 + head) paces.
    # The per-microbatch time is affine in a rank's layer count with the same slope on every rank
    # (embedding, head and P2P terms do not depend on it), so rank 0 loses exactly what the last
    # rank gains.
    model = get_preset("llama3-70b")
    ests = {}
    for lay in ((21, 20, 20, 19), (20, 20, 20, 20)):
        plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=256, layout=PipelineLayout(lay))
        ests[lay] = estimate(plan, model, CLUSTER, num_gpus=256, seq_len=4096)
    a, b = ests[(21, 20, 20, 19)], ests[(20, 20, 20, 20)]
    assert a.extra["pace_rank"] == 0
    assert b.extra["pace_rank"] == 3
    t_a = [st["time_per_mb_s"] for st in a.extra["stages"]]
    t_b = [st["time_per_mb_s"] for st in b.extra["stages"]]
    first_loss = t_a[0] - t_b[0]
    last_gain = t_b[-1] - t_a[-1]
    assert first_loss > 0
    assert last_gain == pytest.approx(first_loss, rel=1e-9)
    assert t_a[1:3] == t_b[1:3]
    # the faster layout is the one whose slowest stage is faster
    assert (b.step_time_s < a.step_time_s) == (t_b[-1] < t_a[0])


# ---- which stage the memory check picks ------------------------------------------------------------

# llama3-70b per layer, by hand (h = 8192, 64 heads / 8 KV heads x 128, ffn 28672):
#   params: attention 8192*(8192 + 1024 + 1024) + 8192*8192 = 150,994,944; SwiGLU 3*8192*28672 =
#   704,643,072; tp8 -> 855,638,016 / 8 = 106,954,752, + 2 RMSNorms 16,384 = 106,971,136 per GPU
#   activations per token (Korthikanti Table 2 generalised, 16-bit, no dropout, flash attention),
#   with SP everything / t: 2 norm inputs 4h + QKV input 2h + MLP input 2h = 8h = 65,536;
#   Q, K, V 2*(8192 + 1024 + 1024) = 20,480; attention output 2*8192 = 16,384;
#   SwiGLU gate, up, product 3*2*28672 = 172,032 -> 274,432 / 8 = 34,304 B per token
LAYER_PARAMS_TP8 = 106_971_136
ACT_PER_TOKEN_TP8_SP = 34_304


#: a middle rank's CUDA context (0.47 GiB) and NCCL: 1.45 GiB for its first communicator and 0.25 GiB
#: for each of three more (tensor, pipeline, data and model-parallel groups; the embedding group is
#: the first and last stages'): autopar.cost.memory_stacks MEGATRON_CORE
MIDDLE_RANK_RUNTIME = (0.47 + 1.45 + 3 * 0.25) * GIB


def _middle_rank_memory(layers: int, in_flight: int, tokens: int, dp: int) -> float:
    """States (bf16 weight 2 + fp32 grad 4 + 12/dp distributed optimizer) + activations x in-flight
    microbatches + the CUDA context and NCCL, for a rank with no embedding/head."""
    states = layers * LAYER_PARAMS_TP8 * (2 + 4 + 12 / dp)
    act = in_flight * layers * ACT_PER_TOKEN_TP8_SP * tokens
    return states + act + MIDDLE_RANK_RUNTIME


def test_memory_rank_follows_a_heavy_middle_stage() -> None:
    # [10, 40, 15, 15]: rank 1 holds 40 layers x min(p - 1, m) = 3 in flight = 120 layer-sets,
    # rank 0 only 10 x 4 = 40 (+ embedding), rank 2 15 x 2, rank 3 15 x 1 (+ head).
    model = get_preset("llama3-70b")
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=128, layout=PipelineLayout((10, 40, 15, 15)))
    assert plan.problems(model, num_gpus=256, seq_len=4096) == []
    est = estimate(plan, model, CLUSTER, num_gpus=256, seq_len=4096)
    assert est.extra["memory_rank"] == 1
    assert est.peak_memory_bytes == pytest.approx(_middle_rank_memory(40, 3, 4096, 8), rel=1e-12)
    assert est.memory_bytes["activations"] == pytest.approx(3 * 40 * ACT_PER_TOKEN_TP8_SP * 4096, rel=1e-12)


@pytest.mark.parametrize(
    "name,tp,pp,seq",
    [
        ("llama3-8b", 1, 2, 4096),
        ("llama3-8b", 8, 4, 8192),
        ("llama3-70b", 8, 4, 8192),
        ("llama3-70b", 4, 8, 4096),
        ("llama3.1-405b", 8, 2, 8192),
        ("mixtral-8x7b", 2, 4, 4096),
    ],
)
def test_even_1f1b_layout_rank0_is_most_loaded(name, tp, pp, seq) -> None:
    # with equal layers everywhere, rank 0 holds p microbatches in flight (the most) and the
    # embedding; the last rank's LM head and logits for 1 microbatch are smaller
    model = get_preset(name)
    assert model.num_layers % pp == 0
    plan = ParallelPlan(tp=tp, pp=pp, dp=2, global_batch_size=2 * 4 * pp)
    assert plan.problems(model, num_gpus=plan.num_gpus, seq_len=seq) == []
    est = estimate(plan, model, CLUSTER, num_gpus=plan.num_gpus, seq_len=seq)
    assert est.layout.endswith("(even)")
    assert est.extra["memory_rank"] == 0
    assert est.peak_memory_bytes == est.extra["stages"][0]["memory_bytes"]


def test_hand_derived_middle_rank_memory_matches_the_model() -> None:
    # Validates the hand figures above on two layouts where the rank in question IS the middle
    # candidate: [10, 25, 26, 19] (rank 2: 26 layers, 2 in flight) and [10, 25, 25, 20] (rank 1 -
    # the earliest of the two 25-layer ranks: 25 layers, 3 in flight).
    model = get_preset("llama3-70b")
    for lay, rank, layers, in_flight in (((10, 25, 26, 19), 2, 26, 2), ((10, 25, 25, 20), 1, 25, 3)):
        plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=128, layout=PipelineLayout(lay))
        est = estimate(plan, model, CLUSTER, num_gpus=256, seq_len=4096)
        assert est.extra["stages"][rank]["layers"] == layers
        assert est.extra["stages"][rank]["memory_bytes"] == pytest.approx(
            _middle_rank_memory(layers, in_flight, 4096, 8), rel=1e-12
        )


def test_memory_check_finds_the_most_loaded_middle_rank() -> None:
    # By hand (tokens 4096, dp 8): rank 1 = 25 layers x 3 in flight, rank 2 = 26 layers x 2,
    # rank 0 = 10 layers x 4 (+ embedding), rank 3 = 19 layers x 1 (+ head): rank 1 is the peak.
    #   rank 1: 25*106,971,136*7.5 + 75*34,304*4096 + 2.67 GiB = 33,462,167,470.08 B
    #   rank 2: 26*106,971,136*7.5 + 52*34,304*4096 + 2.67 GiB = 31,032,739,758.08 B
    r1 = _middle_rank_memory(25, 3, 4096, 8)
    r2 = _middle_rank_memory(26, 2, 4096, 8)
    assert r1 == pytest.approx(33_462_167_470.08, rel=1e-12)
    assert r2 == pytest.approx(31_032_739_758.08, rel=1e-12)
    model = get_preset("llama3-70b")
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=128, layout=PipelineLayout((10, 25, 26, 19)))
    est = estimate(plan, model, CLUSTER, num_gpus=256, seq_len=4096)
    assert est.peak_memory_bytes >= r1 * (1 - 1e-12)
    assert est.extra["memory_rank"] == 1


# ---- layouts that cannot run ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "stages,word",
    [
        ((8, 8, 8, 7), "drops"),
        ((8, 8, 8, 9), "repeats"),
        ((16, 0, 8, 8), "hold no layer"),
        ((8, 8, 16), "stages but pp*vpp"),
    ],
)
def test_bad_layouts_are_rejected_with_a_clear_message(stages, word) -> None:
    model = get_preset("llama3-8b")  # 32 layers
    plan = ParallelPlan(tp=8, pp=4, dp=1, global_batch_size=4, layout=PipelineLayout(stages))
    problems = plan.problems(model, num_gpus=32)
    assert problems, stages
    assert any(word in p for p in problems), problems
    if word in ("drops", "repeats"):
        msg = next(p for p in problems if word in p)
        assert f"hold {sum(stages)} layers" in msg and "has 32" in msg
    # the estimate does not raise: it marks the plan invalid and says why
    est = estimate(plan, model, CLUSTER, num_gpus=32)
    assert not est.valid and not est.fits
    assert any(word in r for r in est.reasons)


def test_empty_first_and_last_stages_are_allowed() -> None:
    # the first stage may hold only the embedding, the last only the head and loss
    model = get_preset("llama3-8b")
    plan = ParallelPlan(tp=8, pp=4, dp=1, global_batch_size=4, layout=PipelineLayout((0, 16, 16, 0)))
    assert plan.problems(model, num_gpus=32) == []
    est = estimate(plan, model, CLUSTER, num_gpus=32)
    assert est.valid
    assert est.extra["stages"][0]["params"] < est.extra["stages"][1]["params"]
