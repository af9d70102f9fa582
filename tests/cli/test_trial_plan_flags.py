"""`autopar trial` takes every plan flag `autopar estimate` takes (the same options and the same
plan builder, so the two cannot drift): a cp2 trial and an ep2 MoE trial run end to end at world 2;
bad plans, and plans the built-in model cannot run yet, are one line and exit 2 before anything
starts. Every case is a real `python -m autopar` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autopar.spec.hardware import LOCAL_DEFAULTS

REPO = Path(__file__).resolve().parents[2]
TRIAL = ["trial", "--gpus", "2", "--steps", "2", "--warmup", "1", "--run-dir", "out"]


def _run(args: list[str], tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(LOCAL_DEFAULTS))  # the unprobed local profile
    env["AUTOPAR_LOCAL_PROFILE"] = str(tmp_path / "local.yaml")
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_every_plan_flag(tmp_path):
    r = _run(["trial", "--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    for flag in (
        "--tp",
        "--pp",
        "--vpp",
        "--cp",
        "--dp",
        "--ep",
        "--etp",
        "--zero",
        "--sp",
        "--no-sp",
        "--mbs",
        "--gbs",
        "--pp-schedule",
        "--recompute",
        "--recompute-layers",
        "--dtype",
        "--pp-layout",
        "--pp-first",
        "--pp-last",
        "--pp-embedding-as-layer",
        "--pp-loss-as-layer",
    ):
        assert flag in r.stdout, flag


@pytest.mark.parametrize(
    "model,flags,axis", [("tiny", ["--cp", "2"], "cp"), ("tiny-moe", ["--ep", "2"], "ep")], ids=["cp2", "ep2-moe"]
)
@pytest.mark.distributed
@pytest.mark.slow
def test_trial_runs_cp_and_ep(tmp_path, model, flags, axis):
    r = _run(TRIAL + ["--model", model, *flags, "--json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "ok", doc["reasons"]
    assert doc["plan"][axis] == 2 and doc["plan"]["dp"] == (1 if axis == "cp" else 2)
    m = doc["measured"]
    assert m["comm_bytes_per_rank_by_axis"][axis] > 0  # the axis really ran: its collectives moved bytes
    assert len(m["step_times_s"]) == 2 and m["peak_memory_bytes"] > 0
    # the same flags give `autopar estimate` the same plan (one builder for both commands)
    e = _run(
        [
            "estimate",
            "--model",
            model,
            "--gpus",
            "2",
            *flags,
            "--dtype",
            "fp32",
            "--trainer",
            "autopar",
            "--gbs",
            str(doc["plan"]["global_batch_size"]),
            "--json",
        ],
        tmp_path,
    )
    assert e.returncode == 0, e.stderr
    assert json.loads(e.stdout)["plan"] == doc["plan"]


CASES = [
    ("fp8-not-built", ["--model", "tiny", "--dtype", "fp8", "--emit-slurm", "job.sh"], ["built-in model", "fp8"]),
    ("recompute-unknown", ["--model", "tiny", "--recompute", "some"], ["recompute", "none, selective, full"]),
    ("gpus-not-divisible", ["--model", "tiny", "--gpus", "3", "--tp", "2"], ["tp*pp*cp", "--gpus"]),
    ("ep-too-large", ["--model", "tiny-moe", "--ep", "4"], ["ep*etp", "must divide"]),
    ("layout-wrong-sum", ["--model", "tiny", "--pp", "2", "--pp-layout", "1,1"], ["layout"]),
    ("bf16-on-cpu", ["--model", "tiny", "--dtype", "bf16"], ["--dtype bf16", "fp32"]),
]


@pytest.mark.slow  # each case is a fresh `python -m autopar` process, as in test_bad_input.py
@pytest.mark.parametrize("args,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_trial_plans_are_one_line_exit_2(tmp_path, args, expected):
    r = _run(TRIAL + args, tmp_path, timeout=120)
    shown = f"exit {r.returncode}\n--- stderr\n{r.stderr}--- stdout\n{r.stdout}"
    assert r.returncode == 2 and "Traceback" not in r.stderr, shown
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar: error:"), shown
    for word in expected:
        assert word.lower() in lines[0].lower(), f"expected {word!r}\n{shown}"
    assert r.stdout == "" and not (tmp_path / "out").exists() and not (tmp_path / "job.sh").exists(), shown
