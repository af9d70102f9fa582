"""`autopar trial`: run one plan for real under torchrun (or write the sbatch script that would)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.cli.plan_flags import with_plan_flags
from autopar.spec.resolve import PlanRequest


@app.command()
@with_plan_flags
def trial(
    model: o.Model,
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="Ranks in all (nodes x per node).")],
    seq_len: o.SeqLen = None,
    gpu: Annotated[str, typer.Option("--gpu", help="Hardware profile of the prediction (local = `autopar probe`).")] = "local",
    cluster: o.ClusterFile = None,
    steps: Annotated[int, typer.Option("--steps", help="Timed steps after warm-up.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up steps, left out of the timing.")] = 2,
    proxy_layers: Annotated[Optional[int], typer.Option("--proxy-layers", help="Proxy: run this many layers "
                                                        "(same shapes, pp/vpp split kept), scale the time back.")] = None,
    proxy_width: Annotated[Optional[int], typer.Option("--proxy-width", help="Proxy: a model this many times "
                                                       "narrower, same ratios; scale the time back.")] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", help="Nodes (multi-node: one torchrun per node).")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", help="This node's rank (multi-node).")] = 0,
    rdzv_endpoint: Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="host:port (multi-node).")] = None,
    emit_slurm: Annotated[Optional[Path], typer.Option("--emit-slurm", help="Write an sbatch script, run nothing.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds before the trial is killed.")] = 300.0,
    max_local_ranks: Annotated[Optional[int], typer.Option("--max-local-ranks", help="Most ranks this machine may "
                                                           "start (default: its CPU cores; more oversubscribes "
                                                           "them).")] = None,
    memory_limit_mib: Annotated[Optional[float], typer.Option("--memory-limit-mib", help="Cap each rank's memory "
                                                              "growth (forces an OOM past it).")] = None,
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Results go to RUN_DIR/trials/.")] = Path("reports/trials"),
    as_json: o.Json = False,
    *,
    plan: PlanRequest,
) -> None:
    """Run one plan of MODEL on GPUS ranks for real; record times, memory, bytes; compare with the estimate.

    The plan flags are `autopar estimate`'s (dp = gpus / (tp*pp*cp); the global batch defaults to one
    microbatch per pipeline stage, the dtype to fp32, the trainer to autopar's built-in model); plans
    the built-in model cannot run yet are refused before anything starts.

    Example: autopar trial --model tiny --gpus 2 --tp 2 --mbs 2 --gbs 8
    """
    import re
    import sys

    from autopar.cli.checks import output_dir, output_file
    from autopar.cost.estimate import estimate
    from autopar.errors import InputError, quoted
    from autopar.search.trials import plan_key
    from autopar.spec.presets import resolve_model
    from autopar.spec.resolve import resolve_cluster, resolve_plan
    from autopar.spec.schema import check_flags
    from autopar.trial.config import TrialConfig
    from autopar.trial.measure import measure_plan, write_trial

    check_flags({"--gpus": gpus, "--seq-len": seq_len, "--steps": steps, "--warmup": warmup,
                 "--proxy-layers": proxy_layers, "--proxy-width": proxy_width, "--nnodes": nnodes,
                 "--node-rank": node_rank, "--timeout": timeout, "--max-local-ranks": max_local_ranks,
                 "--memory-limit-mib": memory_limit_mib})
    if rdzv_endpoint is not None and not re.fullmatch(r"[A-Za-z0-9._\-\[\]:]+:\d{1,5}", rdzv_endpoint):
        raise InputError(f"--rdzv-endpoint {quoted(rdzv_endpoint)} must be HOST:PORT, e.g. --rdzv-endpoint "
                         f"node001:29500")
    if node_rank >= nnodes:
        raise InputError(f"--node-rank {node_rank} must be below --nnodes {nnodes} (ranks count from 0)")
    spec = resolve_model(model)
    seq = seq_len or spec.seq_len
    narrowest = min(spec.hidden_size, spec.ffn_hidden_size)
    if proxy_width and proxy_width > narrowest:
        raise InputError(f"--proxy-width {proxy_width} would leave {spec.name} no width (hidden {spec.hidden_size}, "
                         f"FFN {spec.ffn_hidden_size}); give at most {narrowest}")
    if gpus % nnodes:
        raise InputError(f"--gpus {gpus} must be a multiple of --nnodes {nnodes}; change one of them")
    output_file(emit_slurm, "--emit-slurm")
    output_dir(run_dir, "--run-dir")
    req = plan.with_defaults(dtype="fp32", trainer="autopar")
    req.check()
    if req.gbs is None:  # one microbatch per pipeline stage: the smallest batch
        tp, pp, cp = req.tp or 1, req.pp or 1, req.cp or 1
        req = req.with_defaults(gbs=(req.mbs or 1) * (req.dp or max(1, gpus // (tp * pp * cp))) * pp)
    dtype = req.dtype
    plan = resolve_plan(spec, gpus, seq, req)
    pp, vpp = plan.pp, plan.vpp
    problems = plan.problems(spec, num_gpus=gpus, seq_len=seq)
    if problems:
        raise InputError("invalid plan: " + "; ".join(problems))
    if dtype != "fp32" and not emit_slurm:
        raise InputError(f"--dtype {dtype}: trials here run on the CPU, which needs fp32; use --dtype fp32 "
                         f"(or --emit-slurm for a GPU machine)")
    unbuilt = _unbuilt(plan, spec)
    if unbuilt:
        raise InputError(f"the built-in model cannot run this plan yet: {'; '.join(unbuilt)}; "
                         f"change the plan flags (`autopar estimate` predicts any plan)")
    cl = resolve_cluster(gpu, None, cluster)
    est = estimate(plan, spec, cl, num_gpus=gpus, seq_len=seq)
    predicted = {"step_time_s": float(est.step_time_s), "peak_memory_bytes": float(est.peak_memory_bytes),
                 "cluster": cl.name or cl.gpu.key}
    proxy, ratio = None, None
    if proxy_layers or proxy_width:
        proxy = {"num_layers": proxy_layers} if proxy_layers else {"width_divisor": proxy_width}
        if proxy_layers and proxy_layers % (pp * vpp):
            raise InputError(f"--proxy-layers must be a multiple of pp*vpp ({pp * vpp}) to keep the split")
        small = estimate(plan, spec.scaled(**proxy), cl, num_gpus=gpus, seq_len=seq)
        ratio = float(est.step_time_s / small.step_time_s)
    key = plan_key(plan.to_dict())
    mdl = spec.to_dict() | {"name": spec.name}
    rdzv = {"nnodes": nnodes, "node_rank": node_rank, "endpoint": rdzv_endpoint} if nnodes > 1 else None
    nproc = gpus // nnodes
    if emit_slurm:
        spec_path = emit_slurm.with_suffix(".run.json")
        configs = [TrialConfig(name=key, model=mdl, plan=plan.to_dict(), scale=proxy, seq_len=seq,
                               steps=warmup + steps + 1, warmup=warmup, device="auto")]  # + the byte-counting step
        from autopar.trial.slurm import sbatch_script

        # the #SBATCH lines are the export's (autopar.quoting.sbatch_directives); rendered before
        # anything is written, so a path that cannot go into a script leaves no file behind
        script = sbatch_script(nnodes=nnodes, nproc=nproc, minutes=max(5, int(timeout // 60) + 5), python="python",
                               spec=spec_path.resolve(), out=(run_dir / "trials" / f"{key}.result.json").resolve())
        spec_path.write_text(json.dumps({"trials": [c.to_dict() for c in configs]}, indent=1))
        emit_slurm.write_text(script, encoding="utf-8")
        print(f"sbatch script: {emit_slurm} (run file {spec_path})")
        return
    if nnodes > 1 and not rdzv_endpoint:
        raise InputError("--nnodes > 1 needs --rdzv-endpoint host:port (or --emit-slurm)")
    here = cl if cl.gpu.key == "local" else resolve_cluster("local")  # the trial runs on this machine
    need = estimate(plan, spec if proxy is None else spec.scaled(**proxy), here, num_gpus=gpus, seq_len=seq)
    _check_fits(nproc, float(need.peak_memory_bytes), max_local_ranks)
    from autopar.trial.hygiene import install_signal_handlers

    install_signal_handlers()  # SIGINT/SIGTERM: kill the trial's processes, exit 130/143
    peak = cl.gpu.peak_flops("bf16") / (2 if dtype == "fp32" else 1)
    doc = measure_plan(mdl, plan.to_dict(), nproc, predicted=predicted, steps=steps, warmup=warmup, seq_len=seq,
                       proxy=proxy, proxy_ratio=ratio, timeout_s=timeout, rdzv=rdzv, peak_flops=peak,
                       worker_args=["--memory-limit-mib", str(memory_limit_mib)] if memory_limit_mib else None,
                       workdir=run_dir / "trials" / "work" / key)
    path = write_trial(doc | {"key": key}, run_dir / "trials", key)
    if as_json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        m = doc["measured"]
        if doc["status"] != "ok":
            print(f"{key}: {doc['status']} ({doc['outcome']}): {'; '.join(doc['reasons'])[:400]}")
        else:
            print(f"{key}: {m['step_time_s']:.4f} s/step median (spread {100 * m['step_time_spread']:.0f}%), "
                  f"{m['tokens_per_s']:.0f} tokens/s, MFU {100 * m.get('mfu', 0):.1f}%, peak "
                  f"{m['peak_memory_bytes'] / 2**20:.1f} MiB/rank ({m['memory_method']}); predicted "
                  f"{predicted['step_time_s']:.4f} s, {predicted['peak_memory_bytes'] / 2**20:.1f} MiB"
                  + (f"; proxy {m['proxy']['kind']} x{m['proxy']['ratio']:.2f}" if "proxy" in m else ""))
            comm = " ".join(f"{a}={b / 2**20:.2f}MiB" for a, b in m["comm_bytes_per_rank_by_axis"].items())
            print(f"  collective bytes/step/rank: {comm or '-'}; env: {doc['environment'].get('torch')} "
                  f"{doc['environment'].get('device')} {doc['environment'].get('backend')}")
        print(f"Result: {path}")
    if doc["status"] != "ok":
        sys.exit(1)


def _check_fits(nproc: int, peak_bytes: float, max_local_ranks: int | None) -> None:
    """Refuse, before anything is allocated, a trial this machine cannot hold: more ranks than it
    may start, or more memory per rank (predicted on this machine's `local` profile) than it has
    for a trial (autopar.trial.resources)."""
    from autopar.errors import InputError
    from autopar.trial.resources import detect, local_limits

    limits = local_limits(detect(use_gpus=False), "cpu", max_local_ranks)
    if nproc > limits.max_ranks:
        raise InputError(f"this trial starts {nproc} ranks here and this machine runs at most {limits.max_ranks} "
                         f"({limits.why}); add --max-local-ranks {nproc} to oversubscribe the cores, split it with "
                         f"--nnodes, or write a cluster job with --emit-slurm")
    if not limits.memory_fits(nproc, peak_bytes):
        raise InputError(f"this trial needs {peak_bytes / 2**30:.2f} GiB per rank and this machine allows "
                         f"{limits.memory_text(nproc)}; run a proxy (--proxy-layers, --proxy-width), a smaller "
                         f"--model, or write a cluster job with --emit-slurm")


def _unbuilt(plan, spec) -> list[str]:
    """What the built-in model cannot run of this plan (autopar.trial.features, no torch import)."""
    from autopar.trial.features import plan_problems

    return plan_problems(plan, spec)
