"""One plan's trial as `autopar trial` runs it; imports no torch.

`prepare` resolves the plan flags the trial's way (fp32, autopar's built-in model, one microbatch
per pipeline stage), refuses what the built-in model cannot run, and predicts the plan on the
hardware profile asked for (and, for a proxy, the time ratio that scales the measurement back).
`write_sbatch` writes the cluster job instead of running it; `check_local_fit` refuses, before
anything is allocated, a trial this machine cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autopar.calibration.estimate import estimate
from autopar.errors import InputError
from autopar.figures import PEAK_MEMORY_BYTES, STEP_TIME_S
from autopar.json_out import dumps
from autopar.measured.config import TrialConfig
from autopar.measured.features import plan_problems
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.resolve import PlanRequest, resolve_cluster, resolve_plan


@dataclass(frozen=True)
class PlanTrial:
    """A resolved, checked plan with what the trial compares it with."""

    spec: ModelSpec
    plan: ParallelPlan
    num_gpus: int
    seq_len: int
    cluster: ClusterSpec  # the hardware profile of the prediction
    predicted: dict  # step_time_s, peak_memory_bytes, cluster
    proxy: dict | None  # ModelSpec.scaled arguments, None = the full model
    proxy_ratio: float | None  # full / proxy predicted step time

    @property
    def model(self) -> dict:
        """The model as the trial configuration carries it."""
        return self.spec.to_dict() | {"name": self.spec.name}

    @property
    def peak_flops(self) -> float:
        """The MFU denominator: the profile's bf16 peak, halved for fp32."""
        return self.cluster.gpu.peak_flops("bf16") / (2 if self.plan.dtype == "fp32" else 1)


def check_proxy_width(spec: ModelSpec, proxy_width: int | None) -> None:
    """Refuse a --proxy-width that would leave the model no width."""
    narrowest = min(spec.hidden_size, spec.ffn_hidden_size)
    if proxy_width and proxy_width > narrowest:
        raise InputError(
            f"--proxy-width {proxy_width} would leave {spec.name} no width (hidden {spec.hidden_size}, "
            f"FFN {spec.ffn_hidden_size}); give at most {narrowest}"
        )


