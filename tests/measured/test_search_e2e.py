"""End to end on this CPU: `autopar search --gpu local --trials K` killed with SIGKILL during a trial,
then rerun: finished trials kept, the interrupted one rerun, no process left behind; `autopar trial`
on one plan (TP, a fewer-layers proxy, world 4 on 2 cores, --emit-slurm)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from autopar.measured.trials import load_docs

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


SEARCH = [
    "search",
    "--model",
    "tiny",
    "--gpus",
    "2",
    "--gpu",
    "local",
    "--trials",
    "3",
    "--trial-steps",
    "2",
    "--run-dir",
    "run",
]


def test_sigkill_then_rerun(tmp_path, procs, cli, cli_popen):
    run = tmp_path / "run"
    p = cli_popen(SEARCH, tmp_path)
    deadline = time.monotonic() + 120
    in_flight = None
    while time.monotonic() < deadline and in_flight is None:
        done = set(load_docs(run / "trials")) if (run / "trials").exists() else set()
        if done:
            for pg in (run / "trials" / "work").glob("*/launch.pgid"):
                if pg.parent.name not in done:
                    in_flight = pg.parent.name
        time.sleep(0.2)
    assert in_flight, "no second trial started"
    time.sleep(1.0)  # torchrun and its workers are up
    first = {k: (run / "trials" / f"{k}.json").read_bytes() for k in load_docs(run / "trials")}
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 30
    while procs(str(run)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not procs(str(run)), procs(str(run))  # torchrun died with its parent (PDEATHSIG)
    assert in_flight not in load_docs(run / "trials")
    r = cli(SEARCH, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    docs = load_docs(run / "trials")
    assert len(docs) == 3 and in_flight in docs
    assert all(d["status"] == "ok" for d in docs.values()), {k: d["reasons"] for k, d in docs.items()}
    for k, body in first.items():
        assert (run / "trials" / f"{k}.json").read_bytes() == body  # finished trials kept as they were
    assert "interrupted trial" in r.stdout
    figs = json.loads((run / "search.json").read_text())["measured"]
    assert figs["trialled"] == 3 and figs["winner"]
    assert not procs(str(run))


def test_trial_cli(tmp_path, cli, procs):
    r = cli(
        [
            "trial",
            "--model",
            "tiny",
            "--gpus",
            "2",
            "--tp",
            "2",
            "--mbs",
            "2",
            "--gbs",
            "4",
            "--steps",
            "2",
            "--run-dir",
            "out",
            "--json",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    m = doc["measured"]
    assert doc["status"] == "ok" and m["step_time_s"] > 0 and m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1
    assert m["memory_method"] == "tensor-peak" and len(m["peak_memory_bytes_per_rank"]) == 2
    assert m["comm_bytes_per_rank_by_axis"]["tp"] > 0 and doc["environment"]["backend"] == "gloo"
    assert doc["errors"]["peak_memory"] is not None and list((tmp_path / "out" / "trials").glob("*.json"))
    # proxy: 2 of tiny's 4 layers over pp 2, world 4 on 2 cores (oversubscribed: timings not comparable)
    r = cli(
        [
            "trial",
            "--model",
            "tiny",
            "--gpus",
            "4",
            "--pp",
            "2",
            "--proxy-layers",
            "2",
            "--gbs",
            "4",
            "--steps",
            "2",
            "--run-dir",
            "out",
            "--json",
            "--max-local-ranks",
            "4",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads(r.stdout)["measured"]
    assert m["proxy"]["kind"] == "fewer-layers" and m["proxy"]["ratio"] > 1
    assert m["step_time_s"] == m["proxy"]["proxy_step_time_s"] * m["proxy"]["ratio"]
    # without --max-local-ranks, world 4 on this machine's cores is refused before anything starts
    if (os.cpu_count() or 1) < 4:
        r = cli(["trial", "--model", "tiny", "--gpus", "4", "--pp", "2", "--gbs", "4", "--run-dir", "out2"], tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--max-local-ranks 4" in r.stderr, r.stderr
        assert not (tmp_path / "out2").exists()
    r = cli(
        ["trial", "--model", "tiny", "--gpus", "16", "--tp", "2", "--nnodes", "2", "--emit-slurm", "job.sh"], tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    text = (tmp_path / "job.sh").read_text()
    assert "srun" in text and "--rdzv_backend=c10d" in text and "--nnodes=2" in text and "--nproc_per_node=8" in text
    assert not procs(str(tmp_path))
