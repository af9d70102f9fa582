"""The measured stage of `autopar search --trials K`: where the trials run (this machine, as they are
or as proxies; or the cluster through SLURM), the Optuna stage itself (autopar.measured.trials), and
its terminal summary. Imports no torch: trials run in their own processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from autopar.errors import InputError, quoted
from autopar.measured.own_trainer import NEEDS_MEASURE_WITH, TrainerHome
from autopar.measured.placement import ProxyOptions  # not .proxy: that one loads the cost model
from autopar.measured.resources import LocalLimits
from autopar.spec.hardware import LOCAL as LOCAL_KEY
from autopar.spec.hardware import ClusterSpec

LAUNCHERS = ("local", "slurm")
#: how much slower than its uncalibrated prediction a CPU trial's step runs (README: 2.5-6x), for
#: the proxy's time budget; GPUs run closer to the model
CPU_SLOWDOWN, GPU_SLOWDOWN = 6.0, 2.0
#: share of the trial timeout the proxy's predicted steps may take (the rest: start-up, the model's
#: build, the memory trial's tracking)
TIME_SHARE = 0.5


@dataclass(frozen=True)
class TrialOptions:
    """Where and how the measured stage runs its trials (the trial options of `autopar search`)."""

    launcher: str = "local"  # local | slurm
    max_local_ranks: int | None = None  # None: the GPUs, or the CPU cores
    proxy: ProxyOptions = field(default_factory=ProxyOptions)
    sbatch_args: tuple[str, ...] = ()
    slurm_python: str | None = None  # None: this interpreter (a file system the cluster shares)
    queue_timeout_s: float = 3600.0
    poll_s: float = 2.0
    #: the user's own trainer, located (autopar.measured.own_trainer); None: autopar's built-in model
    trainer: TrainerHome | None = None
    gpu_hours: float | None = None  # the most GPU-hours (rank-hours on CPUs) the stage may spend

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise InputError(
                f"unknown --launcher {quoted(self.launcher)}; choose local (this machine) or slurm (sbatch)"
            )
        if self.max_local_ranks is not None and self.max_local_ranks < 1:
            raise InputError(
                f"--max-local-ranks {self.max_local_ranks} must be at least 1; give the most ranks a "
                f"local trial may start, e.g. 2"
            )
        if self.launcher == "slurm" and self.max_local_ranks is not None:
            raise InputError("--max-local-ranks applies to --launcher local; drop it (SLURM jobs get the plan's GPUs)")


def trial_options(
    launcher: str = "local",
    max_local_ranks: int | None = None,
    proxy: bool = True,
    proxy_layers: int | None = None,
    proxy_width: int | None = None,
    proxy_seq: int | None = None,
    sbatch_args: str | None = None,
    measure_with: str | None = None,
    trainer_home: str | None = None,
    trainer_python: str | None = None,
    gpu_hours: float | None = None,
) -> TrialOptions:
    """TrialOptions from the command line (bad values: InputError; a trainer that cannot be found:
    InputError, before anything runs)."""
    import shlex

    if measure_with is None and (trainer_home or trainer_python):
        raise InputError(NEEDS_MEASURE_WITH)
    home = None
    if measure_with is not None:
        from autopar.measured.own_trainer import locate

        home = locate(measure_with, trainer_home, trainer_python)

    try:
        extra = tuple(shlex.split(sbatch_args or ""))
    except ValueError as e:
        raise InputError(
            f"--sbatch-args {quoted(sbatch_args)} cannot be split ({e}); quote it as one shell string"
        ) from None
    return TrialOptions(
        launcher=launcher,
        max_local_ranks=max_local_ranks,
        proxy=ProxyOptions(
            enabled=proxy, layers_per_stage=proxy_layers, width_divisor=proxy_width, seq_divisor=proxy_seq
        ),
        sbatch_args=extra,
        trainer=home,
        gpu_hours=gpu_hours,
    )


def step_budget(timeout_s: float, steps: int, warmup: int, device: str) -> float:
    """The most a proxy's predicted step may take here so that its trial (timed steps, warm-up, the
    byte-counting step and the 2-step memory trial) ends well within the timeout."""
    total = warmup + steps + 1 + 2
    return TIME_SHARE * timeout_s / (total * (CPU_SLOWDOWN if device == "cpu" else GPU_SLOWDOWN))


@dataclass
class _Where:
    """Where the trials run: the machine's limits (None on the cluster), the device, the hardware
    the proxies are priced on, what to do when a plan cannot run, a launcher (None: local torchrun)."""

    limits: LocalLimits | None
    device: str
    here: ClusterSpec
    fix: str
    text: str
    launch_fn: Callable | None = None
    slurm: object = None  # autopar.measured.slurm.SlurmOptions on the cluster


def _where(q, options: TrialOptions, log: Callable[[str], None]) -> _Where:
    """This machine (its ranks and memory) or the cluster through SLURM."""
    from autopar.measured.resources import detect, local_limits
    from autopar.spec.hardware import GIB, LOCAL, local_cluster

    on_cpu_profile = q.cluster.gpu.key == LOCAL
    if options.launcher == "local":
        machine = detect(use_gpus=not on_cpu_profile)
        device = "cuda" if machine.gpus and not on_cpu_profile else "cpu"
        limits = local_limits(machine, device, options.max_local_ranks)
        text = f"this machine ({machine.describe()}): at most {limits.max_ranks} rank(s) ({limits.why}), " + (
            f"{limits.memory_bytes_per_device / GIB:.1f} GiB for a trial's ranks"
            if device == "cpu"
            else f"{limits.memory_bytes_per_device / GIB:.0f} GiB per GPU"
        )
        return _Where(
            limits,
            device,
            local_cluster() if device == "cpu" else q.cluster,
            "use --launcher slurm to run it on the cluster",
            text,
        )
    from autopar.measured.slurm import SlurmOptions, run_job

    slurm = SlurmOptions(
        gpus_per_node=q.cluster.gpus_per_node,
        python=options.slurm_python or sys.executable,
        sbatch_args=options.sbatch_args,
        poll_s=options.poll_s,
        queue_timeout_s=options.queue_timeout_s,
        gpus=not on_cpu_profile,
    )

    def launch_fn(trials, nproc, *, timeout_s, workdir, worker_args=None, on_progress=None, **_):
        return run_job(
            trials,
            nproc,
            slurm,
            workdir=workdir,
            timeout_s=timeout_s,
            worker_args=worker_args,
            on_progress=on_progress,
            job_name=f"autopar-{Path(workdir).name}"[:64],
            log=log,
        )

    return _Where(
        None,
        "auto",
        q.cluster,
        "",
        f"the cluster through SLURM (sbatch, {q.cluster.gpus_per_node} GPUs per node)",
        launch_fn,
        slurm,
    )


def run_stage(
    result,
    spec,
    k: int,
    budget,
    rounds: int,
    steps: int,
    timeout: float,
    storage,
    out,
    study_name: str | None = None,
    options: TrialOptions | None = None,
) -> dict:
    """The measured stage over a search result, its log lines to `out`; figures into measured.json
    and search.json (written atomically: another worker may share the run directory); returns them."""
    from autopar.measured.hygiene import install_signal_handlers
    from autopar.measured.results import acceptance
    from autopar.measured.trials import run_measured

    options = options or TrialOptions()
    log = _StageLog(out)
    warmup = 1
    w = _where(result.question, options, log)
    if options.trainer is not None:
        measure, runnable, header = _own_trainer(result, options.trainer, w, steps=steps, timeout=timeout, log=log)
    else:
        planner, header = _planner(result.question, spec, options, w, steps=steps, warmup=warmup, timeout=timeout)
        measure, runnable = _trial_callables(result, planner, w, steps=steps, warmup=warmup, timeout=timeout)
    log.header.append(header)
    k, budget = _within_gpu_hours(result, w, k, budget, options.gpu_hours, timeout, log)
    install_signal_handlers()  # SIGINT/SIGTERM: kill the running trial (or scancel it), exit 130/143
    t0 = time.perf_counter()
    # another worker's trial ends within its timeout; one of another host silent far longer is dead
    stage = run_measured(
        result,
        measure,
        k,
        budget,
        rounds,
        storage=storage,
        log=log,
        study_name=study_name,
        stale_after_s=max(600.0, 4 * timeout),
        wait_s=timeout + 60,
        runnable=runnable,
    )
    figs = acceptance(result, stage) | {
        "wall_s_measured_stage": time.perf_counter() - t0,
        "launcher": options.launcher,
        "where": w.text,
    }
    _machine_notes(figs, stage, options, w.device)
    _save(result, stage, figs)
    return figs


class _StageLog:
    """The stage's log: each line to `out` at once, the header lines before the first one (a
    refusal before any line is one line alone)."""

    def __init__(self, out) -> None:
        self.out = out
        self.header: list[str] = []

    def __call__(self, msg: str) -> None:
        while self.header:
            print(self.header.pop(0), file=self.out, flush=True)
        print(msg, file=self.out, flush=True)


def _planner(q, spec, options: TrialOptions, w: _Where, *, steps: int, warmup: int, timeout: float):
    """Where each plan runs here (as it is, as a scaled-down proxy, or not at all), and the
    stage's header line saying so."""
    from autopar.measured.proxy import Planner
    from autopar.spec.question import Question

    popts = options.proxy
    if popts.step_budget_s is None and w.limits is not None:  # on the cluster, --trial-timeout alone bounds a trial
        popts = replace(popts, step_budget_s=step_budget(timeout, steps, warmup, w.device))
    planner = Planner(
        Question(model=spec, num_gpus=q.num_gpus, cluster=q.cluster, seq_len=q.seq_len),
        w.limits,
        popts,
        w.here,
        device=w.device,
        fix_hint=w.fix,
    )
    header = f"Measured stage on {w.text}; " + (
        "plans that do not fit run as scaled-down proxies (--no-proxy: not at all)"
        if popts.enabled
        else "plans that do not fit are not run (--no-proxy)"
    )
    return planner, header