def trial_request(req: PlanRequest, gpus: int) -> PlanRequest:
    """The plan flags with the trial's defaults: fp32, autopar's built-in model, and a global batch
    of one microbatch per pipeline stage (the smallest batch)."""
    req = req.with_defaults(dtype="fp32", trainer="autopar")
    req.check()
    if req.gbs is None:
        tp, pp, cp = req.tp or 1, req.pp or 1, req.cp or 1
        req = req.with_defaults(gbs=(req.mbs or 1) * (req.dp or max(1, gpus // (tp * pp * cp))) * pp)
    return req


def _checked_plan(spec: ModelSpec, gpus: int, seq: int, req: PlanRequest, *, on_cpu: bool) -> ParallelPlan:
    """The plan of the flags, refused when invalid, not fp32 on the CPU, or not built yet."""
    plan = resolve_plan(spec, gpus, seq, req)
    problems = plan.problems(spec, num_gpus=gpus, seq_len=seq)
    if problems:
        raise InputError("invalid plan: " + "; ".join(problems))
    if req.dtype != "fp32" and on_cpu:
        raise InputError(
            f"--dtype {req.dtype}: trials here run on the CPU, which needs fp32; use --dtype fp32 "
            f"(or --emit-slurm for a GPU machine)"
        )
    unbuilt = plan_problems(plan, spec)
    if unbuilt:
        raise InputError(
            f"the built-in model cannot run this plan yet: {'; '.join(unbuilt)}; "
            f"change the plan flags (`autopar estimate` predicts any plan)"
        )
    return plan


def prepare(
    spec: ModelSpec,
    gpus: int,
    seq: int,
    req: PlanRequest,
    *,
    gpu: str,
    cluster_file: str | None,
    proxy_layers: int | None,
    proxy_width: int | None,
    on_cpu: bool,
) -> PlanTrial:
    """The plan of the flags (after `trial_request`), checked, with its prediction on `gpu` /
    `cluster_file` and, for a proxy, the full / proxy time ratio."""
    plan = _checked_plan(spec, gpus, seq, req, on_cpu=on_cpu)
    cl = resolve_cluster(gpu, None, cluster_file)
    est = estimate(plan, spec, cl, num_gpus=gpus, seq_len=seq)
    predicted = {
        STEP_TIME_S: float(est.step_time_s),
        PEAK_MEMORY_BYTES: float(est.peak_memory_bytes),
        "cluster": cl.name or cl.gpu.key,
    }
    proxy, ratio = None, None
    if proxy_layers or proxy_width:
        proxy = {"num_layers": proxy_layers} if proxy_layers else {"width_divisor": proxy_width}
        if proxy_layers and proxy_layers % (plan.pp * plan.vpp):
            raise InputError(f"--proxy-layers must be a multiple of pp*vpp ({plan.pp * plan.vpp}) to keep the split")
        small = estimate(plan, spec.scaled(**proxy), cl, num_gpus=gpus, seq_len=seq)
        ratio = float(est.step_time_s / small.step_time_s)
    return PlanTrial(spec, plan, gpus, seq, cl, predicted, proxy, ratio)


def write_sbatch(
    t: PlanTrial,
    key: str,
    path: Path,
    run_dir: Path,
    *,
    nnodes: int,
    nproc: int,
    steps: int,
    warmup: int,
    timeout: float,
) -> Path:
    """Write the sbatch script of the trial to `path` and its run file next to it; return the run file."""
    from autopar.measured.sbatch import sbatch_script

    spec_path = path.with_suffix(".run.json")
    configs = [
        TrialConfig(
            name=key,
            model=t.model,
            plan=t.plan.to_dict(),
            scale=t.proxy,
            seq_len=t.seq_len,
            steps=warmup + steps + 1,
            warmup=warmup,
            device="auto",
        )
    ]  # + the byte-counting step
    # the #SBATCH lines are the export's (autopar.quoting.sbatch_directives); rendered before
    # anything is written, so a path that cannot go into a script leaves no file behind
    script = sbatch_script(
        nnodes=nnodes,
        nproc=nproc,
        minutes=max(5, int(timeout // 60) + 5),
        python="python",
        spec=spec_path.resolve(),
        out=(run_dir / "trials" / f"{key}.result.json").resolve(),
    )
    spec_path.write_text(dumps({"trials": [c.to_dict() for c in configs]}, indent=1))
    path.write_text(script, encoding="utf-8")
    return spec_path


def check_local_fit(t: PlanTrial, nproc: int, max_local_ranks: int | None) -> None:
    """Refuse, before anything is allocated, a trial this machine cannot hold: more ranks than it
    may start, or more memory per rank (predicted on this machine's `local` profile) than it has
    for a trial (autopar.measured.resources)."""
    from autopar.measured.resources import detect, local_limits

    here = t.cluster if t.cluster.gpu.key == "local" else resolve_cluster("local")  # the trial runs on this machine
    spec = t.spec if t.proxy is None else t.spec.scaled(**t.proxy)
    peak_bytes = float(estimate(t.plan, spec, here, num_gpus=t.num_gpus, seq_len=t.seq_len).peak_memory_bytes)
    limits = local_limits(detect(use_gpus=False), "cpu", max_local_ranks)
    if nproc > limits.max_ranks:
        raise InputError(
            f"this trial starts {nproc} ranks here and this machine runs at most {limits.max_ranks} "
            f"({limits.why}); add --max-local-ranks {nproc} to oversubscribe the cores, split it with "
            f"--nnodes, or write a cluster job with --emit-slurm"
        )
    if not limits.memory_fits(nproc, peak_bytes):
        raise InputError(
            f"this trial needs {peak_bytes / GIB:.2f} GiB per rank and this machine allows "
            f"{limits.memory_text(nproc)}; run a proxy (--proxy-layers, --proxy-width), a smaller "
            f"--model, or write a cluster job with --emit-slurm"
        )
