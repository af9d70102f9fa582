"""A bad question to `autopar search` fails before the heavy layers are imported (issue 26: a
bad-input error within 0.3 s; docs/benchmarks.md). Asserted on what the process imported, not on
its time, which depends on the machine's load: each case runs the command line in a fresh
interpreter and lists the modules it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: what a fresh interpreter reports after the command: its exit code, stderr's lines and which of
#: the heavy modules it imported
PROBE = """
import contextlib, io, json, sys
from autopar.cli import main
err = io.StringIO()
code = 0
with contextlib.redirect_stderr(err):
    try:
        main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
heavy = ("numpy", "pandas", "pyarrow", "plotly", "optuna", "autopar.calibration.estimate", "autopar.search.run")
loaded = [m for m in heavy if m in sys.modules]
print(json.dumps({"code": code, "stderr": err.getvalue().splitlines(), "heavy": loaded}))
"""

#: bad flags checked by the command line itself (schema, presets, trainers, the lists): nothing heavy
LIGHT = [
    (["--gpus", "-8"], "--gpus -8 is out of range"),
    (["--gpus", "256,0"], "--gpus 0 is out of range"),
    (["--model", "70bx"], "unknown model '70bx'"),
    (["--gbs", "0"], "--gbs 0 is out of range"),
    (["--seq-len", "0"], "--seq-len 0 is out of range"),
    (["--trainer", "foo"], "unknown trainer 'foo'"),
    (["--rank-by", "x"], "--rank-by 'x' is not one of expected, p80"),
    (["--sampler", "x"], "--sampler 'x' is not one of tpe, nsga2, random"),
    (["--launcher", "x"], "--launcher 'x' is not one of local, slurm"),
    (["--tokens", "abc"], "--tokens 'abc' is not a token count"),
    (["--top-k", "0"], "--top-k"),
]
#: bad flags whose check reads the plan's fields or the cluster (numpy, through autopar.spec.plan),
#: still before pandas, the cost model and the search
MEDIUM = [
    (["--gpu", "h1000"], "unknown GPU 'h1000'"),
    (["--cluster", "no-such-cluster.yaml"], "cluster file 'no-such-cluster.yaml' does not exist"),
    (["--dtype", "fp7"], "unknown choice 'fp7'"),
    (["--space", "no-such-space.yaml"], "search space file 'no-such-space.yaml' does not exist"),
]


def _probe(args: list[str], tmp_path: Path) -> dict:
    argv = ["search", "--model", "70b", "--gpus", "256", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("args,message", LIGHT, ids=[a[0] for a, _ in LIGHT])
def test_bad_flag_fails_before_numpy(args, message, tmp_path):
    got = _probe(args, tmp_path)
    assert got["code"] == 2 and len(got["stderr"]) == 1 and message in got["stderr"][0], got
    assert got["heavy"] == [], f"{args}: imported {got['heavy']} before failing"


@pytest.mark.parametrize("args,message", MEDIUM, ids=[a[0] for a, _ in MEDIUM])
def test_bad_cluster_or_space_fails_before_the_search(args, message, tmp_path):
    got = _probe(args, tmp_path)
    assert got["code"] == 2 and len(got["stderr"]) == 1 and message in got["stderr"][0], got
    assert not {"pandas", "pyarrow", "autopar.calibration.estimate", "autopar.search.run"} & set(got["heavy"]), got
