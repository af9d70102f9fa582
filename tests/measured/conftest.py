"""Shared helpers of the trials/calibration tests: the CLI in a fresh process, and a check that no
process of a run directory outlives it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: `autopar ARGS` in a fresh interpreter (the CLI's own entry point)
CLI = "import sys; from autopar.cli import main; main(sys.argv[1:])"


def cli_env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["AUTOPAR_LOCAL_PROFILE"] = str(unprobed_profile(tmp_path / "local.yaml"))  # a test may probe over it
    return env


def unprobed_profile(path: Path) -> Path:
    """The unprobed defaults written as this machine's profile (a named profile must exist), unless
    a test wrote one there."""
    import yaml

    from autopar.spec.hardware import LOCAL_DEFAULTS

    if not path.exists():
        path.write_text(yaml.safe_dump(LOCAL_DEFAULTS))
    return path


def run_cli(args: list[str], tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (not zombies) containing `text`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out.append(f"{d.name}: {cmd}")
    return out


@pytest.fixture
def local_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_LOCAL_PROFILE", str(unprobed_profile(tmp_path / "local.yaml")))
    return tmp_path


@pytest.fixture(name="procs")
def _procs():
    return processes_mentioning


@pytest.fixture(name="cli")
def _cli():
    return run_cli


@pytest.fixture(name="cli_popen")
def _cli_popen():
    def start(
        args: list[str], tmp_path: Path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", CLI, *args], cwd=tmp_path, env=cli_env(tmp_path), stdout=stdout, stderr=stderr
        )

    return start
