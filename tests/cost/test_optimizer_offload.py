"""Optimizer offload to host memory (--optimizer-offload f): the share f of each rank's optimizer
shard leaves the GPU, and the step pays its gradients' trip to the host, the CPU Adam and the
parameters' trip back. Every figure is derived here by hand:
- bytes per parameter from the trainers' code: Adam's fp32 master + m + v = 12 B (ZeRO paper,
  Rajbhandari et al. 2020, sec. 3.1); gradients to the host in fp32 (4 B: Megatron-Core
  hybrid_optimizer.py `_set_sub_optimizer_grads` into fp32 pinned buffers, DeepSpeed
  stage_1_and_2.py `async_inplace_copy_grad_to_fp32_buffer_from_gpu`), the updated weights back in
  bf16 (2 B); the CPU AdamW streams 16 B read + 12 B written + the 4 B read and 2 B written of the
  bf16 copy = 34 B; the host keeps master, m, v and the fp32 gradient (16 B; DeepSpeed its pinned
  bf16 partition too: 18 B);
- rates from the H100's datasheet and DGX H100's user guide: PCIe Gen5 x16, 64 GB/s per direction
  x 0.88 (PCIe 5.0 framing and 128b/130b coding); 2 sockets x 8 channels DDR5-4800 = 614.4 GB/s /
  8 GPUs = 76.8 GB/s per GPU x 0.6 (the CPU Adam's fraction of DRAM bandwidth, constants.toml);
- overlap: Megatron's overlap_cpu_optimizer_d2h_h2d pipelines the three (the slowest counts),
  DeepSpeed's ZeRO-Offload runs them in turn (their sum).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest

from autopar.calibration.estimate import estimate
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs
from autopar.figures import TIME_TERMS
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan, PlanError
from autopar.spec.presets import resolve_model

GIB = 2**30
LINK = 64e9 * 0.88  # B/s: PCIe Gen5 x16 per direction x host_link_efficiency
DRAM = 614.4e9 / 8 * 0.6  # B/s per GPU: DGX H100 host DRAM / 8 GPUs x cpu_adam_memory_efficiency


@pytest.fixture(scope="module")
def setting():
    return resolve_model("70b"), default_cluster("h100-sxm")


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=64, zero_stage=1, micro_batch_size=1, global_batch_size=64, recompute="full")
    return ParallelPlan(**(base | kw))


def _estimate(setting, plan, cluster=None):
    model, default = setting
    return estimate(plan, model, cluster or default, num_gpus=plan.num_gpus, seq_len=8192)


def test_the_offloaded_share_of_the_optimizer_leaves_the_gpu(setting) -> None:
    """70B on 64 H100, ZeRO-1: the distributed optimizer holds 12 B x P / 64 per GPU; offloading half
    of it leaves 6 B x P / 64; the bf16 weights (2 B x P) and fp32 main gradients (4 B x P) stay."""
    model, _ = setting
    p = model.params_total
    for f, left in ((0.0, 12.0), (0.5, 6.0), (1.0, 0.0)):
        est = _estimate(setting, _plan(optimizer_offload=f))
        assert est.memory_bytes["optimizer"] == pytest.approx(left * p / 64, rel=1e-9, abs=1.0)
        assert est.memory_bytes["weights"] == pytest.approx(2 * p, rel=1e-9)
        assert est.memory_bytes["gradients"] == pytest.approx(4 * p, rel=1e-9)


def test_host_memory_per_gpu_and_per_node(setting) -> None:
    """The whole shard offloaded: 16 B x P / 64 on the host per GPU (Megatron: fp32 master, m, v and
    the fp32 gradient), 8 GPUs a node; DeepSpeed keeps its bf16 partition there too (18 B)."""
    model, _ = setting
    p = model.params_total
    est = _estimate(setting, _plan(optimizer_offload=1.0))
    assert est.extra["host_memory_bytes_per_gpu"] == pytest.approx(16 * p / 64, rel=1e-9)
    assert est.extra["host_memory_bytes_per_node"] == pytest.approx(8 * 16 * p / 64, rel=1e-9)
    ds = _estimate(setting, _plan(optimizer_offload=1.0, trainer="deepspeed"))
    assert ds.extra["host_memory_bytes_per_gpu"] == pytest.approx(18 * p / 64, rel=1e-9)
    assert "host_memory_bytes_per_gpu" not in _estimate(setting, _plan()).extra


def test_megatron_pays_the_slowest_of_the_three_transfers(setting) -> None:
    """The whole shard, P / 64 = 1.10e9 parameters per GPU: 4.41 GB to the host at 56.3 GB/s
    (0.078 s), 2.20 GB back (0.039 s), 37.5 GB of CPU Adam traffic at 46.1 GB/s (0.813 s): pipelined,
    the CPU Adam's 0.813 s is the term; the GPU's own Adam step has nothing left to do."""
    model, _ = setting
    n = model.params_total / 64
    d2h, h2d, cpu = 4 * n / LINK, 2 * n / LINK, 34 * n / DRAM
    assert cpu == pytest.approx(0.8134, rel=1e-3) and d2h == pytest.approx(0.0783, rel=1e-3)
    on, off = _estimate(setting, _plan(optimizer_offload=1.0)), _estimate(setting, _plan())
    assert on.time_s["offload"] == pytest.approx(max(d2h, h2d, cpu), rel=1e-9)
    assert on.time_s["optimizer"] == 0.0 and off.time_s["offload"] == 0.0
    # one rank, one tail: the step trades the GPU's Adam for the offloaded step
    assert on.step_time_s == pytest.approx(off.step_time_s - off.time_s["optimizer"] + cpu, rel=1e-9)
    assert sum(on.time_s[t] for t in TIME_TERMS) == pytest.approx(on.step_time_s, rel=1e-9)


def test_a_share_splits_the_step_between_gpu_and_cpu(setting) -> None:
    """Offloading 0.3 of the shard: the GPU's Adam runs on the other 0.7, the CPU on 0.3 x P / 64."""
    model, _ = setting
    n = 0.3 * model.params_total / 64
    part, off = _estimate(setting, _plan(optimizer_offload=0.3)), _estimate(setting, _plan())
    assert part.time_s["optimizer"] == pytest.approx(0.7 * off.time_s["optimizer"], rel=1e-9)
    assert part.time_s["offload"] == pytest.approx(34 * n / DRAM, rel=1e-9)


