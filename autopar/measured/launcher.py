"""Launch trials under torchrun in a subprocess and classify the outcome; imports no torch.

`launch(trials, nproc)` writes the run file, runs
`python -m torch.distributed.run --standalone --nproc_per_node N -m autopar.trial.worker ...`
in its own session (process group), and on timeout kills the whole group and every process of the
launch (torchrun puts its workers in sessions of their own: they are found by the launch token in
their environment, autopar.measured.hygiene), so no process outlives the call. While it runs, the
launch is registered with autopar.measured.hygiene, whose SIGINT/SIGTERM handlers kill it; torchrun
dies with the launching process (PR_SET_PDEATHSIG) and each worker's watchdog ends the worker when
torchrun or the launching process is gone (SIGKILL). Outcomes:

- **ok**: exit 0 and the result document is complete;
- **teardown-abort**: the result document is complete, then the exit was non-zero (gloo may abort
  while its process group is torn down at interpreter exit): the measurements stand;
- **oom**: out of memory: a CUDA/CPU allocation failure in the logs or a trial error, or the
  kernel's OOM kill (SIGKILL without our timeout);
- **timeout**: still running after `timeout_s`; killed;
- **crash**: anything else: a trial raised (its error is in the result), or a worker died;
- **pruned**: the caller's progress callback asked to stop (a pruner judged the first steps too
  slow); killed.

Progress: with `on_progress`, the worker's rank 0 appends one JSON line per step to
`<workdir>/progress.jsonl` as it happens ({"trial", "name", "step", "time_s", "timed"}); the
launcher polls the file while torchrun runs and hands each new record to the callback, which
returns True to stop the run (the process group is killed as on timeout).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autopar.json_out import dumps
from autopar.measured import hygiene
from autopar.measured.config import TrialConfig
from autopar.measured.needs_torch import INSTALL_HINT, MISSING_MARKER
from autopar.spec.read_file import read_json

PROGRESS_FILE = "progress.jsonl"
#: seconds between looks at the progress file (a step of the smallest trials takes ~50 ms)
POLL_S = 0.1
_OOM_MARKERS = (
    "CUDA out of memory",
    "OutOfMemoryError",
    "std::bad_alloc",
    "DefaultCPUAllocator: can't allocate memory",
    "Cannot allocate memory",
)
#: what a gloo process group torn down at interpreter exit may print as it aborts
TEARDOWN_ABORT_MARKER = "terminate called without an active exception"


@dataclass
class LaunchResult:
    """What one launch produced: its outcome, the worker's result document (if any) and log tails."""

    outcome: str
    returncode: int | None
    wall_s: float
    result: dict | None
    command: list[str]
    stdout_tail: str = ""
    stderr_tail: str = ""
    reasons: list[str] = field(default_factory=list)
    progress: list[dict] = field(default_factory=list)  # the step records read, in order

    @property
    def succeeded(self) -> bool:
        return self.outcome in ("ok", "teardown-abort")

    @property
    def trials(self) -> list[dict]:
        return list((self.result or {}).get("trials", []))


def torchrun_command(
    nproc: int,
    spec: Path,
    out: Path,
    python: str = sys.executable,
    *,
    rdzv: dict | None = None,
    worker_args: list[str] | None = None,
) -> list[str]:
    """The torchrun command line of a run file (torchrun is `python -m torch.distributed.run`).
    `rdzv` = {"nnodes", "node_rank", "endpoint"} for a multi-node c10d rendezvous instead of
    --standalone; `worker_args` are extra worker options (--memory-limit-mib, --fault, --progress)."""
    return (
        rendezvous_command(nproc, python, rdzv)
        + ["-m", "autopar.trial.worker", "--spec", str(spec), "--out", str(out)]
        + list(worker_args or [])
    )


def rendezvous_command(nproc: int | str, python: str = sys.executable, rdzv: dict | None = None) -> list[str]:
    """`python -m torch.distributed.run` with --standalone, or the c10d rendezvous flags."""
    cmd = [python, "-m", "torch.distributed.run"]
    if not rdzv:
        return cmd + ["--standalone", f"--nproc_per_node={nproc}"]
    return cmd + [
        f"--nnodes={rdzv['nnodes']}",
        f"--node_rank={rdzv.get('node_rank', 0)}",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={rdzv['endpoint']}",
        f"--rdzv_id={rdzv.get('id', 'autopar')}",
    ]


