"""The jobs of one command on the machine's cores (autopar.forked): each job's result in order, from
forked workers when there are cores for them and here otherwise, a job's error raised here; and a
what-if searched and reported on two workers gives the files one core gives."""

from __future__ import annotations

import os
import signal
from functools import partial

import pytest

from autopar import forked
from autopar.errors import InputError


def _pid_and(i: int) -> tuple[int, int]:
    return os.getpid(), i


def _fails(i: int) -> int:
    if i == 1:
        raise InputError("job 1 cannot run: fix it")
    return i


def test_jobs_run_on_forked_workers_in_order(monkeypatch):
    monkeypatch.setattr(forked, "usable_cores", lambda: 2)
    seen: dict[int, tuple[int, int]] = {}
    out = forked.forked_map([partial(_pid_and, i) for i in range(5)], done=seen.__setitem__)
    assert [i for _, i in out] == list(range(5))
    assert os.getpid() not in {pid for pid, _ in out}  # none ran here
    assert seen == dict(enumerate(out))  # each result handed over here as it arrived


def test_on_one_core_the_jobs_run_here(monkeypatch):
    monkeypatch.setattr(forked, "usable_cores", lambda: 1)
    out = forked.forked_map([partial(_pid_and, i) for i in range(3)])
    assert out == [(os.getpid(), 0), (os.getpid(), 1), (os.getpid(), 2)]


@pytest.mark.parametrize("cores", [1, 2])
def test_a_jobs_error_is_raised_here_as_it_was(monkeypatch, cores):
    monkeypatch.setattr(forked, "usable_cores", lambda: cores)
    with pytest.raises(InputError, match="^job 1 cannot run: fix it$"):
        forked.forked_map([partial(_fails, i) for i in range(3)])


_PARENT = os.getpid()


def _dies_in_a_worker(i: int) -> tuple[int, int]:
    """Killed (as the out-of-memory killer would) when run in a worker; its result when run here."""
    if i == 2 and os.getpid() != _PARENT:
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid(), i


def test_a_worker_that_dies_loses_no_job(monkeypatch):
    monkeypatch.setattr(forked, "usable_cores", lambda: 2)
    out = forked.forked_map([partial(_dies_in_a_worker, i) for i in range(5)])
    assert [i for _, i in out] == list(range(5))
    assert out[2][0] == os.getpid()  # the killed worker's job ran here


def test_workers_are_bounded_by_cores_and_free_ram(monkeypatch):
    """One worker per usable core and per WORKER_BYTES of free RAM: 8 cores with 2.5 GiB free run 2
    workers, with 0.5 GiB free none but this process; never more workers than jobs."""
    monkeypatch.setattr(forked, "usable_cores", lambda: 8)
    gib = 2**30
    monkeypatch.setattr(forked, "ram_bytes", lambda: (64.0 * gib, 2.5 * gib))
    assert forked.WORKER_BYTES == gib
    assert forked.workers_for(6) == 2
    monkeypatch.setattr(forked, "ram_bytes", lambda: (64.0 * gib, 0.5 * gib))
    assert forked.workers_for(6) == 1
    out = forked.forked_map([partial(_pid_and, i) for i in range(3)])
    assert {pid for pid, _ in out} == {os.getpid()}  # too little RAM for a worker: here, in order
    monkeypatch.setattr(forked, "ram_bytes", lambda: (64.0 * gib, 60.0 * gib))
    assert forked.workers_for(3) == 3 and forked.workers_for(20) == 8
