"""Shared fixtures of the search-layer tests: the `autopar` CLI as a real subprocess and the
questions the tests ask. Helpers are handed out as fixtures (not imported), so the tests work in
any pytest import mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("COLUMNS", "120")
    return env


def _cmd(*args) -> list[str]:
    return [sys.executable, "-m", "autopar", *[str(a) for a in args]]


def _question(model: str, num_gpus: int, space_name: str, seq_len: int | None = None, gpu: str = "h100-sxm"):
    """(Question, SearchSpace) as `autopar search` builds them: global batch from the space's
    tokens_per_step."""
    from autopar.search.scenarios import global_batch
    from autopar.search.space import load_space
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import get_preset
    from autopar.spec.question import Question

    space = load_space(space_name)
    m = get_preset(model)
    s = seq_len or m.seq_len
    q = Question(
        model=m,
        num_gpus=num_gpus,
        cluster=default_cluster(gpu),
        seq_len=s,
        global_batch_size=global_batch(space, s, None),
    )
    return q, space


@pytest.fixture(scope="session")
def sh():
    """Search helpers: sh.cmd(*args) -> argv of `python -m autopar`, sh.env() -> its environment,
    sh.question(model, gpus, space, seq_len=None) -> (Question, SearchSpace), sh.repo."""
    return SimpleNamespace(cmd=_cmd, env=_env, question=_question, repo=REPO)


@pytest.fixture
def run_cli(tmp_path):
    """Run `python -m autopar ARGS` to completion (bounded), in tmp_path unless cwd is given."""

    def run(*args, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            _cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd or tmp_path, env=_env()
        )

    return run
