"""The guard of a launch whose processes autopar did not write: the user's own trainer
(autopar.measured.own_run). autopar's own trial workers end themselves when the search dies (their
watchdog: autopar.measured.hygiene); a trainer's ranks cannot. torchrun starts them in sessions of
their own, and a parent-death signal reaches only the launcher's direct child, so a search killed
with SIGKILL would leave the trainer training. The guard is that direct child: it runs the launch
command, and when the search is gone (its parent-death signal, or the launcher named in
AUTOPAR_WATCH no longer running) or it is told to stop, it kills every process of the launch
token (AUTOPAR_LAUNCH), wherever torchrun put them.

Usage: python -m autopar.measured.guard COMMAND [ARG...]; exits with the command's code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from autopar.measured import hygiene


def _stop_launch(child: subprocess.Popen | None) -> None:
    token = os.environ.get(hygiene.LAUNCH_ENV, "")
    if token:
        hygiene.kill_token(token)  # this process is left out: it exits next
    if child is not None and child.poll() is None:
        child.kill()


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m autopar.measured.guard COMMAND [ARG...]", file=sys.stderr)
        return 2
    started: list[subprocess.Popen] = []

    def on_signal(signum: int, frame) -> None:  # noqa: ARG001 - the signal module's signature
        _stop_launch(started[0] if started else None)
        os._exit(128 + signum)

    # the handlers first, then SIGTERM (not the launcher's SIGKILL) when the search process dies
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    hygiene.set_parent_death_signal(signal.SIGTERM)
    child = subprocess.Popen(argv)
    started.append(child)
    watch = os.environ.get(hygiene.WATCH_ENV, "")
    while True:
        try:
            code = child.wait(timeout=hygiene.WATCH_POLL_S)
            return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
        except subprocess.TimeoutExpired:
            pass
        if watch and hygiene.launcher_gone(watch):  # the search died before the signal was set
            _stop_launch(child)
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