ProgressCallback = Callable[[dict], bool]


def launch(
    trials: list[TrialConfig],
    nproc: int,
    *,
    timeout_s: float = 600.0,
    workdir: Path | None = None,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    rdzv: dict | None = None,
    worker_args: list[str] | None = None,
    on_progress: ProgressCallback | None = None,
) -> LaunchResult:
    """Run the trials in one torchrun launch of `nproc` processes; never raises on a failed run.
    `on_progress(record)` sees each step as it ends and returns True to stop the run ("pruned")."""
    workdir = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="autopar-trial-"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec, out = workdir / "run.json", workdir / "result.json"
    spec.write_text(dumps({"trials": [t.to_dict() for t in trials]}, indent=1))
    progress = workdir / PROGRESS_FILE if on_progress else None
    args = list(worker_args or []) + (["--progress", str(progress)] if progress else [])
    cmd = torchrun_command(nproc, spec, out, python, rdzv=rdzv, worker_args=args)
    return run_command(
        cmd, out, timeout_s=timeout_s, workdir=workdir, env=env, progress=progress, on_progress=on_progress
    )


class ProgressReader:
    """The complete JSON lines appended to a progress file since the last read (a line still
    being written waits for its newline)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.pending = Path(path), 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.pending = (self.pending + data).split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:  # not ours to judge: skip a malformed line
                continue
        return out


def run_command(
    command: list[str],
    result_path: Path,
    *,
    timeout_s: float,
    workdir: Path,
    env: dict[str, str] | None = None,
    progress: Path | None = None,
    on_progress: ProgressCallback | None = None,
    cwd: Path | None = None,
    reader=None,
) -> LaunchResult:
    """Run a worker command in its own process group (in `cwd`, default `workdir`, where its logs
    go), kill the group on timeout or when `on_progress` asks to stop, classify. The step records
    come from the `progress` file, or from `reader` (any object whose `read()` returns the new
    records: a trainer's own log, autopar.measured.own_run)."""
    result_path.unlink(missing_ok=True)
    if reader is not None and on_progress is None:
        reader = None
    if progress is not None and on_progress is not None and reader is None:
        progress.unlink(missing_ok=True)
        reader = ProgressReader(progress)
    records: list[dict] = []
    token = hygiene.new_token()
    run_env = hygiene.child_env(dict(os.environ if env is None else env), token)
    repo = str(Path(__file__).resolve().parents[2])  # so the workers import this autopar
    run_env["PYTHONPATH"] = repo + os.pathsep + run_env.get("PYTHONPATH", "")
    stdout_path, stderr_path = workdir / "stdout.log", workdir / "stderr.log"
    reap_stale(workdir)
    t0 = time.perf_counter()
    with open(stdout_path, "wb") as so, open(stderr_path, "wb") as se:
        proc = subprocess.Popen(
            command,
            stdout=so,
            stderr=se,
            cwd=cwd or workdir,
            env=run_env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        (workdir / PGID_FILE).write_text(f"{proc.pid} {token}")
        handle = hygiene.register(
            f"trial {workdir.name} (process group {proc.pid})", lambda: _kill_now(proc.pid, token)
        )
        timed_out = stopped = False
        try:
            ended = _wait(proc, t0 + timeout_s, reader, on_progress, records)
            timed_out, stopped = ended == "timeout", ended == "stopped"
            if ended != "exited":
                _kill_group(proc, token=token)
        finally:
            _kill_group(proc, grace_s=0.0, token=token)  # orphans of a finished run; all of it if a callback raised
            hygiene.unregister(handle)
    (workdir / PGID_FILE).unlink(missing_ok=True)
    if reader is not None and not stopped:
        assert on_progress is not None  # a reader is made only for a callback
        for rec in reader.read():  # the last steps, written just before the exit: seen, too late to stop
            records.append(rec)
            on_progress(rec)
    wall = time.perf_counter() - t0
    stdout, stderr = _tail(stdout_path), _tail(stderr_path)
    result = read_result(result_path)
    if stopped:
        outcome, reasons = "pruned", [f"stopped by the caller after {len(records)} step record(s)"]
    else:
        outcome, reasons = classify(proc.returncode, timed_out, result, stdout + stderr)
    return LaunchResult(
        outcome=outcome,
        returncode=proc.returncode,
        wall_s=wall,
        result=result,
        command=command,
        stdout_tail=stdout,
        stderr_tail=stderr,
        reasons=reasons,
        progress=records,
    )


def _wait(
    proc: subprocess.Popen,
    deadline: float,
    reader: ProgressReader | None,
    on_progress: ProgressCallback | None,
    records: list[dict],
) -> str:
    """Wait for the process to exit ("exited"), the deadline ("timeout", perf_counter clock) or the
    callback to ask for a stop ("stopped"), feeding it the progress records meanwhile."""
    while True:
        left = deadline - time.perf_counter()
        try:
            proc.wait(timeout=max(0.0, min(POLL_S, left)) if reader is not None else max(0.0, left))
            return "exited"
        except subprocess.TimeoutExpired:
            pass
        if reader is not None:
            assert on_progress is not None  # a reader is made only for a callback
            for rec in reader.read():
                records.append(rec)
                if on_progress(rec):
                    return "stopped"
        if time.perf_counter() >= deadline:
            return "timeout"


PGID_FILE = "launch.pgid"


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the launching process dies (prctl(2)
    PR_SET_PDEATHSIG; Linux), so a killed search leaves no torchrun behind; its workers, in
    sessions of their own, end through their watchdogs (autopar.measured.hygiene)."""
    hygiene.set_parent_death_signal(signal.SIGKILL)


def _kill_now(pgid: int, token: str) -> None:
    """SIGKILL the launch at once: its process group and every process carrying its token."""
    _signal_group(pgid, signal.SIGKILL)
    hygiene.kill_token(token)


def reap_stale(workdir: Path) -> bool:
    """Kill what a previous, killed launcher left in `workdir` (its pgid file: process group and
    launch token), if alive."""
    path = Path(workdir) / PGID_FILE
    try:
        pgid, _, token = path.read_text().strip().partition(" ")
        pgid_n = int(pgid)
    except (OSError, ValueError):
        return False
    alive = _signal_group(pgid_n, signal.SIGKILL)
    if token:
        alive = bool(hygiene.kill_token(token)) or alive
    path.unlink(missing_ok=True)
    return alive


def classify(returncode: int | None, timed_out: bool, result: dict | None, logs: str) -> tuple[str, list[str]]:
    """The outcome of a finished launch, and why (see the table in the module docstring)."""
    complete = bool(result and result.get("complete"))
    trials = (result or {}).get("trials", [])
    errors = [f"{t.get('name')}: {t.get('error')}" for t in trials if t.get("status") == "error"]
    if timed_out:
        return "timeout", ["killed after the timeout"] + errors
    if complete and returncode == 0:
        return "ok", []
    if complete:
        why = "gloo abort at exit" if TEARDOWN_ABORT_MARKER in logs else f"exit code {returncode}"
        return "teardown-abort", [f"result complete, then {why}"]
    text = logs + "\n".join(errors)
    if any(m in text for m in _OOM_MARKERS) or returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "oom", errors or ["out of memory (allocation failure or killed by the kernel)"]
    if MISSING_MARKER in text:  # the python the trial ran (a cluster node's, say) lacks torch
        return "crash", errors or [f"PyTorch is not installed where the trial ran: {INSTALL_HINT}"]
    return "crash", errors or [f"exit code {returncode}, no complete result"]


def _kill_group(proc: subprocess.Popen, grace_s: float = 5.0, token: str | None = None) -> None:
    """End the process group of `proc` (its own session) and every process of the launch token:
    SIGTERM and up to `grace_s` to exit, then SIGKILL whatever is left, leader and orphans alike."""
    if grace_s > 0 and _signal_group(proc.pid, signal.SIGTERM):
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, else its zombie keeps the group "alive"
            if not _group_alive(proc.pid) and not (token and hygiene.processes_with_token(token)):
                return
            time.sleep(0.05)
    _signal_group(proc.pid, signal.SIGKILL)
    if token:
        hygiene.kill_token(token)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def _tail(path: Path, limit: int = 20_000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


#: bytes at most of a trial's result file (its per-step figures and environment: a few KiB)
RESULT_BYTES = 64 << 20


def read_result(path: Path) -> dict | None:
    """A trial's result file through the one reader (autopar.spec.read_file), or None when it is
    missing, special, too large or not a JSON object (the trial failed to write it)."""
    try:
        data = read_json(path, f"'{path}'", RESULT_BYTES)
    except ValueError:  # InputError
        return None
    return data if isinstance(data, dict) else None
