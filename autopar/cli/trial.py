"""`autopar trial`: run one plan for real under torchrun (or write the sbatch script that would)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.cli.plan_flags import with_plan_flags
from autopar.cli.trial_flags import OwnTrainer, with_own_trainer_flags
from autopar.errors import InputError
from autopar.figures import MFU, PEAK_MEMORY_BYTES, STEP_TIME_S, TOKENS_PER_S
from autopar.json_out import dumps
from autopar.spec.resolve import PlanRequest

# the options of `trial` alone (those shared with other commands are in autopar.cli.options)
Gpus = Annotated[int, typer.Option("--gpus", "-g", help="Ranks in all (nodes x per node).")]
Gpu = Annotated[str, typer.Option("--gpu", help="Hardware profile of the prediction (local = `autopar probe`).")]
Steps = Annotated[int, typer.Option("--steps", help="Timed steps after warm-up.")]
Warmup = Annotated[int, typer.Option("--warmup", help="Warm-up steps, left out of the timing.")]
ProxyLayers = Annotated[
    Optional[int],
    typer.Option(
        "--proxy-layers", help="Proxy: run this many layers (same shapes, pp/vpp split kept), scale the time back."
    ),
]
ProxyWidth = Annotated[
    Optional[int],
    typer.Option("--proxy-width", help="Proxy: a model this many times narrower, same ratios; scale the time back."),
]
Nnodes = Annotated[int, typer.Option("--nnodes", help="Nodes (multi-node: one torchrun per node).")]
NodeRank = Annotated[int, typer.Option("--node-rank", help="This node's rank (multi-node).")]
RdzvEndpoint = Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="host:port (multi-node).")]
EmitSlurm = Annotated[Optional[Path], typer.Option("--emit-slurm", help="Write an sbatch script, run nothing.")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds before the trial is killed.")]
MaxLocalRanks = Annotated[
    Optional[int],
    typer.Option(
        "--max-local-ranks",
        help="Most ranks this machine may start (default: its CPU cores; more oversubscribes them).",
    ),
]
MemoryLimitMib = Annotated[
    Optional[float], typer.Option("--memory-limit-mib", help="Cap each rank's memory growth (forces an OOM past it).")
]
RunDir = Annotated[Path, typer.Option("--run-dir", help="Results go to RUN_DIR/trials/.")]


@app.command()
@with_own_trainer_flags
@with_plan_flags
def trial(
    model: o.Model,
    gpus: Gpus,
    seq_len: o.SeqLen = None,
    gpu: Gpu = "local",
    cluster: o.ClusterFile = None,
    steps: Steps = 5,
    warmup: Warmup = 2,
    proxy_layers: ProxyLayers = None,
    proxy_width: ProxyWidth = None,
    nnodes: Nnodes = 1,
    node_rank: NodeRank = 0,
    rdzv_endpoint: RdzvEndpoint = None,
    emit_slurm: EmitSlurm = None,
    timeout: Timeout = 300.0,
    max_local_ranks: MaxLocalRanks = None,
    memory_limit_mib: MemoryLimitMib = None,
    run_dir: RunDir = Path("reports/trials"),
    as_json: o.Json = False,
    *,
    plan: PlanRequest,
    own: OwnTrainer,
) -> None:
    """Run one plan of MODEL on GPUS ranks for real; record times, memory, bytes; compare with the estimate.

    The plan flags are `autopar estimate`'s (dp = gpus / (tp*pp*cp); gbs defaults to one microbatch per
    stage, dtype to fp32, the trainer to autopar's built-in model, else --measure-with's).
    Example: autopar trial --model tiny --gpus 2 --tp 2 --mbs 2 --gbs 8
    """
    from autopar.cli.checks import output_dir, output_file
    from autopar.measured import plan_trial
    from autopar.measured.trials import plan_key
    from autopar.spec.presets import resolve_model

    _check_trial_flags(
        gpus=gpus,
        seq_len=seq_len,
        steps=steps,
        warmup=warmup,
        proxy_layers=proxy_layers,
        proxy_width=proxy_width,
        nnodes=nnodes,
        node_rank=node_rank,
        timeout=timeout,
        max_local_ranks=max_local_ranks,
        memory_limit_mib=memory_limit_mib,
        rdzv_endpoint=rdzv_endpoint,
        emit_slurm=emit_slurm,
        own=own.measure_with,
    )
    spec = resolve_model(model)
    if own.measure_with is not None:
        return _own_trainer(spec, gpus, seq_len, gpu, cluster, plan, own, (steps, warmup, timeout), run_dir, as_json)
    plan_trial.check_proxy_width(spec, proxy_width)
    output_file(emit_slurm, "--emit-slurm")
    output_dir(run_dir, "--run-dir")
    t = plan_trial.prepare(
        spec,
        gpus,
        seq_len or spec.seq_len,
        plan_trial.trial_request(plan, gpus),
        gpu=gpu,
        cluster_file=cluster,
        proxy_layers=proxy_layers,
        proxy_width=proxy_width,
        on_cpu=not emit_slurm,
    )
    key = plan_key(t.plan.to_dict())
    nproc = gpus // nnodes
    launch: dict[str, Any] = dict(steps=steps, warmup=warmup, timeout=timeout)  # the ranks' run, here or sbatch
    if emit_slurm:
        spec_path = plan_trial.write_sbatch(t, key, emit_slurm, run_dir, nnodes=nnodes, nproc=nproc, **launch)
        print(f"sbatch script: {emit_slurm} (run file {spec_path})")
        return
    rdzv = _rendezvous(nnodes, node_rank, rdzv_endpoint)
    plan_trial.check_local_fit(t, nproc, max_local_ranks)
    doc, path = _run_here(t, key, nproc, rdzv=rdzv, memory_limit_mib=memory_limit_mib, run_dir=run_dir, **launch)
    _print_result(doc, key, t.predicted, path, as_json)
    if doc["status"] != "ok":
        sys.exit(1)


def _check_trial_flags(
    *,
    gpus: int,
    seq_len: int | None,
    steps: int,
    warmup: int,
    proxy_layers: int | None,
    proxy_width: int | None,
    nnodes: int,
    node_rank: int,
    timeout: float,
    max_local_ranks: int | None,
    memory_limit_mib: float | None,
    rdzv_endpoint: str | None,
    emit_slurm: Path | None,
    own: str | None = None,
) -> None:
    """One line for the first bad launch flag (ranges, --rdzv-endpoint's HOST:PORT, --node-rank, a
    flag of the built-in model's trials with --measure-with), or for a missing torch when the trial
    runs here (not for --emit-slurm: the cluster's python runs the script)."""
    from autopar.errors import quoted
    from autopar.measured.needs_torch import require_torch
    from autopar.spec.schema import check_flags

    check_flags(
        {
            "--gpus": gpus,
            "--seq-len": seq_len,
            "--steps": steps,
            "--warmup": warmup,
            "--proxy-layers": proxy_layers,
            "--proxy-width": proxy_width,
            "--nnodes": nnodes,
            "--node-rank": node_rank,
            "--timeout": timeout,
            "--max-local-ranks": max_local_ranks,
            "--memory-limit-mib": memory_limit_mib,
        }
    )
    if rdzv_endpoint is not None and not re.fullmatch(r"[A-Za-z0-9._\-\[\]:]+:\d{1,5}", rdzv_endpoint):
        raise InputError(
            f"--rdzv-endpoint {quoted(rdzv_endpoint)} must be HOST:PORT, e.g. --rdzv-endpoint node001:29500"
        )
    if node_rank >= nnodes:
        raise InputError(f"--node-rank {node_rank} must be below --nnodes {nnodes} (ranks count from 0)")
    if gpus % nnodes:
        raise InputError(f"--gpus {gpus} must be a multiple of --nnodes {nnodes}; change one of them")
    builtin_only = {
        "--proxy-layers": proxy_layers,
        "--proxy-width": proxy_width,
        "--nnodes": nnodes if nnodes > 1 else None,
        "--max-local-ranks": max_local_ranks,
        "--memory-limit-mib": memory_limit_mib,
        "--emit-slurm": emit_slurm,
    }
    given = [flag for flag, v in builtin_only.items() if v is not None]
    if own is not None and given:
        raise InputError(
            f"{given[0]} applies to the built-in model's trials; drop it with --measure-with {own} (the trainer "
            f"runs the plan as it is, on this node)"
        )
    if emit_slurm is None and own is None:
        require_torch("autopar trial")


def _rendezvous(nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> dict | None:
    """torchrun's rendezvous of a multi-node trial run here (None on one node); one line when the
    endpoint is missing."""
    if nnodes <= 1:
        return None
    if not rdzv_endpoint:
        raise InputError("--nnodes > 1 needs --rdzv-endpoint host:port (or --emit-slurm)")
    return {"nnodes": nnodes, "node_rank": node_rank, "endpoint": rdzv_endpoint}


def _run_here(
    t,
    key: str,
    nproc: int,
    *,
    steps: int,
    warmup: int,
    timeout: float,
    rdzv: dict | None,
    memory_limit_mib: float | None,
    run_dir: Path,
) -> tuple[dict, Path]:
    """Run the trial under torchrun on this machine; the trial document and the file it went to."""
    from autopar.measured.hygiene import install_signal_handlers
    from autopar.measured.measure import measure_plan
    from autopar.search.run_dir import write_trial_doc

    install_signal_handlers()  # SIGINT/SIGTERM: kill the trial's processes, exit 130/143
    doc = measure_plan(
        t.model,
        t.plan.to_dict(),
        nproc,
        predicted=t.predicted,
        steps=steps,
        warmup=warmup,
        seq_len=t.seq_len,
        proxy=t.proxy,
        proxy_ratio=t.proxy_ratio,
        timeout_s=timeout,
        rdzv=rdzv,
        peak_flops=t.peak_flops,
        worker_args=["--memory-limit-mib", str(memory_limit_mib)] if memory_limit_mib else None,
        workdir=run_dir / "trials" / "work" / key,
    )
    return doc, write_trial_doc(doc | {"key": key}, run_dir / "trials")


def _print_result(doc: dict, key: str, predicted: dict, path: Path, as_json: bool) -> None:
    """The trial document as JSON, or two lines: measured vs predicted, collective bytes and environment."""
    if as_json:
        print(dumps(doc, indent=1))
        return
    m = doc["measured"]
    if doc["status"] != "ok":
        print(f"{key}: {doc['status']} ({doc['outcome']}): {'; '.join(doc['reasons'])[:400]}")
    else:
        print(
            f"{key}: {m[STEP_TIME_S]:.4f} s/step median (spread {100 * m['step_time_spread']:.0f}%), "
            f"{m[TOKENS_PER_S]:.0f} tokens/s, MFU {100 * m.get(MFU, 0):.1f}%, peak "
            f"{m[PEAK_MEMORY_BYTES] / 2**20:.1f} MiB/rank ({m['memory_method']}); predicted "
            f"{predicted[STEP_TIME_S]:.4f} s, {predicted[PEAK_MEMORY_BYTES] / 2**20:.1f} MiB"
            + (f"; proxy {m['proxy']['kind']} x{m['proxy']['ratio']:.2f}" if "proxy" in m else "")
        )
        comm = " ".join(f"{a}={b / 2**20:.2f}MiB" for a, b in m["comm_bytes_per_rank_by_axis"].items())
        print(
            f"  collective bytes/step/rank: {comm or '-'}; env: {doc['environment'].get('torch')} "
            f"{doc['environment'].get('device')} {doc['environment'].get('backend')}"
        )
    print(f"Result: {path}")


def _own_trainer(
    spec, gpus: int, seq_len, gpu: str, cluster, req: PlanRequest, own: OwnTrainer, run: tuple, run_dir, as_json: bool
) -> None:
    """`trial --measure-with TRAINER`: the plan exported for a short run of the trainer, run here, its
    log parsed (autopar.measured.own_run.trial_with); the trial document, or one line."""
    from autopar.cli.checks import output_dir
    from autopar.measured import plan_trial
    from autopar.measured.hygiene import install_signal_handlers
    from autopar.measured.own_run import trial_with
    from autopar.measured.own_trainer import locate

    steps, warmup, timeout = run
    trainer = str(own.measure_with)
    where = locate(trainer, own.home, own.python)
    output_dir(run_dir, "--run-dir")
    if req.trainer is not None and req.trainer != trainer:
        raise InputError(f"--measure-with {trainer} runs {trainer}'s plan; drop --trainer {req.trainer}")
    req = plan_trial.trial_request(req.with_defaults(trainer=trainer), gpus)
    install_signal_handlers()  # SIGINT/SIGTERM: kill the trainer's processes, exit 130/143
    doc, path = trial_with(where, spec, gpus, seq_len or spec.seq_len, req, gpu, cluster, run, run_dir)
    if as_json:
        print(dumps(doc, indent=1))
    elif doc["status"] == "ok":
        m, p = doc["measured"], doc["predicted"]
        print(
            f"{doc['key']} with {where.text}: {m[STEP_TIME_S]:.4f} s/step, the median of {len(m['step_times_s'])} "
            f"after {warmup} warm-up; predicted {p[STEP_TIME_S]:.4f} s on {p['cluster']}"
            + (
                f"; peak {m[PEAK_MEMORY_BYTES] / 2**30:.2f} GiB ({m['memory_method']})"
                if PEAK_MEMORY_BYTES in m
                else ""
            )
        )
    else:
        print(f"{doc['key']} with {trainer}: {doc['status']}: {'; '.join(doc['reasons'])[:400]}")
    if not as_json:
        print(f"Result: {path} (log: {doc.get('log')})")
    if doc["status"] != "ok":
        sys.exit(1)
