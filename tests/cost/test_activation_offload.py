"""Fine-grained activation offloading (--offload-modules, Megatron-Core's
fine_grained_activation_offloading): the saved input of each offloaded module leaves the GPU in the
forward and comes back for the backward, and the step pays what of those copies the compute does
not hide. Every figure is derived here by hand:
- the saved tensors per token of a Megatron-Core layer with sequence parallelism (Korthikanti et al.
  2022, arXiv:2205.05198, Table 2, with GQA's smaller K and V and flash attention): each norm's
  input 2h/t bytes, the QKV projection's input 2h/t, Q, K and V 2(q + k + v)/t, the attention output
  (the output projection's input) 2 q/t; an expert's input 2h per routed copy (expert-TP 1) and its
  fc1 output 2 x 2F_e (gated);
- the host link: PCIe Gen5 x16, 64 GB/s per direction x 0.88 (PCIe 5.0 framing and 128b/130b coding,
  constants.toml host_link_efficiency); GB200's NVLink-C2C 450 GB/s x 0.88;
- overlap: the forward's copies run under the forward (a third of a microbatch's compute without
  recompute: forward 1, backward 2), the reloads under the backward; what exceeds each is exposed
  (megatron/core/pipeline_parallel/fine_grained_activation_offload.py: its own D2H and H2D streams).
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

LINK = 64e9 * 0.88  # B/s: PCIe Gen5 x16 per direction x host_link_efficiency
DENSE = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")


def _dense(**kw):
    """Llama 3 8B on 16 H100, tp 2 with SP, one 8,192-token microbatch per rank and step."""
    plan = ParallelPlan(**(dict(tp=2, dp=8, zero_stage=1, global_batch_size=8) | kw))
    return estimate(plan, resolve_model("8b"), default_cluster("h100-sxm"), num_gpus=16, seq_len=8192)


def _moe(gpu="h100-sxm", **kw):
    """Qwen3-30B-A3B on 8 GPUs, ep 8, expert-TP 1, one 4,096-token microbatch per rank and step."""
    plan = ParallelPlan(**(dict(dp=8, ep=8, etp=1, zero_stage=1, global_batch_size=8) | kw))
    return estimate(plan, resolve_model("qwen3-30b-a3b"), default_cluster(gpu), num_gpus=8, seq_len=4096)


def test_each_dense_module_moves_its_saved_input() -> None:
    """8B, h 4096, q 4096, k = v 1024 (8 KV heads of 128), tp 2 with SP, per token: each norm input
    2 x 4096 / 2 = 4096 B, the QKV input 4096 B, Q K V 2 x 6144 / 2 = 6144 B, the attention output
    2 x 4096 / 2 = 4096 B; x 8192 tokens x 32 layers."""
    per_token = {"attn_norm": 4096, "qkv_linear": 4096, "core_attn": 6144, "mlp_norm": 4096}
    base = _dense().memory_bytes["activations"]
    for module, bytes_per_token in per_token.items():
        saved = base - _dense(offload_modules=module).memory_bytes["activations"]
        assert saved == pytest.approx(bytes_per_token * 8192 * 32, rel=1e-9), module
    both = base - _dense(offload_modules="core_attn,attn_proj").memory_bytes["activations"]
    assert both == pytest.approx((6144 + 4096) * 8192 * 32, rel=1e-9)


def test_expert_inputs_and_activation_inputs_leave_the_gpu() -> None:
    """Qwen3-30B-A3B, h 2048, top-8, expert FFN 768 (gated): per routed copy the expert input
    2 x 2048 = 4096 B and the fc1 output 2 x 2 x 768 = 3072 B; 8 copies x 4096 tokens x 48 layers =
    11.27 GB, which the host holds for the one microbatch in flight."""
    moved = 48 * 4096 * 8 * (4096 + 3072)
    assert moved == pytest.approx(1.1274e10, rel=1e-3)
    off, on = _moe(), _moe(offload_modules="expert_fc1,moe_act")
    assert off.memory_bytes["activations"] - on.memory_bytes["activations"] == pytest.approx(moved, rel=1e-9)
    assert on.extra["host_memory_bytes_per_gpu"] == pytest.approx(moved, rel=1e-9)
    assert on.extra["host_memory_bytes_per_node"] == pytest.approx(8 * moved, rel=1e-9)
    assert "host_memory_bytes_per_gpu" not in off.extra


def test_the_copies_the_compute_cannot_hide_are_exposed() -> None:
    """11.27 GB each way at 56.3 GB/s = 0.200 s per direction; the forward (a third of the compute)
    hides part of the copies out, the backward (two thirds) part of the reloads; the rest is the term."""
    on, off = _moe(offload_modules="expert_fc1,moe_act"), _moe()
    copies = 48 * 4096 * 8 * (4096 + 3072) / LINK
    assert copies == pytest.approx(0.2002, rel=1e-3)
    compute = on.time_s["compute"]  # one microbatch
    exposed = max(0.0, copies - compute / 3) + max(0.0, copies - 2 * compute / 3)
    assert exposed > 0
    assert on.time_s["act_offload"] == pytest.approx(exposed, rel=1e-9)
    assert off.time_s["act_offload"] == 0.0
    assert on.step_time_s == pytest.approx(off.step_time_s + exposed, rel=1e-9)
    assert sum(on.time_s[t] for t in TIME_TERMS) == pytest.approx(on.step_time_s, rel=1e-9)


def test_a_c2c_link_hides_the_copies() -> None:
    """GB200's NVLink-C2C: 11.27 GB / (450 GB/s x 0.88) = 0.028 s each way, under the forward's and
    the backward's compute of the microbatch: nothing exposed, the memory saved all the same."""
    on, off = _moe("gb200", offload_modules="expert_fc1,moe_act"), _moe("gb200")
    copies = 48 * 4096 * 8 * (4096 + 3072) / (450e9 * 0.88)
    assert copies < on.time_s["compute"] / 3
    assert on.time_s["act_offload"] == 0.0
    assert on.step_time_s == pytest.approx(off.step_time_s, rel=1e-12)
    assert on.peak_memory_bytes < off.peak_memory_bytes


