"""No trial process outlives autopar; imports no torch.

Three mechanisms, because each alone misses a case (a fourth, autopar.measured.guard, stands in for
the watchdog where the workers are the user's own trainer):

1. **Launch tokens.** Every launch's environment carries `AUTOPAR_LAUNCH=<token>`; every process
   started under it inherits the variable, including torchrun's workers, which torchrun puts in
   sessions of their own (so a process-group kill of torchrun misses them). `kill_token` finds
   them through /proc/<pid>/environ and kills them, wherever they were reparented.
2. **Signal handlers.** `install_signal_handlers()` makes SIGINT and SIGTERM of the search process
   run every registered cleanup (`register`: kill a launch's process group and token, scancel a
   SLURM job), print one line, and exit 130 / 143.
3. **A watchdog in every worker.** SIGKILL cannot be handled. torchrun gets PR_SET_PDEATHSIG from
   the launcher, but that reaches only torchrun, not its workers (PDEATHSIG alone does not reach
   grandchildren). So each worker runs `start_watchdog()`: a thread that polls its parent pid and
   the launching process named in `AUTOPAR_WATCH=<host>:<pid>:<start time>` (same host only; the
   start time guards against pid reuse) and ends the worker when either is gone.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from autopar.processes import start_time

LAUNCH_ENV = "AUTOPAR_LAUNCH"
WATCH_ENV = "AUTOPAR_WATCH"
#: seconds between the watchdog's looks at its parent and launcher
WATCH_POLL_S = 0.25

_cleanups: dict[int, tuple[str, Callable[[], None]]] = {}
_ids = itertools.count()
_lock = threading.Lock()
_installed = False
_owner: int | None = None  # the process that installed the handlers (forked children inherit them)


def new_token() -> str:
    return uuid.uuid4().hex[:16]


def watch_value(pid: int | None = None) -> str:
    """`<host>:<pid>:<start time>` of this process (the launcher a worker watches)."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{start_time(pid) or ''}"


def child_env(env: dict[str, str], token: str) -> dict[str, str]:
    """`env` marked with the launch token and the launcher to watch."""
    return dict(env) | {LAUNCH_ENV: token, WATCH_ENV: watch_value()}


def processes_with_token(token: str) -> list[int]:
    """Live processes whose environment carries the launch token (zombies left out)."""
    needle = f"{LAUNCH_ENV}={token}".encode()
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            state = (d / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(int(d.name))
    return out


def kill_token(token: str, sig: int = signal.SIGKILL, rounds: int = 3) -> int:
    """Send `sig` to every process of the launch (a few rounds: a process may be starting one);
    returns how many were signalled."""
    n = 0
    for _ in range(rounds):
        pids = processes_with_token(token)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    return n


def register(what: str, cleanup: Callable[[], None]) -> int:
    """Run `cleanup` if the search process is interrupted (SIGINT/SIGTERM); returns a handle."""
    with _lock:
        handle = next(_ids)
        _cleanups[handle] = (what, cleanup)
    return handle


def unregister(handle: int) -> None:
    with _lock:
        _cleanups.pop(handle, None)


def stop_all() -> list[str]:
    """Run every registered cleanup now (each at most once); returns what they stopped."""
    with _lock:
        items = list(_cleanups.items())
        _cleanups.clear()
    done = []
    for _, (what, cleanup) in items:
        try:
            cleanup()
            done.append(what)
        except Exception as e:  # noqa: BLE001 - keep stopping the others
            done.append(f"{what} (cleanup failed: {e})")
    return done


def _kill_children() -> None:
    """SIGKILL this process's own children still running (a process pool's workers: os._exit would
    leave them computing)."""
    me = str(os.getpid())
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "stat").read_text().rpartition(")")[2].split()[1] == me:
                os.kill(int(d.name), signal.SIGKILL)
        except (OSError, IndexError):
            pass


def _on_signal(signum: int, frame) -> None:  # noqa: ARG001 - the signal module's signature
    if _owner is not None and os.getpid() != _owner:  # a forked child (a process pool's worker): quietly
        os._exit(128 + signum)
    stopped = stop_all()
    _kill_children()
    name = signal.Signals(signum).name
    what = f": stopped {', '.join(stopped)}" if stopped else ""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    if sys.stderr.isatty():  # a progress bar may have hidden the cursor
        sys.stderr.write("\r\x1b[?25h")
    print(f"autopar: interrupted by {name}{what}", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM: stop every registered launch, one line on stderr, exit 128 + signal
    (130, 143). Only from the main thread (Python's rule); idempotent."""
    global _installed, _owner
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    _installed, _owner = True, os.getpid()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """prctl(PR_SET_PDEATHSIG): `sig` to this process when the thread that started it exits (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def launcher_gone(watch: str) -> bool:
    """Whether the launcher `watch` names (`watch_value`) has ended, on this host."""
    host, _, rest = watch.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's launcher (a SLURM job): nothing to watch here
    now = start_time(int(pid))
    return now is None or (bool(started) and now != started)


def start_watchdog(poll_s: float = WATCH_POLL_S, on_exit: Callable[[str], None] | None = None) -> threading.Thread:
    """In a worker: a daemon thread that ends this process (os._exit(1)) when its parent (torchrun)
    or the launching autopar process (`AUTOPAR_WATCH`) is gone."""
    ppid = os.getppid()
    watch = os.environ.get(WATCH_ENV, "")

    def run() -> None:
        while True:
            time.sleep(poll_s)
            why = ""
            if os.getppid() != ppid:
                why = f"parent {ppid} is gone"
            elif watch and launcher_gone(watch):
                why = f"the launching process ({watch}) is gone"
            if why:
                try:
                    (on_exit or (lambda w: print(f"[autopar.trial] exiting: {w}", file=sys.stderr, flush=True)))(why)
                finally:
                    os._exit(1)

    t = threading.Thread(target=run, name="autopar-watchdog", daemon=True)
    t.start()
    return t
