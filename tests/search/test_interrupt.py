"""Ctrl-C and SIGTERM during `autopar search` (issue 15): exit 130 / 143 with one line, and the run
directory is either complete or marked incomplete (autopar.search.run_state); a rerun of the same
command finishes it. Real processes for the signals, in-process runs for the states in between."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from autopar.errors import InputError
from autopar.search.run_dir import INCOMPLETE, load

LARGE_SPACE = [
    "search",
    "--model",
    "llama3-70b",
    "--gpus",
    "4096",
    "--space",
    "benchmarks/spaces/scale-l.yaml",
    "--max-exhaustive",
    "1000000000",
]
OPTUNA = ["search", "--model", "tiny", "--gpus", "8", "--max-exhaustive", "0"]


def _interrupt(sh, argv: list, ready, sig: int, timeout: float = 60, cwd=None) -> subprocess.CompletedProcess:
    """Start `autopar ARGV` (in the repository, or `cwd`), wait until `ready()` holds, send `sig`,
    return the finished process."""
    proc = subprocess.Popen(
        sh.cmd(*argv), cwd=cwd or sh.repo, env=sh.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is not None:
        out, err = proc.communicate()
        pytest.fail(f"the search ended before it could be interrupted (exit {proc.returncode}): {err[-2000:]}")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _one_line(r: subprocess.CompletedProcess, name: str) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"autopar: interrupted by {name}"), lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    return lines[0]


def test_sigterm_while_streaming_leaves_no_half_run(sh, tmp_path):
    run = tmp_path / "run"
    r = _interrupt(
        sh, LARGE_SPACE + ["--run-dir", run], lambda: bool(list(run.glob(".plans.parquet.*.tmp"))), signal.SIGTERM
    )
    assert r.returncode == 143, r.stderr
    assert str(run) in _one_line(r, "SIGTERM")
    assert not run.exists(), sorted(p.name for p in run.iterdir())  # made by the search, nothing replaced yet


def _processes_in(folder: Path) -> list[int]:
    """The processes whose working directory is `folder`."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and Path(d / "cwd").resolve() == folder.resolve():
                out.append(int(d.name))
        except OSError:
            pass
    return out


def test_sigterm_during_a_whatif_stops_its_workers(sh, tmp_path):
    """A what-if's scenarios are searched on forked workers (autopar.forked): SIGTERM ends them and the
    search with one line that says a rerun finishes them; no worker is left, and each scenario's run
    directory is complete or marked incomplete."""
    argv = LARGE_SPACE[:4] + ["4096,8192", *LARGE_SPACE[5:]]
    argv[argv.index("benchmarks/spaces/scale-l.yaml")] = str(sh.repo / "benchmarks/spaces/scale-l.yaml")
    reports = tmp_path / "reports"
    r = _interrupt(sh, argv, lambda: bool(list(reports.glob("*/.plans.parquet.*.tmp"))), signal.SIGTERM, cwd=tmp_path)
    assert r.returncode == 143, r.stderr
    line = _one_line(r, "SIGTERM")
    assert "rerun the same command to finish" in line, line  # "them" on several cores, "it" on one
    time.sleep(0.2)
    assert _processes_in(tmp_path) == []
    for run in reports.iterdir():
        assert (run / INCOMPLETE).exists() or (run / "search.json").exists(), sorted(p.name for p in run.iterdir())


def test_sigint_during_optuna_then_the_rerun_finishes(sh, tmp_path):
    run = tmp_path / "run"
    r = _interrupt(
        sh,
        OPTUNA + ["--n-trials", "100000", "--run-dir", run],
        lambda: (run / "study.db").exists() and (run / "study.db").stat().st_size > 100_000,
        signal.SIGINT,
    )
    assert r.returncode == 130, r.stderr
    _one_line(r, "SIGINT")
    assert (run / INCOMPLETE).exists()  # the study is kept, and the directory marked incomplete
    with pytest.raises(InputError, match="did not finish"):
        load(run)
    done = subprocess.run(
        sh.cmd(*OPTUNA, "--n-trials", "10", "--run-dir", run),
        cwd=sh.repo,
        env=sh.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (run / INCOMPLETE).exists()
    assert load(run).search["method"].startswith("optuna")


def _cli(argv: list) -> tuple[int, str]:
    """(exit code, stderr) of `autopar ARGV` in this process (no signal handlers installed)."""
    import contextlib
    import io
    from unittest import mock

    from autopar.cli import main

    err = io.StringIO()
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(err),
        mock.patch("autopar.measured.hygiene.install_signal_handlers", lambda: None),
    ):
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