def _own_trainer(result, home: TrainerHome, w: _Where, *, steps: int, timeout: float, log=None):
    """run_measured's callables for the user's own trainer (autopar.measured.own_run) and the
    stage's header line: what runs, where, for how many steps."""
    from autopar.measured.own_run import own_callables
    from autopar.measured.own_trainer import WARMUP

    if w.limits is not None:  # this machine
        on_gpu, ranks, why, script = w.limits.device == "cuda", w.limits.max_ranks, w.limits.why, "launch_torchrun.sh"
    else:  # the cluster: its nodes are the plans' hardware
        on_gpu, ranks, why, script = result.question.cluster.gpu.key != LOCAL_KEY, 1 << 30, "", "launch_slurm.sbatch"
    measure, runnable = own_callables(
        result, home, ranks, why, steps=steps, timeout=timeout, on_gpu=on_gpu, slurm=w.slurm, log=log
    )
    header = (
        f"Measured stage with {home.text}, on {w.text}: each plan exported for {WARMUP} warm-up + {steps} "
        f"timed steps on mock data, run by the export's {script}, its log parsed"
    )
    if on_gpu == (result.question.cluster.gpu.key == LOCAL_KEY):
        header += (
            f"; the plans are priced on {result.question.cluster.gpu.key}, so the runs rank them but do "
            f"not calibrate it ("
            + ("--gpu naming this machine's GPU prices them here)" if on_gpu else "--gpu local prices this machine)")
        )
    return measure, runnable, header


