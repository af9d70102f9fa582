"""One short run of a plan with the user's own trainer (autopar.measured.own_trainer says where it
lives and why), its trial document, and the measured stage's two callables for it (`measure`,
`runnable`, as autopar.measured.trials takes them). Imports no torch."""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from autopar.errors import InputError
from autopar.figures import MFU, PEAK_MEMORY_BYTES, STEP_TIME_S, TOKENS_PER_S
from autopar.measured.launcher import run_command
from autopar.measured.measure import partial_summary
from autopar.measured.own_trainer import WARMUP, TrainerHome, free_port, launch_env, log_files, read_log
from autopar.measured.trainer_logs import LogContext, TrainerLog, parse_log, step_summary
from autopar.spec.hardware import LOCAL, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan

LAUNCH, SBATCH = "launch_torchrun.sh", "launch_slurm.sbatch"
#: what the bundled DeepSpeed script runs (autopar/trial/deepspeed_train.py: data parallel + ZeRO)
BUNDLED_SCRIPT_AXES = ("tp", "pp", "cp", "ep")


def export_short_run(
    home: TrainerHome,
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    seq_len: int,
    steps: int,
    recipes: tuple[tuple[str, str], ...] = (),
    port: int | None = None,
):
    """The trainer's export of `plan`, set for a `steps`-step run (ExportRefused: it cannot run it);
    `port`: the rendezvous port (None: the exporter's default)."""
    from autopar.export import ExportOptions, get_exporter

    options = ExportOptions(seq_len=seq_len, short_run_steps=steps, recipes=recipes)
    if port is not None:
        options = replace(options, master_port=port)
    return get_exporter(home.trainer).render(plan.with_(trainer=home.trainer), model, cluster, options)


def cannot_run(
    home: TrainerHome,
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    seq_len: int,
    max_ranks: int,
    ranks_why: str,
    recipes: tuple[tuple[str, str], ...] = (),
) -> str | None:
    """Why the trainer cannot run `plan` on this machine (None: it can): its capability table, the
    ranks here, and the bundled DeepSpeed script's axes."""
    try:
        export_short_run(home, plan, model, cluster, seq_len, 1, recipes)
    except InputError as e:  # ExportRefused included: the trainer's capability sentence
        return str(e)
    if plan.num_gpus > max_ranks:
        return (
            f"needs {plan.num_gpus} ranks and this machine runs at most {max_ranks} ({ranks_why}); run the "
            f"stage on a machine with {plan.num_gpus} GPUs"
        )
    if home.bundled_script and any(getattr(plan, a) > 1 for a in BUNDLED_SCRIPT_AXES):
        return (
            "autopar's DeepSpeed script runs data parallel with ZeRO only (tp = pp = cp = ep = 1); set "
            "DEEPSPEED_SCRIPT to your Megatron-DeepSpeed pretrain_gpt.py for this plan"
        )
    return None


class LogSteps:
    """The trainer's step lines as they appear in its log (run_command's `reader`): each new step
    as a record {"index", "time_s", "timed"}; the log is re-read at most once a second, and only
    when it grew."""

    def __init__(self, workdir: Path, trainer: str, context: LogContext, warmup: int) -> None:
        self.workdir, self.trainer, self.context, self.warmup = Path(workdir), trainer, context, warmup
        self.seen, self.size, self.last = 0, -1, 0.0

    def read(self) -> list[dict]:
        now = time.monotonic()
        size = sum(p.stat().st_size for p in log_files(self.workdir) if p.is_file())
        if size == self.size or now - self.last < 1.0:
            return []
        self.size, self.last = size, now
        steps = parse_log(self.trainer, read_log(self.workdir), self.context).steps
        new = [{"index": i, "time_s": t, "timed": i >= self.warmup} for i, (_, t) in enumerate(steps) if i >= self.seen]
        self.seen = max(self.seen, len(steps))
        return new


