"""Trials on a SLURM cluster: `run_job` submits the trial's sbatch script (autopar.measured.sbatch;
`autopar trial --emit-slurm` writes the same one), follows the job and collects its result; imports
no torch.

`run_job(trials, nproc, ...)` writes the run file and `job.sbatch` into the trial's work directory
(on a file system the cluster shares: the job writes its result and step records there), submits
it with `sbatch --parsable`, records the job id in `slurm.job` with a digest of what it runs, then
polls `squeue` (state) and `sacct` (final state and exit code once the job has left the queue).
Per-step records (`progress.jsonl`) are handed to `on_progress` as they appear, so the pruner can
stop a trial mid-run. The trial timeout counts from the moment the job runs (the queue wait has its
own limit, `queue_timeout_s`); on timeout, on a prune, and when autopar is interrupted (SIGINT /
SIGTERM, through autopar.measured.hygiene) the job is cancelled with `scancel`.

Resume: a rerun of the same trial finds `slurm.job`. A job still pending or running, with the same
digest, is adopted (followed, not submitted again); one that completed with a complete result is
collected as it is; anything else is submitted afresh. A SIGKILLed autopar cannot cancel its job:
the job runs on, and the rerun adopts it.

Outcomes are the launcher's (autopar.measured.launcher): ok / teardown-abort (complete
result), oom (SLURM's OUT_OF_MEMORY or an allocation failure in the log), timeout (ours, or
SLURM's time limit), crash (failed, cancelled by someone else, or no complete result), pruned.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import InputError
from autopar.json_out import dumps
from autopar.measured import hygiene
from autopar.measured.config import TrialConfig
from autopar.measured.launcher import PROGRESS_FILE, LaunchResult, ProgressReader, classify, read_result
from autopar.measured.sbatch import sbatch_script

__all__ = ["SlurmOptions", "cancel", "job_state", "run_export_job", "run_job", "sbatch_script"]

JOB_FILE = "slurm.job"
SCRIPT = "job.sbatch"
#: squeue states of a job not yet finished
ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "PREEMPTED",
    "RESV_DEL_HOLD",
    "REQUEUE_FED",
}
RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
#: neither squeue nor sacct answered (the controller busy or restarting): asked again, this many
#: times in a row at most before the job is given up as lost
QUERY_FAILED = "QUERY_FAILED"
MAX_QUERY_FAILURES = 30


@dataclass(frozen=True)
class SlurmOptions:
    """How trials go to the cluster (`--launcher slurm`)."""

    gpus_per_node: int
    python: str = sys.executable  # the interpreter on the compute nodes (a shared file system)
    sbatch_args: tuple[str, ...] = ()  # e.g. ("--partition=gpu", "--account=ml")
    poll_s: float = 2.0
    queue_timeout_s: float = 3600.0  # longest wait in the queue before the job is cancelled
    gpus: bool = True  # GPU nodes (False: CPU nodes, e.g. trials of the `local` profile)

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise InputError(f"SLURM nodes need at least 1 GPU, got {self.gpus_per_node}; set --gpus-per-node")

    def nodes(self, nproc: int) -> tuple[int, int]:
        """(nodes, ranks per node) of an `nproc`-rank trial."""
        nnodes = max(1, math.ceil(nproc / self.gpus_per_node))
        if nproc % nnodes:
            raise InputError(
                f"a {nproc}-rank trial does not split evenly over {nnodes} nodes of "
                f"{self.gpus_per_node} GPUs; set --gpus-per-node to a divisor of {nproc}"
            )
        return nnodes, nproc // nnodes


def _run(cmd: list[str], timeout: float = 60.0, env_in: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A SLURM client command; `env_in` is the environment sbatch hands to the job (default this one)."""
    env = {
        k: v
        for k, v in (os.environ if env_in is None else env_in).items()
        if k not in (hygiene.WATCH_ENV, hygiene.LAUNCH_ENV)
    }
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise InputError(
            f"`{cmd[0]}` is not on PATH; --launcher slurm needs the SLURM client commands "
            f"(sbatch, squeue, sacct, scancel)"
        ) from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} timed out")