def test_a_fully_recomputed_layer_has_nothing_to_offload() -> None:
    on, off = _dense(recompute="full", offload_modules="core_attn"), _dense(recompute="full")
    assert on.memory_bytes["activations"] == pytest.approx(off.memory_bytes["activations"], rel=1e-12)
    assert on.time_s["act_offload"] == 0.0


@pytest.mark.parametrize(
    "value, needle", [("attn_proj", "needs core_attn too"), ("core_attn,qkv", "unknown module 'qkv'")]
)
def test_module_lists_megatron_refuses(value, needle) -> None:
    with pytest.raises(PlanError, match=needle):
        ParallelPlan(offload_modules=value)


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(offload_modules="moe_act"), "needs a mixture-of-experts model"),
        (dict(offload_modules="core_attn", trainer="torchtitan", zero_stage=3), "offloads no activations"),
        (dict(offload_modules="core_attn", trainer="deepspeed"), "cpu_checkpointing"),
    ],
)
def test_plans_that_cannot_offload_are_invalid(kw, needle) -> None:
    est = _dense(**kw)
    assert not est.valid and any(needle in r for r in est.reasons), est.reasons


def test_a_gpu_without_a_host_link_figure_refuses_it() -> None:
    cluster = default_cluster("h100-sxm")
    bare = replace(cluster, gpu=replace(cluster.gpu, host_link_gbps=None))
    plan = ParallelPlan(tp=2, dp=8, zero_stage=1, global_batch_size=8, offload_modules="core_attn")
    est = estimate(plan, resolve_model("8b"), bare, num_gpus=16, seq_len=8192)
    assert not est.valid and any("host_link_gbps" in r for r in est.reasons)


def test_the_published_run_that_offloads_states_it_in_its_plan() -> None:
    """Row 287 (ModelZoo's Qwen3-235B command line on GB200) offloads expert_fc1 and moe_act."""
    cases = {c.row_id: c for c in build_cases(load_runs(None))[0]}
    assert cases["287"].plan.offload_modules == ("expert_fc1", "moe_act")
    assert cases["1"].plan.offload_modules is None


def test_autopar_trainers_lists_the_capability_with_its_source() -> None:
    from autopar.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["trainers", "--trainer", "megatron"])
    text = out.getvalue()
    assert "activation_offload" in text and "fine_grained_activation_offload" in text