def test_deepspeed_runs_the_transfers_and_the_cpu_adam_in_turn(setting) -> None:
    """ZeRO-Offload (DeepSpeed ZeRO-1): fp32 gradients down, CPU Adam, bf16 partition up, one after
    the other: 0.078 + 0.813 + 0.039 = 0.931 s; its GPU optimizer state is gone."""
    model, _ = setting
    n = model.params_total / 64
    est = _estimate(setting, _plan(optimizer_offload=1.0, trainer="deepspeed"))
    assert est.valid
    assert est.time_s["offload"] == pytest.approx(4 * n / LINK + 34 * n / DRAM + 2 * n / LINK, rel=1e-9)
    assert est.memory_bytes["optimizer"] == pytest.approx(0.0, abs=1.0)


def test_grace_hopper_class_links_move_the_bytes_faster() -> None:
    """GB200: NVLink-C2C 450 GB/s per direction, Grace LPDDR5X 512 GB/s per two GPUs: the CPU Adam of
    an 8B model's whole shard over 8 GPUs streams 34 B x P / 8 at 256 x 0.6 GB/s."""
    model, cluster = resolve_model("8b"), default_cluster("gb200")
    plan = ParallelPlan(dp=8, zero_stage=1, global_batch_size=8, optimizer_offload=1.0)
    est = estimate(plan, model, cluster, num_gpus=8, seq_len=8192)
    n = model.params_total / 8
    link, dram = 450e9 * 0.88, 256e9 * 0.6
    assert est.time_s["offload"] == pytest.approx(max(4 * n / link, 2 * n / link, 34 * n / dram), rel=1e-9)
    assert est.time_s["offload"] == pytest.approx(0.2222, rel=1e-3)  # 34 B x 1.004e9 / 153.6 GB/s


def test_a_gpu_without_host_figures_refuses_offload(setting) -> None:
    model, cluster = setting
    bare = replace(cluster, gpu=replace(cluster.gpu, host_link_gbps=None, host_memory_gbps=None))
    est = _estimate(setting, _plan(optimizer_offload=1.0), bare)
    assert not est.valid
    assert any("host_link_gbps and host_memory_gbps" in r and "cluster file" in r for r in est.reasons)
    assert _estimate(setting, _plan(), bare).valid  # no offload: nothing to price


@pytest.mark.parametrize(
    "kw, needle", [(dict(optimizer_offload=1.5), "from 0 to 1"), (dict(optimizer_offload=-0.1), "from 0 to 1")]
)
def test_a_share_that_cannot_be_is_refused(kw, needle) -> None:
    with pytest.raises(PlanError, match=needle):
        _plan(**kw)


def test_offload_without_a_sharded_optimizer_is_invalid(setting) -> None:
    """A rule, not a malformed plan: a searched space may pair ZeRO-0 with an offload share."""
    est = _estimate(setting, _plan(optimizer_offload=1.0, zero_stage=0))
    assert not est.valid and any("ZeRO 1, 2 or 3" in r for r in est.reasons)


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(trainer="torchtitan", zero_stage=3), "CPUOffloadPolicy"),  # FSDP2's mode: params too
        (dict(trainer="autopar"), "optimizer offload"),
        (dict(zero_stage=3), "optimizer offload to host memory with ZeRO-3"),  # Megatron: dist-opt only
        (dict(trainer="deepspeed", optimizer_offload=0.5), "Only valid with ZeRO Stage 3"),
    ],
)
def test_trainers_refuse_what_they_cannot_offload(setting, kw, needle) -> None:
    est = _estimate(setting, _plan(**({"optimizer_offload": 1.0} | kw)))
    assert not est.valid and any(needle in r for r in est.reasons), est.reasons


def test_deepspeed_offloads_a_share_with_zero3(setting) -> None:
    assert _estimate(setting, _plan(trainer="deepspeed", zero_stage=3, optimizer_offload=0.5)).valid


def test_the_published_run_that_offloads_states_it_in_its_plan() -> None:
    """Row 402 (DeepSeek-V3 on GB200, Megatron-Core MoE: 'optimizer-state CPU offload') is priced
    with the whole shard offloaded; a row that says nothing offloads nothing."""
    cases = {c.row_id: c for c in build_cases(load_runs(None))[0]}
    assert cases["402"].plan.optimizer_offload == 1.0
    assert cases["1"].plan.optimizer_offload == 0.0


def test_autopar_trainers_lists_the_capability_with_its_source() -> None:
    from autopar.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["trainers", "--trainer", "deepspeed"])
    text = out.getvalue()
    assert "optimizer_offload" in text and "offload_config.py" in text
    assert "partial_optimizer_offload" in text
