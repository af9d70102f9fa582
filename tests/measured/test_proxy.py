"""Fitting trials to the machine (autopar.measured.resources, autopar.measured.proxy), without launching:
the limits of a CPU or GPU machine, which plans run as they are, which as proxies (and what a
proxy keeps), which are not runnable here and why, and how a proxy's measurement is scaled back
(autopar.measured.measure.measure_placement with a stand-in launch). No torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autopar.calibration.estimate import estimate
from autopar.errors import InputError
from autopar.measured.config import TrialConfig
from autopar.measured.features import model_problems, plan_problems
from autopar.measured.launcher import LaunchResult
from autopar.measured.measure import measure_placement
from autopar.measured.proxy import Planner, ProxyOptions
from autopar.measured.proxy_model import standin_model
from autopar.measured.resources import CPU_RANK_RUNTIME_BYTES, GIB, Machine, local_limits
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.resolve import resolve_cluster

REPO = Path(__file__).resolve().parents[2]
CPU2 = Machine(cpu_cores=2, ram_total_bytes=24 * GIB, ram_available_bytes=22 * GIB)
GPU8 = Machine(
    cpu_cores=64,
    ram_total_bytes=1024 * GIB,
    ram_available_bytes=900 * GIB,
    gpus=8,
    gpu_memory_bytes=80 * GIB,
    gpu_name="NVIDIA H100 80GB HBM3",
)
H100 = resolve_cluster("h100-sxm")


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOPAR_LOCAL_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # the unprobed defaults: no ~/.autopar/local.yaml
    return resolve_cluster("local")


def planner(
    model: str,
    gpus: int,
    local,
    max_ranks: int | None = None,
    machine: Machine = CPU2,
    options: ProxyOptions | None = None,
    cluster=H100,
) -> Planner:
    spec = get_preset(model)
    device = "cuda" if machine.gpus else "cpu"
    return Planner(
        Question(spec, gpus, cluster, spec.seq_len),
        local_limits(machine, device, max_ranks),
        options or ProxyOptions(step_budget_s=1.0),
        local if device == "cpu" else cluster,
        fix_hint="use --launcher slurm",
    )


def p70(**kw) -> dict:
    base = dict(tp=2, cp=2, pp=8, dp=8, global_batch_size=512, pp_schedule="1f1b", zero_stage=3)
    return ParallelPlan(**(base | kw)).to_dict()


# ---- resources -------------------------------------------------------------------------------------


def test_cpu_limits():
    lim = local_limits(CPU2, "cpu")
    assert lim.max_ranks == 2 and "2 CPU cores" in lim.why
    assert lim.memory_bytes_per_device == pytest.approx(22 * GIB / 3)
    assert lim.memory_fits(2, 1 * GIB) and not lim.memory_fits(2, 3.5 * GIB)  # 2 x (3.5 + 0.5) > 7.33
    assert local_limits(CPU2, "cpu", 8).max_ranks == 8  # the user may oversubscribe the cores
    big = Machine(cpu_cores=64, ram_total_bytes=512 * GIB, ram_available_bytes=500 * GIB)
    assert local_limits(big, "cpu").memory_bytes_per_device == 8 * GIB  # capped
    with pytest.raises(InputError, match="at least 1"):
        local_limits(CPU2, "cpu", 0)


def test_gpu_limits():
    lim = local_limits(GPU8, "cuda")
    assert lim.max_ranks == 8 and lim.memory_fits(8, 70 * GIB) and not lim.memory_fits(1, 75 * GIB)
    assert local_limits(GPU8, "cuda", 4).max_ranks == 4
    with pytest.raises(InputError, match="exceeds the 8 GPU"):
        local_limits(GPU8, "cuda", 16)
    with pytest.raises(InputError, match="--launcher slurm"):
        local_limits(CPU2, "cuda")


def test_detect_reads_this_machine_without_torch():
    code = (
        "import sys, autopar.measured.resources as r, autopar.measured.proxy, autopar.measured.slurm, "
        "autopar.measured.hygiene; m = r.detect(); "
        "print(m.cpu_cores, m.ram_available_bytes > 0, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    cores, ram, torch = out.stdout.split()
    assert int(cores) >= 1 and ram == "True" and torch == "False", out.stderr


# ---- placements ------------------------------------------------------------------------------------


def test_a_plan_that_fits_runs_as_it_is(local):
    pl = planner("tiny", 2, local, cluster=local)
    plan = ParallelPlan(dp=2, global_batch_size=8, dtype="fp32", zero_stage=3).to_dict()
    p = pl.place(plan)
    assert p.kind == "full" and p.proxy is None and p.nproc == 2 and p.device == "cpu"
    assert {k: p.run_plan[k] for k in ("tp", "dp", "global_batch_size", "zero_stage")} == {
        k: plan[k] for k in ("tp", "dp", "global_batch_size", "zero_stage")
    }


def test_tp_cp_pipeline_that_cannot_keep_its_ranks_is_not_runnable(local):
    p = planner("70b", 256, local).place(p70())
    assert p.kind == "not-runnable" and not p.runnable
    assert "tp2 x cp2 x 2 pipeline stages = 8 ranks" in p.reason and "at most 2" in p.reason
    assert "--launcher slurm" in p.reason and "--max-local-ranks 8" in p.reason


def test_proxy_keeps_tp_cp_schedule_and_microbatches(local):
    for schedule, vpp in (("1f1b", 1), ("zero-bubble", 1), ("interleaved-1f1b", 2)):
        plan = p70(pp_schedule=schedule, vpp=vpp)
        p = planner("70b", 256, local, max_ranks=8).place(plan)
        assert p.kind == "proxy", p.reason
        run, full = ParallelPlan.from_dict(p.run_plan), ParallelPlan.from_dict(plan)
        assert (run.tp, run.cp, run.vpp, run.pp_schedule) == (2, 2, vpp, schedule)
        assert run.pp == 2 and run.dp == 1 and run.num_gpus == p.nproc == 8  # stand-in stages, smaller dp
        assert run.num_microbatches == full.num_microbatches == 64  # the bubble's microbatch count
        assert (run.micro_batch_size, run.zero_stage, run.dtype) == (1, 3, "fp32")
        spec = TrialConfig(model=p.model, plan=p.run_plan).model_spec()
        assert spec.num_kv_heads % run.tp == 0 and spec.num_attention_heads % run.tp == 0
        assert spec.num_layers == run.pp * run.vpp * p.proxy.layers_per_stage
        assert p.seq_len % (2 * run.cp) == 0 and not plan_problems(run, spec) and not model_problems(spec)
        assert not run.problems(spec, num_gpus=p.nproc, seq_len=p.seq_len)
        # the scale-back ratio: the plan's prediction over the proxy's prediction on this CPU
        here = estimate(run, spec, local, num_gpus=p.nproc, seq_len=p.seq_len)
        target = estimate(full, get_preset("70b"), H100, num_gpus=256, seq_len=8192)
        assert p.proxy.time_ratio == pytest.approx(target.step_time_s / here.step_time_s)
        assert p.proxy.memory_ratio == pytest.approx(target.peak_memory_bytes / here.peak_memory_bytes)
        assert p.proxy.predicted_step_time_s <= 1.0 and p.proxy.cross_hardware
        assert any("pp 8 -> 2" in c for c in p.proxy.changes) and any("fp32" in c for c in p.proxy.changes)


def test_dp_only_plan_keeps_a_dp_group_at_two_ranks(local):
    plan = ParallelPlan(dp=256, global_batch_size=512, micro_batch_size=2, zero_stage=3, recompute="full").to_dict()
    p = planner("70b", 256, local).place(plan)
    run = ParallelPlan.from_dict(p.run_plan)
    assert p.kind == "proxy" and run.dp == 2 and run.zero_stage == 3 and run.recompute == "full"
    assert run.num_microbatches == 1 and run.global_batch_size == 4


def test_same_hardware_proxy_is_not_cross_hardware(local):
    """--gpu local --gpus 8 on 2 cores: dp shrinks, nothing else changes, the scale-back is on
    the same profile (and such trials may calibrate)."""
    plan = ParallelPlan(dp=8, global_batch_size=16, dtype="fp32", zero_stage=1).to_dict()
    p = planner("tiny", 8, local, cluster=local).place(plan)
    assert p.kind == "proxy" and not p.proxy.cross_hardware
    assert p.proxy.changes == ("2 of 8 ranks", "dp 8 -> 2") and p.proxy.width_divisor == p.proxy.seq_divisor == 1


def test_moe_proxy_keeps_experts_per_rank_and_stands_in_for_mla(local):
    plan = ParallelPlan(dp=1024, ep=64, global_batch_size=1024, zero_stage=3, recompute="full").to_dict()
    p = planner("deepseek-v3", 1024, local).place(plan)
    assert p.kind == "proxy", p.reason
    run = ParallelPlan.from_dict(p.run_plan)
    spec = TrialConfig(model=p.model, plan=p.run_plan).model_spec()
    assert run.ep == 2 and run.dp == 2 and spec.moe.num_experts // run.ep == 256 // 64  # experts per rank kept
    assert spec.mla is None and not model_problems(spec) and spec.is_moe_layer(0)
    assert any("stands in for MLA" in c for c in p.proxy.changes)
    assert spec.moe.top_k == min(8, spec.moe.num_experts)
    # without proxies the same plan is refused, and says so
    off = planner("deepseek-v3", 1024, local, options=ProxyOptions(enabled=False)).place(plan)
    assert off.kind == "not-runnable" and "MLA" in off.reason and "--no-proxy" in off.reason


def test_no_proxy_refuses_a_gpu_plan_on_the_cpu(local):
    plan = ParallelPlan(dp=2, global_batch_size=8).to_dict()  # bf16, for H100s
    p = planner("tiny", 2, local, options=ProxyOptions(enabled=False)).place(plan)
    assert p.kind == "not-runnable" and "fp32 on the CPU" in p.reason and "drop --no-proxy" in p.reason


def test_memory_and_time_limits_and_fixed_proxy_sizes(local):
    plan = ParallelPlan(dp=256, global_batch_size=512, micro_batch_size=2, zero_stage=3, recompute="full").to_dict()
    tight = Machine(cpu_cores=2, ram_total_bytes=4 * GIB, ram_available_bytes=3.2 * GIB)  # 1.07 GiB for 2 ranks
    p = planner("70b", 256, local, machine=tight, options=ProxyOptions(width_divisor=1, seq_divisor=1)).place(plan)
    assert p.kind == "not-runnable" and "GiB per rank" in p.reason and "--proxy-width" in p.reason
    p = planner("70b", 256, local, options=ProxyOptions(step_budget_s=1e-6)).place(plan)
    assert p.kind == "not-runnable" and "s per step" in p.reason and "--trial-timeout" in p.reason
    p = planner("70b", 256, local, options=ProxyOptions(width_divisor=16, seq_divisor=8, layers_per_stage=2)).place(
        plan
    )
    spec = TrialConfig(model=p.model, plan=p.run_plan).model_spec()
    assert p.kind == "proxy" and spec.hidden_size == 8192 // 16 and p.seq_len == 8192 // 8 and spec.num_layers == 2
    assert spec.num_attention_heads * spec.head_dim == spec.hidden_size  # heads first, then head size
    assert CPU_RANK_RUNTIME_BYTES > 0


def test_gpu_machine_proxies_keep_the_width(local):
    """8 local H100s for a 256-GPU plan: fewer ranks and layers, full width and sequence, bf16."""
    plan = ParallelPlan(tp=8, pp=4, dp=8, global_batch_size=512, zero_stage=1).to_dict()
    p = planner("70b", 256, local, machine=GPU8, options=ProxyOptions(step_budget_s=None)).place(plan)
    assert p.kind == "not-runnable" and "tp8 x 2 pipeline stages = 16 ranks" in p.reason  # tp8 x 2 > 8 GPUs
    plan = ParallelPlan(tp=4, pp=4, dp=16, global_batch_size=512, zero_stage=1).to_dict()
    p = planner("70b", 256, local, machine=GPU8, options=ProxyOptions(step_budget_s=None)).place(plan)
    run = ParallelPlan.from_dict(p.run_plan)
    assert p.kind == "proxy" and p.device == "cuda" and run.dtype == "bf16" and not p.proxy.cross_hardware
    assert p.proxy.width_divisor == 1 and p.proxy.seq_divisor == 1 and run.tp == 4 and p.nproc <= 8


def test_standin_model_lists_each_substitution():
    spec, said = standin_model(get_preset("qwen3-30b-a3b"))
    assert not spec.qk_norm and said and not model_problems(spec)
    spec, said = standin_model(get_preset("gpt3-175b"))
    assert spec.gated_mlp and spec.norm == "rmsnorm" and len(said) >= 3 and not model_problems(spec)


# ---- measuring a placement: scale-back and labels ---------------------------------------------------


def _fake_launch(step_s: float, peak: float):
    def launch(trials, nproc, *, on_progress=None, **_):
        timed = {
            "name": "t",
            "status": "ok",
            "step_time_s": [step_s * 3] + [step_s] * (trials[0].steps - 1),
            "timed_steps": list(range(1, trials[0].steps - 1)),
            "tokens_per_step": 1000,
            "model_flops_per_step": 1e12,
            "final_loss": 5.0,
            "ranks": [{"peak_memory_bytes": peak, "param_count": 10, "comm": None}] * nproc,
        }
        memory = {
            "name": "m",
            "status": "ok",
            "ranks": [{"peak_memory_bytes": peak, "memory_method": "tensor-peak"}] * nproc,
        }
        if on_progress:
            for i in timed["timed_steps"]:
                on_progress({"trial": 0, "step": i, "time_s": step_s, "timed": True})
        return LaunchResult(
            outcome="ok",
            returncode=0,
            wall_s=1.0,
            result={"complete": True, "trials": [timed, memory]},
            command=["fake"],
        )

    return launch


def test_measure_placement_scales_a_proxy_back_and_labels_it(local, tmp_path):
    plan = ParallelPlan(dp=256, global_batch_size=512, micro_batch_size=2, zero_stage=3, recompute="full").to_dict()
    p = planner("70b", 256, local).place(plan)
    est = estimate(ParallelPlan.from_dict(plan), get_preset("70b"), H100, num_gpus=256, seq_len=8192)
    predicted = {
        "step_time_s": est.step_time_s,
        "peak_memory_bytes": est.peak_memory_bytes,
        "mfu": est.mfu,
        "tokens_per_s": est.tokens_per_s,
    }
    seen = []
    doc = measure_placement(
        p,
        predicted,
        steps=3,
        workdir=tmp_path,
        launch_fn=_fake_launch(0.5, 100 * 2**20),
        on_step=lambda i, t: seen.append(t) and False,
    )
    m, own = doc["measured"], doc["measured"]["proxy"]
    r = p.proxy.time_ratio
    assert doc["kind"] == "proxy" and doc["plan"] == plan and doc["proxy"]["summary"] == p.proxy.summary
    assert own["step_time_s"] == 0.5 and m["step_time_s"] == pytest.approx(0.5 * r)
    assert seen == pytest.approx([0.5 * r] * 3)  # the pruner sees the plan's scale
    assert own["peak_memory_bytes"] == 100 * 2**20 and m["peak_memory_bytes"] == pytest.approx(
        100 * 2**20 * p.proxy.memory_ratio
    )
    assert doc["errors"]["step_time"] == pytest.approx(p.proxy.predicted_step_time_s / 0.5 - 1)
    assert own["step_time_error"] == pytest.approx(doc["errors"]["step_time"])
    assert m["mfu"] == pytest.approx(est.mfu * est.step_time_s / m["step_time_s"])
    assert "scaled back" in m["scaled"]
    # a plan that cannot run: a document that says why, and nothing launched
    no = planner("70b", 256, local).place(p70())
    doc = measure_placement(no, predicted, launch_fn=lambda *a, **k: pytest.fail("launched"))
    assert doc["status"] == "not-runnable" and doc["reasons"] == [no.reason] and doc["measured"] == {}