def measure_own(
    home: TrainerHome,
    plan_dict: dict,
    predicted: dict,
    *,
    model: ModelSpec,
    cluster: ClusterSpec,
    seq_len: int,
    steps: int,
    timeout_s: float,
    workdir: Path,
    on_gpu: bool,
    recipes: tuple[tuple[str, str], ...] = (),
    warmup: int = WARMUP,
    on_step: Callable[[int, float], bool] | None = None,
    slurm=None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Export the plan for `warmup + steps` steps, run the export's launch script here, parse the
    trainer's log: the trial document (never raises on a failed run: failures are data).
    `on_step(index, time_s)` sees each timed step as the trainer logs it and returns True to stop
    the run (the pruner): the document then says "pruned", with the steps that ran. With `slurm`
    (autopar.measured.slurm.SlurmOptions) the export's launch_slurm.sbatch runs on the cluster."""
    plan = ParallelPlan.from_dict(plan_dict)
    workdir = Path(workdir)
    head: dict[str, Any] = {
        "name": plan.describe(),
        "plan": plan_dict,
        "model": model.name,
        "nproc": plan.num_gpus,
        "predicted": predicted,
        "kind": "full",
        "measured_with": home.trainer,
        "trainer": {"name": home.trainer, "version": home.version, "python": home.python} | home.env,
        "started_at": time.time(),
        "environment": {"trainer": home.text},
        "measured": {},
        "cross_hardware": (cluster.gpu.key == LOCAL) == on_gpu,  # measured on other hardware than priced
    }
    out = workdir / "export"
    # here, a port free now (two trials never share one); on the cluster the exporter's, whose nodes
    # the job has to itself (sbatch --exclusive), so that a rerun finds the same script
    port = None if slurm is not None else free_port()
    export_short_run(home, plan, model, cluster, seq_len, warmup + steps, recipes, port).write(out)
    context = LogContext(global_batch_size=plan.global_batch_size, seq_len=seq_len, num_gpus=plan.num_gpus)
    timed: list[float] = []

    def progress(rec: dict) -> bool:
        if not rec["timed"] or on_step is None:
            return False
        timed.append(float(rec["time_s"]))
        return bool(on_step(len(timed) - 1, timed[-1]))

    run = _Run(home, out, workdir, timeout_s, LogSteps(workdir, home.trainer, context, warmup), on_gpu)
    res, head["command"] = run.launch(progress if on_step is not None else None, slurm, log)
    job_logs = sorted(workdir.glob("slurm-*.out"))  # a SLURM job's output, else the local stdout
    log_path = job_logs[-1] if job_logs else workdir / "stdout.log"
    head |= {"wall_s": res.wall_s, "log": str(log_path), "returncode": res.returncode}
    if res.outcome == "pruned":
        return head | {
            "status": "pruned",
            "outcome": "pruned",
            "reasons": [f"pruned after {len(timed)} of {steps} timed steps"],
            "measured": partial_summary(timed, steps) if timed else {},
        }
    trainer_log = parse_log(home.trainer, read_log(workdir), context)
    status, reasons = _status(res.outcome, res.returncode, trainer_log, warmup, log_path)
    if slurm is not None and status != "ok":  # what SLURM said of the job
        reasons += [r for r in res.reasons if r not in reasons]
    doc = head | {"status": status, "outcome": status, "reasons": reasons, "steps_logged": len(trainer_log.steps)}
    summary = step_summary(trainer_log, warmup) if status == "ok" else None  # a failed run's steps time nothing
    if summary:
        doc["measured"] = _measured(summary, trainer_log, plan, seq_len, predicted, home.trainer, on_gpu)
        m = doc["measured"]
        if predicted and m.get(PEAK_MEMORY_BYTES):
            doc["errors"] = {
                "step_time": predicted[STEP_TIME_S] / m[STEP_TIME_S] - 1,
                "peak_memory": predicted[PEAK_MEMORY_BYTES] / m[PEAK_MEMORY_BYTES] - 1,
            }
    return doc


class _Run:
    """One launch of an export: here through its launch_torchrun.sh, or on the cluster through its
    launch_slurm.sbatch; the trainer's log read by `reader` as it grows."""

    def __init__(self, home: TrainerHome, out: Path, workdir: Path, timeout_s: float, reader, on_gpu: bool):
        # absolute: the launch runs in the export's (or the trainer's) directory, not the caller's
        self.out, self.workdir = out.resolve(), workdir.resolve()
        self.home, self.timeout_s, self.reader = home, timeout_s, reader
        self.env = launch_env(home, on_gpu)

    def launch(self, on_progress, slurm, log):
        """(the launcher's result, the command that reruns it by hand)."""
        home, out = self.home, self.out
        if slurm is not None:
            from autopar.measured.slurm import run_export_job

            res = run_export_job(
                out / SBATCH,
                slurm,
                workdir=self.workdir,
                timeout_s=self.timeout_s,
                env=self.env,
                on_progress=on_progress,
                reader=self.reader,
                job_name=f"autopar-{home.trainer}",
                identity=repr(sorted(home.env.items())),
                log=log,
            )
            return res, f"cd {shlex.quote(str(out))} && sbatch {SBATCH}  # with {' '.join(home.env)} set"
        res = run_command(
            # under autopar's guard: the trainer's ranks cannot watch for a search that died
            [sys.executable, "-m", "autopar.measured.guard", "bash", str(out / LAUNCH)],
            out / "no-result.json",  # the trainer writes no autopar result: its log is the result
            timeout_s=self.timeout_s,
            workdir=self.workdir,
            env=self.env,
            cwd=Path(home.cwd) if home.cwd else out,
            on_progress=on_progress,
            reader=self.reader,
        )
        # how to rerun it by hand: the trainer's variables, then the export's launch script
        words = [f"{k}={v}" for k, v in home.env.items()] + ["NODE_RANK=0", "bash", LAUNCH]
        return res, f"cd {shlex.quote(str(out))} && " + shlex.join(words)


def _status(outcome: str, returncode: int | None, log: TrainerLog, warmup: int, log_path: Path):
    """The trial's status and reasons from the launch's outcome and the trainer's own lines."""
    if log.failure == "oom":
        return "oom", [f"does not fit: {log.error_line}"]
    if outcome == "oom":  # the host's memory (SLURM's OUT_OF_MEMORY, the kernel's OOM kill)
        return "oom", [f"does not fit: the job ran out of host memory (log: {log_path})"]
    if outcome == "timeout":
        return "timeout", ["killed after the trial timeout (--trial-timeout)"] + (
            [f"last error: {log.error_line}"] if log.error_line else []
        )
    if log.failure == "crash" or returncode != 0:
        return "crash", [f"fails: {log.error_line or f'exit code {returncode}'} (log: {log_path})"]
    if len(log.steps) <= warmup:
        return "crash", [
            f"fails: the trainer exited 0 but printed {len(log.steps)} step line(s) autopar reads, "
            f"{warmup} of them warm-up (log: {log_path})"
        ]
    return "ok", []


def _measured(
    summary: dict, log: TrainerLog, plan: ParallelPlan, seq_len: int, predicted: dict, trainer: str, on_gpu: bool
) -> dict:
    """The measured figures in the built-in trials' keys, plus the trainer's own throughput."""
    m = dict(summary)
    step = m[STEP_TIME_S]
    m[TOKENS_PER_S] = plan.global_batch_size * seq_len / step
    if predicted.get(MFU) and predicted.get(STEP_TIME_S):  # the same model FLOPs per step
        m[MFU] = predicted[MFU] * predicted[STEP_TIME_S] / step
    if log.peak_memory_bytes:
        m[PEAK_MEMORY_BYTES] = float(log.peak_memory_bytes)
        m["memory_method"] = log.memory_method
    if log.tflops_per_gpu:
        m["trainer_tflops_per_gpu"] = statistics.median(log.tflops_per_gpu[-len(m["step_times_s"]) :])
    if log.tokens_per_s_per_gpu:
        m["trainer_tokens_per_s_per_gpu"] = statistics.median(log.tokens_per_s_per_gpu[-len(m["step_times_s"]) :])
    if trainer == "deepspeed" and not on_gpu and PEAK_MEMORY_BYTES in m:
        # DeepSpeed's CPU accelerator reports the process RSS as memory_allocated (deepspeed 0.19.8
        # accelerator/cpu_accelerator.py L153-156: get_rss), not tensor bytes: kept, not fitted to
        m["process_peak_bytes"] = m.pop(PEAK_MEMORY_BYTES)
        m["memory_method"] = "process RSS (DeepSpeed's CPU accelerator)"
    return m


def own_callables(
    result,
    home: TrainerHome,
    max_ranks: int,
    ranks_why: str,
    *,
    steps: int,
    timeout: float,
    on_gpu: bool,
    slurm=None,
    log: Callable[[str], None] | None = None,
) -> tuple[Callable, Callable]:
    """The stage's `measure(plan, predicted, on_step)` and `runnable(plan, predicted)` for the trainer
    (its steps reach the pruner as the trainer logs them)."""
    from autopar.measured.trials import plan_key

    q = result.question
    recipes = tuple(sorted((q.recipes or {}).items())) if isinstance(q.recipes, dict) else tuple(q.recipes or ())
    workroot = Path(result.run_dir) / "trials" / "work"

    def measure(plan: dict, predicted: dict, on_step) -> dict:
        return measure_own(
            home,
            plan,
            predicted,
            model=q.model,
            cluster=q.cluster,
            seq_len=q.seq_len,
            steps=steps,
            timeout_s=timeout,
            workdir=workroot / plan_key(plan),
            on_gpu=on_gpu,
            recipes=recipes,
            on_step=on_step,
            slurm=slurm,
            log=log,
        )

    def runnable(plan: dict, predicted: dict) -> str | None:
        p = ParallelPlan.from_dict(plan)
        return cannot_run(home, p, q.model, q.cluster, q.seq_len, max_ranks, ranks_why, recipes)

    return measure, runnable


def trial_with(home: TrainerHome, spec: ModelSpec, gpus: int, seq: int, req, gpu: str, cluster_file, run, run_dir):
    """`autopar trial --measure-with`: one plan of the flags (`req`, a PlanRequest), checked, priced on
    `gpu` / `cluster_file`, run with the trainer here: (trial document, its file)."""
    from autopar.calibration.estimate import estimate
    from autopar.measured.resources import detect, local_limits
    from autopar.measured.trials import plan_key
    from autopar.search.run_dir import write_trial_doc
    from autopar.spec.resolve import resolve_cluster, resolve_plan

    steps, warmup, timeout = run
    plan = resolve_plan(spec, gpus, seq, req)
    problems = plan.problems(spec, num_gpus=gpus, seq_len=seq)
    if problems:
        raise InputError("invalid plan: " + "; ".join(problems))
    cluster = resolve_cluster(gpu, None, cluster_file)
    machine = detect()
    limits = local_limits(machine, machine.kind)
    why = cannot_run(home, plan, spec, cluster, seq, limits.max_ranks, limits.why)
    if why:
        raise InputError(why)
    est = estimate(plan, spec, cluster, num_gpus=gpus, seq_len=seq)
    predicted: dict[str, Any] = {STEP_TIME_S: float(est.step_time_s), MFU: float(est.mfu)}
    predicted |= {PEAK_MEMORY_BYTES: float(est.peak_memory_bytes), "cluster": cluster.name or cluster.gpu.key}
    key = plan_key(plan.to_dict())
    doc = measure_own(
        home,
        plan.to_dict(),
        predicted,
        model=spec,
        cluster=cluster,
        seq_len=seq,
        steps=steps,
        timeout_s=timeout,
        workdir=Path(run_dir) / "trials" / "work" / key,
        on_gpu=machine.kind == "cuda",
        warmup=warmup,
    ) | {"key": key}
    return doc, write_trial_doc(doc, Path(run_dir) / "trials")