def _within_gpu_hours(
    result, w: _Where, k: int, budget, gpu_hours: float | None, timeout: float, log
) -> tuple[int, object]:
    """The stage's cost before it starts, and with --trial-gpu-hours the most trials that fit in it:
    each trial is priced at its ranks (here at most the machine's: a proxy runs on fewer) x the
    trial timeout, the most it can take; GPUs, or ranks on CPUs."""
    n = result.question.num_gpus if w.limits is None else min(result.question.num_gpus, w.limits.max_ranks)
    unit = "rank" if w.device == "cpu" else "GPU"
    trials = max(budget or k, k)
    worst = trials * n * timeout / 3600.0
    each = f"{n} {unit}s x at most {timeout:g} s"
    if gpu_hours is None:
        log.header.append(
            f"Cost: {trials} trial(s) x {each} = at most {worst:.2f} {unit}-hours (--trial-gpu-hours caps it)"
        )
        return k, budget
    most = int(gpu_hours * 3600.0 // (n * timeout))
    if most < 1:
        raise InputError(
            f"--trial-gpu-hours {gpu_hours:g} does not pay for one trial ({each} = {n * timeout / 3600:.2f} "
            f"{unit}-hours); raise it or lower --trial-timeout"
        )
    if most < trials:
        log.header.append(
            f"Cost: --trial-gpu-hours {gpu_hours:g} pays for {most} of the {trials} trials asked for "
            f"({each} each); measuring {most}"
        )
        return min(k, most), most
    log.header.append(
        f"Cost: {trials} trial(s) x {each} = at most {worst:.2f} {unit}-hours, within --trial-gpu-hours {gpu_hours:g}"
    )
    return k, budget


def _trial_callables(result, planner, w: _Where, *, steps: int, warmup: int, timeout: float):
    """run_measured's `measure(plan, predicted, on_step)` (one trial of the plan as the planner
    places it) and `runnable(plan, predicted)` (why it cannot run here, or None)."""
    from autopar.measured.measure import measure_placement
    from autopar.measured.trials import plan_key
    from autopar.spec.hardware import LOCAL

    q = result.question
    peak = q.cluster.gpu.peak_flops("bf16") / (2 if q.cluster.gpu.key == LOCAL else 1)
    workroot = Path(result.run_dir) / "trials" / "work"

    def measure(plan: dict, predicted: dict, on_step) -> dict:
        return measure_placement(
            planner.place(plan, predicted),
            predicted,
            steps=steps,
            warmup=warmup,
            timeout_s=timeout,
            workdir=workroot / plan_key(plan),
            peak_flops=peak,
            on_step=on_step,
            launch_fn=w.launch_fn,
        )

    def runnable(plan: dict, predicted: dict) -> str | None:
        p = planner.place(plan, predicted)
        return None if p.runnable else p.reason

    return measure, runnable


def _machine_notes(figs: dict, stage, options: TrialOptions, device: str) -> None:
    """What on this machine distorts the timings: more ranks than cores, other load."""
    cores = os.cpu_count() or 1
    ranks = [int((stage.docs[kk].get("nproc") or 0)) for kk in stage.order if kk in stage.docs]
    if options.launcher == "local" and device == "cpu" and ranks and max(ranks) > cores:
        figs["oversubscribed"] = (
            f"{max(ranks)} ranks on {cores} cores: the timings mostly measure CPU contention "
            f"and are not comparable with the cost model's one-core-per-rank profile"
        )
    try:
        figs["load_average"] = os.getloadavg()  # other work on the machine distorts CPU timings
    except OSError:
        pass


def _save(result, stage, figs: dict) -> None:
    """calibrated.yaml (when the stage calibrated), measured.json, and the figures in search.json."""
    from autopar.search.run_dir import write_measured

    calibrated = None
    if stage.calibration is not None:
        import yaml

        from autopar.calibration.calibrate import profile_dict

        calibrated = yaml.safe_dump(profile_dict(stage.calibration.cluster))
    write_measured(Path(result.run_dir), figs, calibrated)
