"""The launcher: outcome classification, killing the whole process group on timeout, run files,
and that the search side can use it without importing torch. Fake workers stand in for torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autopar.measured.config import TrialConfig, load_run
from autopar.measured.launcher import TEARDOWN_ABORT_MARKER, classify, run_command, torchrun_command

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
COMPLETE = {"env": {}, "trials": [{"name": "a", "status": "ok"}], "complete": True}


def fake_worker(tmp_path: Path, body: str) -> tuple[list[str], Path]:
    """A command that runs `body` with `out` (the result path) defined."""
    out = tmp_path / "result.json"
    script = tmp_path / "fake.py"
    script.write_text("import json, os, sys, time, subprocess\nout = sys.argv[1]\n" + textwrap.dedent(body))
    return [sys.executable, str(script), str(out)], out


def run(tmp_path: Path, body: str, timeout_s: float = 30.0):
    cmd, out = fake_worker(tmp_path, body)
    return run_command(cmd, out, timeout_s=timeout_s, workdir=tmp_path)


def test_complete_result_and_exit_0_is_ok(tmp_path: Path) -> None:
    r = run(tmp_path, f"json.dump({COMPLETE!r}, open(out, 'w'))")
    assert (r.outcome, r.returncode, r.succeeded) == ("ok", 0, True)
    assert r.trials == COMPLETE["trials"]


def test_abort_after_a_complete_result_is_a_teardown_abort(tmp_path: Path) -> None:
    body = f"""
    json.dump({COMPLETE!r}, open(out, 'w'))
    sys.stderr.write({TEARDOWN_ABORT_MARKER!r} + "\\n"); sys.stderr.flush()
    os.abort()
    """
    r = run(tmp_path, body)
    assert r.outcome == "teardown-abort" and r.succeeded
    assert r.returncode != 0 and "gloo abort" in r.reasons[0]


def test_incomplete_result_is_a_crash_with_the_trial_error(tmp_path: Path) -> None:
    doc = {"env": {}, "trials": [{"name": "tp3", "status": "error", "error": "TrialError: heads"}], "complete": False}
    r = run(tmp_path, f"json.dump({doc!r}, open(out, 'w')); sys.exit(1)")
    assert r.outcome == "crash" and not r.succeeded
    assert r.reasons == ["tp3: TrialError: heads"]
    r = run(tmp_path, "os.abort()")  # an abort before any result is a crash, not a teardown abort
    assert r.outcome == "crash" and r.result is None


def test_out_of_memory_is_recognised(tmp_path: Path) -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    r = run(tmp_path, f"sys.stderr.write({oom!r}); sys.exit(1)")
    assert r.outcome == "oom"
    r = run(tmp_path, "os.kill(os.getpid(), 9)")  # the kernel's OOM killer sends SIGKILL
    assert r.outcome == "oom"


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    body = f"""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open({str(pid_file)!r}, "w").write(str(child.pid))
    time.sleep(600)
    """
    t0 = time.monotonic()
    r = run(tmp_path, body, timeout_s=3.0)
    assert r.outcome == "timeout" and time.monotonic() - t0 < 30
    grandchild = int(pid_file.read_text())
    for _ in range(100):  # reaped by init shortly after the SIGKILL
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild), "an orphan outlived the launch"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_classify_prefers_timeout_and_needs_a_complete_result() -> None:
    assert classify(None, True, COMPLETE, "")[0] == "timeout"
    assert classify(0, False, {"complete": False, "trials": []}, "")[0] == "crash"
    assert classify(1, False, COMPLETE, "")[0] == "teardown-abort"


def test_torchrun_command_and_run_file_round_trip(tmp_path: Path) -> None:
    cmd = torchrun_command(4, tmp_path / "run.json", tmp_path / "out.json", python="py")
    assert cmd[:5] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    assert cmd[5:8] == ["-m", "autopar.trial.worker", "--spec"]
    trial = TrialConfig(model="tiny", plan={"tp": 2, "dtype": "fp32"}, scale={"num_layers": 2}, check_parity=True)
    again = load_run(json.loads(json.dumps({"trials": [trial.to_dict()]})))
    assert again == [trial]
    assert load_run(trial.to_dict()) == [trial]
    assert again[0].model_spec().num_layers == 2 and again[0].parallel_plan().tp == 2
    with pytest.raises(ValueError, match="unknown trial field"):
        TrialConfig.from_dict({"model": "tiny", "plan": {}, "stepz": 3})


def test_the_launcher_does_not_import_torch() -> None:
    code = "import sys, autopar.measured.launcher, autopar.measured.config; print('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