@pytest.fixture
def tiny_question(sh):
    q, space = sh.question("tiny", 8, "default")
    return q, space


def _search(q, space, run: Path):
    from autopar.search.run import SearchOptions, run_search

    return run_search(q, SearchOptions(space=space, run_dir=run))


def test_interrupted_while_replacing_files_stays_marked_until_a_rerun(tiny_question, tmp_path, monkeypatch):
    q, space = tiny_question
    run = tmp_path / "run"
    _search(q, space, run)  # a finished run, then a rerun interrupted halfway through replacing its files

    def interrupted(result):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr("autopar.search.run.write_run", interrupted)  # plans.parquet replaced, the rest not
        with pytest.raises(KeyboardInterrupt):
            _search(q, space, run)
    assert (run / INCOMPLETE).exists() and (run / "plans.parquet").exists()
    with pytest.raises(InputError, match="did not finish"):
        load(run)
    for argv in (["report", run], ["compare", run, "--tp 2"], ["export", "--to", "megatron", "--run", run]):
        code, err = _cli(argv)
        assert code == 2 and err.count("\n") == 1 and "did not finish" in err, (argv, err)
    _search(q, space, run)  # the same question again: finishes it
    assert not (run / INCOMPLETE).exists()
    assert load(run).search["plans_evaluated"] > 0


def test_interrupted_before_replacing_keeps_the_complete_run(tiny_question, tmp_path, monkeypatch):
    q, space = tiny_question
    run = tmp_path / "run"
    _search(q, space, run)
    before = (run / "search.json").read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("autopar.search.run.stream", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _search(q, space, run)
    assert not (run / INCOMPLETE).exists()
    assert (run / "search.json").read_bytes() == before
    load(run)


def test_a_new_run_directory_that_fails_is_removed(tiny_question, tmp_path, monkeypatch):
    q, space = tiny_question
    run = tmp_path / "a" / "b" / "run"

    def broken(*args, **kwargs):
        raise InputError("storage down")

    monkeypatch.setattr("autopar.search.run.stream", broken)
    with pytest.raises(InputError):
        _search(q, space, run)
    assert not (tmp_path / "a").exists()


def test_a_marker_of_a_running_worker_does_not_block_readers(tiny_question, tmp_path):
    """A second worker still replacing the shared run directory's files (each atomically) leaves
    it readable; once that worker is gone without finishing, the directory is refused."""
    import json
    import socket
    import sys

    q, space = tiny_question
    run = tmp_path / "run"
    _search(q, space, run)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / INCOMPLETE).write_text(json.dumps({"pid": worker.pid, "host": socket.gethostname()}))
        load(run)
    finally:
        worker.kill()
        worker.wait()
    with pytest.raises(InputError, match="did not finish"):
        load(run)


def test_a_failed_background_write_stops_the_search_and_leaves_no_partial_file(tiny_question, tmp_path, monkeypatch):
    # plans.parquet's row groups are written on a background thread while the next chunk is priced:
    # a disk error there must still stop the search with that error, and leave no partial file
    import pyarrow.parquet as pq

    q, space = tiny_question
    run = tmp_path / "run"

    def disk_full(self, table, row_group_size=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _search(q, space, run)
    assert not (run / "plans.parquet").exists()
    assert not list(run.glob(".plans.parquet.*.tmp"))  # the writer's temporary file (autopar.atomic)
    monkeypatch.undo()
    _search(q, space, run)  # the same question again, with room on the disk: a complete run
    assert load(run).search["plans_evaluated"] > 0 and (run / "plans.parquet").exists()
