"""No trial process outlives autopar: `autopar search --gpu local --trials 1` is signalled while its
trial starts up (workers importing torch), while it steps, and while it tears down (the result
written, the workers still alive: `AUTOPAR_WORKER_FAULT=slow-exit`), at world 2 (every signal in
every phase) and world 4 (each phase once). SIGINT and SIGTERM exit 130 / 143 with one line on
stderr; after any of them, SIGKILL included (no handler runs: torchrun's PDEATHSIG and the
workers' watchdogs), no worker, torchrun or launcher process of the run is left 10 s later.
Also the pieces: the launch token finds processes that left the process group, and the watchdog
ends a worker whose launcher died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autopar.measured import hygiene

pytestmark = [pytest.mark.timeout(300), pytest.mark.distributed, pytest.mark.slow]

#: the issue's window: nothing of the run may be alive this long after the signal
WINDOW_S = 10.0


def _workers(text: str) -> list[int]:
    """Worker processes (not torchrun) whose command line mentions `text`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmd and b"autopar.trial.worker" in cmd and b"torch.distributed.run" not in cmd:
            out.append(int(d.name))
    return out


def _progress(run: Path) -> bool:
    return any(p.read_text().strip() for p in (run / "trials" / "work").glob("*/progress.jsonl"))


def _complete(run: Path) -> bool:
    for p in (run / "trials" / "work").glob("*/result.json"):
        try:
            if json.loads(p.read_text()).get("complete"):
                return True
        except (OSError, ValueError):
            pass
    return False


PHASES = {
    # workers exist, none has finished a step yet (importing torch, building the model)
    "startup": (None, lambda run, world: len(_workers(str(run))) >= 1 and not _progress(run)),
    # the timed trial is stepping (1 s more per step)
    "steps": ("slow", lambda run, world: _progress(run)),
    # the complete result is written; the workers wait 30 s before their exit
    "teardown": ("slow-exit", lambda run, world: _complete(run) and len(_workers(str(run))) == world),
}
CASES = [(2, phase, sig) for phase in PHASES for sig in ("SIGINT", "SIGTERM", "SIGKILL")] + [
    (4, "startup", "SIGKILL"),
    (4, "steps", "SIGTERM"),
    (4, "teardown", "SIGINT"),
]


@pytest.mark.parametrize("world,phase,sig", CASES, ids=[f"world{w}-{p}-{s}" for w, p, s in CASES])
def test_signal_leaves_no_process(tmp_path, cli_popen, procs, monkeypatch, world, phase, sig):
    fault, reached = PHASES[phase]
    if fault:
        monkeypatch.setenv("AUTOPAR_WORKER_FAULT", fault)
    run = tmp_path / "run"
    args = [
        "search",
        "--model",
        "tiny",
        "--gpus",
        str(world),
        "--gpu",
        "local",
        "--trials",
        "1",
        "--trial-steps",
        "1",
        "--trial-timeout",
        "120",
        "--run-dir",
        "run",
    ] + (["--max-local-ranks", str(world)] if world > 2 else [])
    err = open(tmp_path / "stderr.txt", "w")
    p = cli_popen(args, tmp_path, stderr=err)
    try:
        deadline = time.monotonic() + 150
        while not reached(run, world):
            assert p.poll() is None, f"autopar ended before the {phase} phase"
            assert time.monotonic() < deadline, f"the {phase} phase never came"
            time.sleep(0.05)
        assert procs(str(run)), "no trial process to signal"
        t0 = time.monotonic()
        os.kill(p.pid, getattr(signal, sig))
        code = p.wait(timeout=WINDOW_S)
        left = procs(str(run))
        while left and time.monotonic() - t0 < WINDOW_S:
            time.sleep(0.1)
            left = procs(str(run))
        assert not left, f"{len(left)} process(es) of the run alive {WINDOW_S:.0f} s after {sig}:\n" + "\n".join(left)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        err.close()
    stderr = (tmp_path / "stderr.txt").read_text()
    if sig == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        assert code == 128 + getattr(signal, sig), (code, stderr[-2000:])
        last = stderr.strip().splitlines()[-1]
        assert last.startswith(f"autopar: interrupted by {sig}: stopped trial"), stderr[-2000:]
        assert "Traceback" not in stderr


def test_kill_token_finds_processes_outside_the_group(tmp_path):
    """A grandchild in a session of its own (as torchrun starts its workers) is missed by a process
    group kill, and found by the launch token."""
    token = hygiene.new_token()
    pid_file = tmp_path / "pid"
    body = textwrap.dedent(f"""
        import subprocess, sys, time
        c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(c.pid))
        time.sleep(120)
    """)
    env = hygiene.child_env(dict(os.environ), token)
    p = subprocess.Popen([sys.executable, "-c", body], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        assert set(hygiene.processes_with_token(token)) == {p.pid, grandchild}
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        assert hygiene.processes_with_token(token) == [grandchild]  # the group kill missed it
        assert hygiene.kill_token(token) == 1
        deadline = time.monotonic() + 5
        while hygiene.processes_with_token(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hygiene.processes_with_token(token) == []
    finally:
        hygiene.kill_token(token)
        if p.poll() is None:
            p.kill()


def test_watchdog_ends_a_worker_whose_launcher_died(tmp_path):
    """launcher -> middle -> worker, the worker running the watchdog that watches the launcher
    (AUTOPAR_WATCH): SIGKILL the launcher and the worker, whose parent `middle` still lives, ends
    by itself within a second; a worker whose parent dies ends too."""
    repo = str(Path(__file__).resolve().parents[2])
    worker = (
        "import os, sys, time; sys.path.insert(0, %r); from autopar.measured.hygiene import start_watchdog; "
        "start_watchdog(0.1); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    ) % repo
    middle = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); "
        "open(sys.argv[3], 'w').write('x'); time.sleep(120)"
    )
    launcher = textwrap.dedent(f"""
        import os, subprocess, sys, time
        sys.path.insert(0, {repo!r})
        from autopar.measured import hygiene
        env = hygiene.child_env(dict(os.environ), hygiene.new_token())
        m = subprocess.Popen([sys.executable, "-c", {middle!r}, {worker!r}, sys.argv[1], sys.argv[2]], env=env,
                             start_new_session=True)
        open(sys.argv[3], "w").write(str(m.pid))
        time.sleep(120)
    """)
    w_file, m_flag, m_file = tmp_path / "worker.pid", tmp_path / "middle.up", tmp_path / "middle.pid"
    p = subprocess.Popen([sys.executable, "-c", launcher, str(w_file), str(m_flag), str(m_file)])
    mid = None
    try:
        deadline = time.monotonic() + 30
        while not (w_file.exists() and w_file.read_text() and m_file.exists() and m_file.read_text()):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        wpid, mid = int(w_file.read_text()), int(m_file.read_text())
        assert _alive(wpid)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        t0 = time.monotonic()
        while _alive(wpid) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert not _alive(wpid) and time.monotonic() - t0 < 1.5, "the worker outlived its launcher"
        assert _alive(mid)  # its parent still ran: the launcher's death alone ended it
    finally:
        if mid:
            try:
                os.kill(mid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            p.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"