def job_state(job: str) -> tuple[str, str]:
    """(state, exit code "N:S") of a job: squeue while queued or running, sacct once it has left;
    ("UNKNOWN", "") when neither knows it, (QUERY_FAILED, "") when neither answered."""
    q = _run(["squeue", "-h", "-j", job, "-o", "%T"])
    state = q.stdout.strip().splitlines()[0].strip().upper() if q.returncode == 0 and q.stdout.strip() else ""
    if state in ACTIVE:
        return state, ""
    a = _run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode"])
    for line in a.stdout.strip().splitlines():
        parts = line.strip().split("|")
        if parts and parts[0]:
            return parts[0].split()[0].upper(), parts[1] if len(parts) > 1 else ""
    if q.returncode != 0 and a.returncode != 0:
        return QUERY_FAILED, ""
    return state or "UNKNOWN", ""


def cancel(job: str) -> None:
    _run(["scancel", job], timeout=30)


def _digest(*texts: str) -> str:
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]


def _read_job(workdir: Path) -> tuple[str, str]:
    try:
        job, _, digest = (workdir / JOB_FILE).read_text().strip().partition(" ")
        return job, digest
    except OSError:
        return "", ""


def _exit_code(code: str) -> int | None:
    head = code.split(":")[0]
    return int(head) if head.isdigit() else None


