"""torch is an optional extra (`autopar[trial]`): the commands that run it stop first, in one line
naming the install, when it is missing (here: autopar.measured.needs_torch says so; the slow
tests/test_wheel_install.py runs an installed package where `import torch` fails)."""

from __future__ import annotations

import sys

import pytest

from autopar.measured import needs_torch
from autopar.measured.launcher import classify


@pytest.fixture
def no_torch(monkeypatch):
    monkeypatch.setattr(needs_torch, "torch_installed", lambda: False)


def test_torch_installed_finds_without_importing(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert needs_torch.torch_installed() is True  # the test environment has torch (the trial extra)
    assert "torch" not in sys.modules  # found, not imported
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` fails on, like a missing one
    assert needs_torch.torch_installed() is False


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["trial", "--model", "tiny", "--gpus", "2", "--tp", "2"], "autopar trial"),
        (["probe", "--ranks", "2"], "autopar probe"),
        (["search", "--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "2"], "autopar search --trials"),
        (["calibrate", "no-such-run", "--rounds", "1"], "autopar calibrate --rounds"),
    ],
    ids=["trial", "probe", "search-trials", "calibrate-rounds"],
)
def test_the_torch_commands_say_what_to_install(no_torch, cli_run, one_line_error, tmp_path, monkeypatch, args, what):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(cli_run(*args), needles=[f"{what} needs PyTorch", "pip install 'autopar[trial]'"])
    assert "torch==2.13.0" in line
    assert not list(tmp_path.iterdir())  # stopped before writing anything


def test_emit_slurm_and_the_fit_need_no_torch(no_torch, cli_run, one_line_error, tmp_path) -> None:
    """--emit-slurm writes a script the cluster's python runs; calibrate without --rounds fits with scipy."""
    out = tmp_path / "t.sbatch"
    r = cli_run("trial", "--model", "tiny", "--gpus", "2", "--tp", "2", "--emit-slurm", out, "--run-dir", tmp_path)
    assert r.returncode == 0 and out.is_file(), r.stderr
    line = one_line_error(cli_run("calibrate", tmp_path / "no-such-run"))
    assert "PyTorch" not in line  # the run directory's own error


def test_a_trial_without_torch_says_what_to_install() -> None:
    """A trial whose python lacks torch (a cluster node's, say) crashes with the install in its reason."""
    logs = "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'torch'\n"
    outcome, reasons = classify(1, False, None, logs)
    assert outcome == "crash" and "autopar[trial]" in reasons[0]
    assert classify(1, False, None, "boom")[1] == ["exit code 1, no complete result"]
