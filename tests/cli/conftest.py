"""Shared fixtures of the CLI tests: `autopar` run in this process (fast enough for property tests),
and the one-line error contract every bad input must meet."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace
from unittest import mock

import pytest


def _run_in_process(*args) -> SimpleNamespace:
    """autopar.cli.main(ARGS) in this process: returncode, stdout, stderr as a subprocess would see
    them. The signal handlers are not installed (they would os._exit pytest). An exception that
    escapes main (a traceback for the user) propagates and fails the test."""
    from autopar.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        mock.patch("autopar.measured.hygiene.install_signal_handlers", lambda: None),
    ):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def _one_line_error(r: SimpleNamespace, needles=(), absent=()) -> str:
    """Assert the contract of bad input: exit 2, exactly one stderr line `autopar: error: ...`
    holding every needle (case-insensitive) and none of `absent`, nothing on stdout. Returns the line."""
    shown = f"exit {r.returncode}\n--- stderr\n{r.stderr[-3000:]}--- stdout\n{r.stdout[-1000:]}"
    assert r.returncode == 2, shown
    lines = r.stderr.splitlines()
    assert len(lines) == 1, f"stderr must be exactly one line\n{shown}"
    line = lines[0]
    assert line.startswith("autopar: error: ") and line.removeprefix("autopar: error: ").strip(), shown
    for word in needles:
        assert word.lower() in line.lower(), f"expected {word!r} in the error line\n{shown}"
    for word in absent:
        assert word.lower() not in line.lower(), f"{word!r} must not be in the error line\n{shown}"
    assert r.stdout == "", f"nothing may be printed on stdout on an input error\n{shown}"
    return line


@pytest.fixture(scope="session")
def cli_run():
    """cli_run(*args) -> (returncode, stdout, stderr) of `autopar ARGS`, run in this process."""
    return _run_in_process


@pytest.fixture(scope="session")
def one_line_error():
    """one_line_error(result, needles=(), absent=()) -> the error line, asserting the contract."""
    return _one_line_error
