"""`autopar search --trials 2 --launcher slurm`, end to end, against stand-in SLURM commands that
run each job here (tests/measured/slurm_stub.py): every trial is one sbatch job whose result JSON
comes back into the study; a SIGKILLed search's running job is adopted by the rerun, not submitted
again; SIGINT cancels the running job (scancel) and exits 130 with nothing left; a job past the
trial timeout is cancelled and recorded as a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import slurm_stub

from autopar.measured import slurm
from autopar.measured.trials import load_docs

pytestmark = [pytest.mark.timeout(400), pytest.mark.distributed, pytest.mark.slow]

SEARCH = [
    "search",
    "--model",
    "tiny",
    "--gpus",
    "2",
    "--gpu",
    "local",
    "--trials",
    "2",
    "--trial-steps",
    "2",
    "--launcher",
    "slurm",
]


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm-state"
    slurm_stub.install(bin_dir, state)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield state
    slurm_stub.cancel_all(state)


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _running_job(run: Path) -> tuple[str, Path] | None:
    """(job id, work dir) of a submitted job whose first step record has appeared."""
    for f in (run / "trials" / "work").glob("*/slurm.job"):
        if (f.parent / "progress.jsonl").exists() and (f.parent / "progress.jsonl").read_text().strip():
            return f.read_text().split()[0], f.parent
    return None


def _gone(procs, text: str, within: float) -> list[str]:
    deadline = time.monotonic() + within
    while procs(text) and time.monotonic() < deadline:
        time.sleep(0.25)
    return procs(text)


def test_two_trials_as_jobs_with_resume(tmp_path, stubs, cli, cli_popen, procs, monkeypatch):
    monkeypatch.setenv("AUTOPAR_WORKER_FAULT", "slow")  # 1 s more per step: a job runs long enough to adopt
    run = tmp_path / "run"
    args = SEARCH + ["--run-dir", "run"]
    p = cli_popen(args, tmp_path)
    job, work = _wait(lambda: _running_job(run), 120, "the first job's first step")
    os.kill(p.pid, signal.SIGKILL)  # the search dies; the job, on the "cluster", runs on
    p.wait()
    assert slurm.job_state(job)[0] == "RUNNING"
    r = cli(args, tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"adopting SLURM job {job}" in r.stdout or f"collecting SLURM job {job}" in r.stdout, r.stdout[-3000:]
    submitted = slurm_stub.calls(stubs, "sbatch")
    assert len(submitted) == 2, submitted  # one job per trial: the adopted one was not submitted again
    docs = load_docs(run / "trials")
    assert len(docs) == 2 and all(d["status"] == "ok" for d in docs.values()), {
        k: d["reasons"] for k, d in docs.items()
    }
    for d in docs.values():
        assert d["kind"] == "full" and len(d["measured"]["step_times_s"]) == 2
        assert min(d["measured"]["step_times_s"]) > 1.0  # the injected slow steps: measured on the "cluster"
        assert any("# job" in c for c in d["command"])
    assert work.name in docs  # the adopted job's result is in the study
    figs = json.loads((run / "search.json").read_text())["measured"]
    assert figs["trialled"] == 2 and figs["succeeded"] == 2 and figs["launcher"] == "slurm"
    assert not slurm_stub.calls(stubs, "scancel")
    assert not _gone(procs, str(run), 10)


def test_sigint_cancels_the_job(tmp_path, stubs, cli_popen, procs, monkeypatch):
    monkeypatch.setenv("AUTOPAR_WORKER_FAULT", "slow")
    run = tmp_path / "run"
    err = open(tmp_path / "err.txt", "w")
    p = cli_popen(SEARCH + ["--run-dir", "run"], tmp_path, stderr=err)
    job, _ = _wait(lambda: _running_job(run), 120, "the first job's first step")
    os.kill(p.pid, signal.SIGINT)
    assert p.wait(timeout=30) == 130
    err.close()
    lines = (tmp_path / "err.txt").read_text().splitlines()
    assert lines and lines[-1].startswith("autopar: interrupted by SIGINT") and f"SLURM job {job}" in lines[-1], lines
    assert [c for c in slurm_stub.calls(stubs, "scancel") if c.endswith(f" {job}")]
    assert slurm.job_state(job)[0] == "CANCELLED"
    assert not _gone(procs, str(run), 10)  # the job's torchrun and workers are gone too


def test_timeout_cancels_the_job(tmp_path, stubs, cli, procs, monkeypatch):
    monkeypatch.setenv("AUTOPAR_WORKER_FAULT", "hang")
    run = tmp_path / "run"
    r = cli(SEARCH + ["--run-dir", "run", "--trials", "1", "--trial-timeout", "6"], tmp_path, timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    [doc] = load_docs(run / "trials").values()
    assert doc["status"] == "timeout" and "scancel" in " ".join(doc["reasons"]), doc["reasons"]
    [line] = slurm_stub.calls(stubs, "scancel")
    assert slurm.job_state(line.split()[-1])[0] == "CANCELLED"
    assert not _gone(procs, str(run), 10)


def test_missing_slurm_commands_are_one_line(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(subprocess.__file__).parent))  # no sbatch anywhere
    r = cli(SEARCH + ["--run-dir", "run"], tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("autopar: error: `sbatch` is not on PATH"), r.stderr


def test_job_script_and_states(tmp_path, stubs, monkeypatch):
    one = slurm.sbatch_script(
        nnodes=1,
        nproc=8,
        minutes=7,
        python="py",
        spec="/s/run.json",
        out="/s/out.json",
        worker_args=["--progress", "/s/p.jsonl"],
    )
    assert "--standalone --nproc_per_node=8" in one and "srun" not in one and "#SBATCH --gpus-per-node=8" in one
    assert "unset AUTOPAR_WATCH" in one and "--progress /s/p.jsonl" in one and "#SBATCH --time=7" in one
    two = slurm.sbatch_script(
        nnodes=2, nproc=8, minutes=7, python="py", spec="/s/run.json", out="/s/out.json", gpus=False
    )
    assert "srun py" in two and "--rdzv_backend=c10d" in two and "--nnodes=2" in two and "--cpus-per-task=8" in two
    assert slurm.SlurmOptions(gpus_per_node=8).nodes(16) == (2, 8)
    with pytest.raises(Exception, match="does not split evenly"):
        slurm.SlurmOptions(gpus_per_node=8).nodes(9)
    assert slurm.job_state("424242") == ("UNKNOWN", "")  # neither command knows it
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("squeue", "sacct"):
        (broken / name).write_text("#!/bin/sh\necho 'slurm_load_jobs error: Socket timed out' >&2\nexit 1\n")
        (broken / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{broken}{os.pathsep}{os.environ['PATH']}")
    assert slurm.job_state("424242")[0] == slurm.QUERY_FAILED  # asked again, not taken for an ended job
