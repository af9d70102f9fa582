"""Measure one plan for real and say how it compares with the estimate; imports no torch.

`measure_plan` launches one torchrun run of two trials of the plan (autopar.measured.launcher): a timed
one (warm-up, then N steps; VmHWM) and a short one with tensor-memory tracking (live tensor bytes,
autopar.trial.memory; kept apart because tracking slows the step), and returns the trial document
`reports/<run>/trials/*.json` holds: plan, predicted, measured, status/outcome/reasons, environment.

Proxies (a machine smaller than the target): `proxy={"num_layers": n}` runs the same per-rank
program with fewer layers (every layer keeps its shape, pp/vpp split kept: n must be a multiple of
pp*vpp); the step time is scaled back by the ratio of the estimate's full and proxy step times (the
cost model carries the non-layer terms); `{"width_divisor": d}` runs a narrower model with the same
ratios (ModelSpec.scaled) and scales back the same way. Both say so in `measured.proxy`.

Placements (autopar.measured.proxy): `measure_placement` runs what the planner chose for this machine
— the plan as is, or its proxy — and writes the trial document about the *plan*: `kind` ("full",
"proxy", "not-runnable"), `proxy` (what changed, the proxy's own prediction here, the ratios), and
in `measured` the figures scaled back to the plan (step times x time ratio, peak memory x memory
ratio, tokens/s and MFU from the prediction's), with the proxy's own figures in `measured.proxy`;
collective bytes, per-rank parameter and memory lists stay the proxy's. A plan that cannot run here
gets a document with status "not-runnable" and the reason. The launch goes through `launch_fn`
(default: torchrun here, autopar.measured.launcher.launch; autopar.measured.slurm.run_job for a cluster).

Pruning: with `on_step(index, time_s)`, each timed step of the timed trial is handed over as it
ends (index 0, 1, ... = its place in `measured.step_times_s`); when it returns True the run is
killed and the document says status "pruned", with the steps that ran in `measured`
(`partial: true`, no memory figures: the memory trial never ran).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autopar.figures import MFU, MODEL_FLOPS_PER_STEP, PEAK_MEMORY_BYTES, STEP_TIME_S, TOKENS_PER_S
from autopar.measured.config import TrialConfig
from autopar.measured.launcher import LaunchResult, launch
from autopar.measured.proxy import Placement
from autopar.spec.plan import ParallelPlan

OUTCOME_STATUS = {
    "ok": "ok",
    "teardown-abort": "ok",
    "oom": "oom",
    "timeout": "timeout",
    "crash": "crash",
    "pruned": "pruned",
}
NOT_RUNNABLE = "not-runnable"
#: launch(trials, nproc, *, timeout_s, workdir, worker_args, rdzv, on_progress) -> LaunchResult
LaunchFn = Callable[..., LaunchResult]
#: the measured figures a proxy's document scales back to the plan
SCALED = (STEP_TIME_S, "step_times_s", "mean_step_time_s", PEAK_MEMORY_BYTES, TOKENS_PER_S, MFU)


def trial_configs(
    model: str | dict,
    plan: dict,
    *,
    steps: int = 5,
    warmup: int = 1,
    seq_len: int | None = None,
    scale: dict | None = None,
    device: str = "cpu",
    name: str = "",
) -> list[TrialConfig]:
    """The timed trial (`warmup` steps, `steps` timed ones, then the byte-counting step) and the
    tensor-memory trial of one plan."""
    base: dict[str, Any] = dict(
        model=model, plan=plan, scale=scale, seq_len=seq_len, device=device, optimizer="adamw", seed=0
    )
    return [
        TrialConfig(name=name or "timed", steps=warmup + steps + 1, warmup=warmup, count_comm=True, **base),
        TrialConfig(
            name=(name or "timed") + ":memory",
            steps=2,
            warmup=1,
            count_comm=False,
            extra={"tensor_memory": True},
            **base,
        ),
    ]


def summarise(timed: dict, memory: dict | None) -> dict:
    """The measured figures of a result: per-step times (median and spread), tokens/s, MFU-ready
    FLOPs, peak memory per rank (tensor and process), collective bytes per axis."""
    times = [timed[STEP_TIME_S][i] for i in timed["timed_steps"]]
    med = statistics.median(times)
    comm: dict[str, float] = {}
    for r in timed["ranks"]:
        for axis, n in ((r.get("comm") or {}).get("bytes_by_axis") or {}).items():
            comm[axis] = max(comm.get(axis, 0), n)
    out = {
        STEP_TIME_S: med,
        "step_times_s": times,
        "step_time_spread": (max(times) - min(times)) / med,
        "mean_step_time_s": statistics.fmean(times),
        TOKENS_PER_S: timed["tokens_per_step"] / med,
        MODEL_FLOPS_PER_STEP: timed[MODEL_FLOPS_PER_STEP],
        "final_loss": timed["final_loss"],
        "process_peak_bytes_per_rank": [r[PEAK_MEMORY_BYTES] for r in timed["ranks"]],
        "comm_bytes_per_rank_by_axis": comm,
        "param_count_per_rank": [r["param_count"] for r in timed["ranks"]],
    }
    if memory:
        per_rank = [r[PEAK_MEMORY_BYTES] for r in memory["ranks"]]
        out |= {
            PEAK_MEMORY_BYTES: max(per_rank),
            "peak_memory_bytes_per_rank": per_rank,
            "memory_method": memory["ranks"][0]["memory_method"],
        }
    else:
        out |= {PEAK_MEMORY_BYTES: max(out["process_peak_bytes_per_rank"]), "memory_method": "VmHWM"}
    return out


def partial_summary(times: list[float], steps: int) -> dict:
    """The measured figures of a trial stopped after `len(times)` of its `steps` timed steps."""
    med = statistics.median(times)
    return {
        STEP_TIME_S: med,
        "step_times_s": times,
        "mean_step_time_s": statistics.fmean(times),
        "step_time_spread": (max(times) - min(times)) / med,
        "steps_run": len(times),
        "steps_planned": steps,
        "partial": True,
    }


def measure_plan(
    model: str | dict,
    plan: dict,
    nproc: int,
    *,
    predicted: dict | None = None,
    steps: int = 5,
    warmup: int = 1,
    seq_len: int | None = None,
    proxy: dict | None = None,
    timeout_s: float = 120.0,
    workdir: Path | None = None,
    worker_args: list[str] | None = None,
    rdzv: dict | None = None,
    peak_flops: float | None = None,
    proxy_ratio: float | None = None,
    device: str = "cpu",
    on_step: Callable[[int, float], bool] | None = None,
    launch_fn: LaunchFn | None = None,
) -> dict:
    """Run the plan and return its trial document; never raises on a failed run (failures are data).
    `on_step(index, time_s)` sees each timed step live and returns True to stop (prune) the run."""
    name = ParallelPlan.from_dict(plan).describe()
    t0 = time.time()
    seen: list[float] = []  # the timed trial's timed steps, as streamed

    def progress(rec: dict) -> bool:
        if rec.get("trial") != 0 or not rec.get("timed"):
            return False  # warm-up, the byte-counting step, the memory trial
        seen.append(float(rec["time_s"]))
        assert on_step is not None  # progress is passed to the launch only with an on_step
        return bool(on_step(len(seen) - 1, seen[-1]))

    res = (launch_fn or launch)(
        trial_configs(model, plan, steps=steps, warmup=warmup, seq_len=seq_len, scale=proxy, name=name, device=device),
        nproc,
        timeout_s=timeout_s,
        workdir=workdir,
        worker_args=worker_args,
        rdzv=rdzv,
        on_progress=progress if on_step is not None else None,
    )
    head = {"name": name, "plan": plan, "model": model, "nproc": nproc, "predicted": predicted or {}}
    if res.outcome == "pruned":
        return _pruned_doc(head, res, t0, seen, steps)
    ok = [t for t in res.trials if t.get("status") == "ok"]
    doc = _finished_doc(head, res, t0, ok)
    if res.succeeded and ok:
        doc["measured"] = _measured(ok, nproc, proxy=proxy, proxy_ratio=proxy_ratio, peak_flops=peak_flops)
    elif not res.reasons:
        doc["reasons"] = [f"exit {res.returncode}: {res.stderr_tail[-300:]}"]
    if predicted and doc["measured"]:
        doc["errors"] = _prediction_errors(predicted, doc["measured"])
    return doc


def _pruned_doc(head: dict, res: LaunchResult, t0: float, seen: list[float], steps: int) -> dict:
    """The trial document of a run stopped by `on_step`: the timed steps that ran, as a partial summary."""
    return head | {
        "status": "pruned",
        "outcome": "pruned",
        "wall_s": res.wall_s,
        "started_at": t0,
        "reasons": [f"pruned after {len(seen)} of {steps} timed steps"],
        "command": res.command,
        "environment": {},
        "measured": partial_summary(seen, steps) if seen else {},
    }


def _finished_doc(head: dict, res: LaunchResult, t0: float, ok: list[dict]) -> dict:
    """The trial document of a run that ended by itself, before its measured figures (`ok`: the
    trials that finished ok; a run that exits cleanly without one counts as a crash)."""
    return head | {
        "status": OUTCOME_STATUS[res.outcome] if ok or not res.succeeded else "crash",
        "outcome": res.outcome,
        "reasons": res.reasons,
        "wall_s": res.wall_s,
        "started_at": t0,
        "command": res.command,
        "environment": (res.result or {}).get("env", {}),
        "measured": {},
    }


def _measured(
    ok: list[dict], nproc: int, *, proxy: dict | None, proxy_ratio: float | None, peak_flops: float | None
) -> dict:
    """The measured figures of the ok trials (timed, then memory); a proxy's step time scaled back by
    `proxy_ratio`, and the MFU over `nproc` ranks of `peak_flops` each."""
    measured = summarise(ok[0], ok[1] if len(ok) > 1 else None)
    if proxy:
        ratio = proxy_ratio or 1.0
        measured["proxy"] = {
            "kind": "fewer-layers" if "num_layers" in proxy else "narrower",
            **proxy,
            "scale_back": "step time x (estimate full / estimate proxy)",
            "ratio": ratio,
            "proxy_step_time_s": measured[STEP_TIME_S],
        }
        measured[STEP_TIME_S] *= ratio
    if peak_flops:
        measured[MFU] = measured[MODEL_FLOPS_PER_STEP] / (measured[STEP_TIME_S] * peak_flops * nproc)
    return measured


def _prediction_errors(predicted: dict, measured: dict) -> dict:
    """How far the prediction is from the measurement (predicted / measured - 1)."""
    return {
        "step_time": predicted[STEP_TIME_S] / measured[STEP_TIME_S] - 1,
        "peak_memory": predicted[PEAK_MEMORY_BYTES] / measured[PEAK_MEMORY_BYTES] - 1,
    }


def not_runnable_doc(placement: Placement, predicted: dict | None = None) -> dict:
    """The trial document of a plan that cannot run on this machine: why, and what to do."""
    p = ParallelPlan.from_dict(placement.plan)
    return {
        "name": p.describe(),
        "plan": placement.plan,
        "predicted": predicted or {},
        "kind": NOT_RUNNABLE,
        "status": NOT_RUNNABLE,
        "outcome": NOT_RUNNABLE,
        "reasons": [placement.reason],
        "measured": {},
        "started_at": time.time(),
        "wall_s": 0.0,
        "environment": {},
    }


def measure_placement(
    placement: Placement,
    predicted: dict,
    *,
    steps: int = 5,
    warmup: int = 1,
    timeout_s: float = 120.0,
    workdir: Path | None = None,
    peak_flops: float | None = None,
    on_step: Callable[[int, float], bool] | None = None,
    launch_fn: LaunchFn | None = None,
    worker_args: list[str] | None = None,
) -> dict:
    """Run a placement (the plan, or its proxy) and return the trial document about the plan; a
    proxy's figures are scaled back and labelled (see the module docstring)."""
    if not placement.runnable:
        return not_runnable_doc(placement, predicted)
    proxy = placement.proxy
    ratio = proxy.time_ratio if proxy else 1.0
    scaled_step = (lambda i, t: on_step(i, t * ratio)) if on_step is not None else None
    doc = measure_plan(
        placement.model,
        placement.run_plan,
        placement.nproc,
        predicted=predicted,
        steps=steps,
        warmup=warmup,
        seq_len=placement.seq_len,
        timeout_s=timeout_s,
        workdir=workdir,
        peak_flops=None if proxy else peak_flops,
        device=placement.device,
        on_step=scaled_step,
        launch_fn=launch_fn,
        worker_args=worker_args,
    )
    doc["kind"] = placement.kind
    doc["plan"] = placement.plan  # the plan as searched (the run plan may name the built-in trainer)
    if proxy is None:
        return doc
    doc |= {
        "name": ParallelPlan.from_dict(placement.plan).describe(),
        "proxy": proxy.to_dict()
        | {"run_plan": placement.run_plan, "model": placement.model.get("name"), "seq_len": placement.seq_len},
    }
    m = doc.get("measured") or {}
    if m:
        own = {k: m[k] for k in SCALED if k in m}
        own |= {
            "predicted_step_time_s": proxy.predicted_step_time_s,
            "predicted_peak_memory_bytes": proxy.predicted_peak_memory_bytes,
            "time_ratio": proxy.time_ratio,
            "memory_ratio": proxy.memory_ratio,
        }
        if m.get(STEP_TIME_S):
            own["step_time_error"] = proxy.predicted_step_time_s / m[STEP_TIME_S] - 1
        if m.get(PEAK_MEMORY_BYTES):
            own["memory_error"] = proxy.predicted_peak_memory_bytes / m[PEAK_MEMORY_BYTES] - 1
        for k in (STEP_TIME_S, "mean_step_time_s"):
            if k in m:
                m[k] *= ratio
        if "step_times_s" in m:
            m["step_times_s"] = [t * ratio for t in m["step_times_s"]]
        if PEAK_MEMORY_BYTES in m:
            m[PEAK_MEMORY_BYTES] *= proxy.memory_ratio
        for k in (TOKENS_PER_S, MFU):  # the plan's, at the scaled step time
            m.pop(k, None)
            if predicted.get(k) and m.get(STEP_TIME_S):
                m[k] = predicted[k] * predicted[STEP_TIME_S] / m[STEP_TIME_S]
        m["proxy"] = own
        m["scaled"] = (
            f"{', '.join(SCALED)} scaled back to the plan (x{ratio:.3g} time, x{proxy.memory_ratio:.3g} "
            f"memory); the other figures are the proxy's"
        )
    if predicted and m.get(STEP_TIME_S) and m.get(PEAK_MEMORY_BYTES):
        doc["errors"] = _prediction_errors(predicted, m)
    return doc