def run_job(
    trials: list[TrialConfig],
    nproc: int,
    options: SlurmOptions,
    *,
    workdir: Path,
    timeout_s: float,
    worker_args: list[str] | None = None,
    on_progress: Callable[[dict], bool] | None = None,
    job_name: str = "autopar-trial",
    log: Callable[[str], None] | None = None,
) -> LaunchResult:
    """Run the trials as one SLURM job of `nproc` ranks (see the module docstring); never raises on
    a failed job (failures are data), only when the SLURM commands are missing."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    spec, out, progress = workdir / "run.json", workdir / "result.json", workdir / PROGRESS_FILE
    spec_text = dumps({"trials": [t.to_dict() for t in trials]}, indent=1)
    nnodes, per_node = options.nodes(nproc)
    args = list(worker_args or []) + (["--progress", str(progress)] if on_progress else [])
    script = sbatch_script(
        nnodes=nnodes,
        nproc=per_node,
        minutes=max(5, int(timeout_s // 60) + 5),
        python=options.python,
        spec=spec,
        out=out,
        worker_args=args,
        job_name=job_name,
        pythonpath=str(Path(__file__).resolve().parents[2]),
        gpus=options.gpus,
    )
    digest = _digest(spec_text, script)
    say = log or (lambda s: None)
    job, state, collected = _resume(workdir, digest, out, say)
    if collected is not None:
        return collected
    cmd = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name}",
        f"--output={workdir / 'slurm-%j.out'}",
        f"--chdir={workdir}",
        *options.sbatch_args,
        str(workdir / SCRIPT),
    ]
    if not job:
        spec.write_text(spec_text)
        (workdir / SCRIPT).write_text(script)
        out.unlink(missing_ok=True)
        progress.unlink(missing_ok=True)
        job, failed = _submit(cmd, workdir, digest)
        if failed is not None:
            return failed
        say(f"  submitted SLURM job {job} ({nnodes} node{'s' * (nnodes > 1)} x {per_node} ranks)")
        state = "PENDING"
    records, state, code, wall, timed_out, stopped, queued = _watch(
        job, state, options, timeout_s, progress, on_progress
    )
    return _finish(
        job, state, code, out, workdir, records, wall, timed_out=timed_out, stopped=stopped, cmd=cmd, queued=queued
    )


def _resume(workdir: Path, digest: str, out: Path, say: Callable[[str], None]) -> tuple[str, str, LaunchResult | None]:
    """The job an earlier run submitted for this trial (`slurm.job`): (job id, state, None) to adopt
    one still queued or running with the same `digest`; (job id, state, result) for one that
    completed with a complete result; ("", state, None) otherwise, after cancelling an active job
    that runs another trial definition."""
    job, old_digest = _read_job(workdir)
    if not job:
        return "", "", None
    state, code = job_state(job)
    if state in ACTIVE and old_digest == digest:
        say(f"  adopting SLURM job {job} ({state.lower()}), submitted by an earlier run")
        return job, state, None
    if state == "COMPLETED" and old_digest == digest and _complete(out):
        say(f"  collecting SLURM job {job}: it completed while autopar was away")
        return job, state, _finish(job, state, code, out, workdir, [], 0.0, timed_out=False, stopped=False, cmd=[])
    if state in ACTIVE:
        cancel(job)  # ours, but for another trial definition
    return "", state, None


def _submit(
    cmd: list[str], workdir: Path, digest: str, env: dict[str, str] | None = None
) -> tuple[str, LaunchResult | None]:
    """Submit the job script (`cmd`: the sbatch command, `env`: the job's environment) and record
    its id with `digest` in `slurm.job`: (job id, None), or ("", the crash result) when sbatch fails."""
    sub = _run(cmd, env_in=env)
    job = sub.stdout.strip().split(";")[0].strip()
    if sub.returncode != 0 or not job.isdigit():
        return "", LaunchResult(
            outcome="crash",
            returncode=sub.returncode,
            wall_s=0.0,
            result=None,
            command=cmd,
            stderr_tail=sub.stderr[-2000:],
            reasons=[f"sbatch failed: {(sub.stderr or sub.stdout).strip()[:300]}"],
        )
    (workdir / JOB_FILE).write_text(f"{job} {digest}")
    return job, None


def _watch(
    job: str,
    state: str,
    options: SlurmOptions,
    timeout_s: float,
    progress: Path,
    on_progress: Callable[[dict], bool] | None,
    reader=None,
) -> tuple:
    """Follow a submitted job until it ends, its progress asks to stop (the pruner), or it runs past
    `timeout_s` (or queues past the queue timeout): (progress records, state, exit code, wall
    seconds, timed out, stopped, never ran). The records come from the `progress` file, or from
    `reader` (a trainer's log). SIGINT/SIGTERM scancel it (autopar.measured.hygiene)."""
    handle = hygiene.register(f"SLURM job {job}", lambda: cancel(job))
    reader = (reader or ProgressReader(progress)) if on_progress else None
    records: list[dict] = []
    t_submit = time.monotonic()
    t_run = time.monotonic() if state in RUNNING else None
    timed_out = stopped = False
    code = ""
    failures = 0
    try:
        while True:
            if reader is not None:
                assert on_progress is not None  # a reader is made only for a callback
                for rec in reader.read():
                    records.append(rec)
                    if on_progress(rec):
                        stopped = True
                        break
            if stopped:
                cancel(job)
                break
            state, code = job_state(job)
            now = time.monotonic()
            failures = failures + 1 if state == QUERY_FAILED else 0
            if state in RUNNING and t_run is None:
                t_run = now
            if state not in ACTIVE and (state != QUERY_FAILED or failures >= MAX_QUERY_FAILURES):
                break
            if (t_run is not None and now - t_run > timeout_s) or (
                t_run is None and now - t_submit > options.queue_timeout_s
            ):
                timed_out = True
                cancel(job)
                break
            time.sleep(options.poll_s)
    finally:
        hygiene.unregister(handle)
    if reader is not None and not stopped:
        assert on_progress is not None  # a reader is made only for a callback
        for rec in reader.read():
            records.append(rec)
            on_progress(rec)
    return records, state, code, time.monotonic() - (t_run or t_submit), timed_out, stopped, t_run is None


def _complete(out: Path) -> bool:
    return bool((read_result(out) or {}).get("complete"))


def _finish(
    job: str,
    state: str,
    code: str,
    out: Path,
    workdir: Path,
    records: list[dict],
    wall: float,
    *,
    timed_out: bool,
    stopped: bool,
    cmd: list[str],
    queued: bool = False,
) -> LaunchResult:
    result = read_result(out)
    logs = ""
    for p in sorted(workdir.glob(f"slurm-{job}.out")):
        logs = p.read_text(errors="replace")[-20_000:]
    rc = _exit_code(code)
    if stopped:
        outcome, reasons = "pruned", [f"stopped by the caller after {len(records)} step record(s); scancel {job}"]
    elif timed_out:
        outcome, reasons = (
            "timeout",
            [
                f"SLURM job {job} "
                + ("still queued after the queue timeout" if queued else "killed after the timeout")
                + "; scancel"
            ],
        )
    elif state == "OUT_OF_MEMORY":
        outcome, reasons = "oom", [f"SLURM job {job}: out of memory"]
    elif state == "TIMEOUT" and not (result and result.get("complete")):
        outcome, reasons = "timeout", [f"SLURM job {job} reached its time limit"]
    else:
        outcome, reasons = classify(rc if rc is not None else (0 if state == "COMPLETED" else 1), False, result, logs)
        if outcome == "crash" and state == QUERY_FAILED:
            reasons = [f"SLURM job {job}: squeue and sacct stopped answering; the job may still run (scancel {job})"]
        elif outcome == "crash" and state not in ("COMPLETED", "FAILED", "UNKNOWN"):
            reasons = [f"SLURM job {job} ended {state.lower()}"] + reasons
    return LaunchResult(
        outcome=outcome,
        returncode=rc,
        wall_s=wall,
        result=result,
        command=cmd + [f"# job {job}"],
        stdout_tail=logs,
        reasons=reasons,
        progress=records,
    )


def run_export_job(
    script: Path,
    options: SlurmOptions,
    *,
    workdir: Path,
    timeout_s: float,
    env: dict[str, str],
    on_progress: Callable[[dict], bool] | None = None,
    reader=None,
    job_name: str = "autopar-trial",
    log: Callable[[str], None] | None = None,
    identity: str = "",
) -> LaunchResult:
    """Submit an export's own `launch_slurm.sbatch` (the user's trainer, autopar.measured.own_run)
    with `env` as the job's environment, follow it as `run_job` does (the pruner through `reader`,
    the timeout, scancel on SIGINT/SIGTERM) and return how it ended; its output goes to
    `workdir/slurm-<job>.out`. A rerun adopts the job it finds still queued or running for the same
    script and `identity` (what else decides the run: the trainer's location), and collects one
    that completed."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    digest = _digest(Path(script).read_text(), identity)
    say = log or (lambda s: None)
    cmd = ["sbatch", "--parsable", f"--job-name={job_name}", f"--output={workdir / 'slurm-%j.out'}"]
    cmd += [f"--chdir={Path(script).parent}", *options.sbatch_args, str(script)]
    job, old = _read_job(workdir)
    state = ""
    if job:
        state, code = job_state(job)
        if old == digest and state in ACTIVE:
            say(f"  adopting SLURM job {job} ({state.lower()}), submitted by an earlier run")
        elif old == digest and state == "COMPLETED":
            say(f"  collecting SLURM job {job}: it completed while autopar was away")
            return _export_result(job, state, code, 0.0, cmd, timed_out=False, stopped=False)
        else:
            if state in ACTIVE:
                cancel(job)  # ours, but for another script
            job = ""
    if not job:
        for old_log in workdir.glob("slurm-*.out"):
            old_log.unlink()
        job, failed = _submit(cmd, workdir, digest, env)
        if failed is not None:
            return failed
        say(f"  submitted SLURM job {job} (the export's launch_slurm.sbatch)")
        state = "PENDING"
    records, state, code, wall, timed_out, stopped, queued = _watch(
        job, state, options, timeout_s, workdir / PROGRESS_FILE, on_progress, reader
    )
    return _export_result(job, state, code, wall, cmd, timed_out=timed_out, stopped=stopped, records=records)


def _export_result(
    job: str, state: str, code: str, wall: float, cmd: list[str], *, timed_out: bool, stopped: bool, records=()
) -> LaunchResult:
    """How an export's job ended, in the launcher's outcomes (its log says the rest)."""
    rc = _exit_code(code)
    if stopped:
        outcome, reasons = "pruned", [f"stopped by the caller; scancel {job}"]
    elif timed_out or state == "TIMEOUT":
        outcome, reasons = "timeout", [f"SLURM job {job} ran past the trial timeout or its time limit"]
    elif state == "OUT_OF_MEMORY":
        outcome, reasons = "oom", [f"SLURM job {job}: out of memory"]
    elif state == "COMPLETED" and (rc or 0) == 0:
        outcome, reasons = "ok", []
    else:
        outcome, reasons = "crash", [f"SLURM job {job} ended {state.lower() or 'unknown'}"]
    return LaunchResult(
        outcome=outcome,
        returncode=rc if rc is not None else (0 if outcome == "ok" else 1),
        wall_s=wall,
        result=None,
        command=cmd + [f"# job {job}"],
        reasons=reasons,
        progress=list(records),
    )
