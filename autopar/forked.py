"""Independent jobs of one command on the machine's cores: the scenarios of a what-if, their
reports. Workers are forked (Linux), so they start with everything the parent has imported and
loaded and receive nothing by pickling; only each job's result travels back. On one core, or for
one job, the jobs run here in order, as before.

An interrupt (SIGINT, SIGTERM) ends the workers quietly and the parent as usual
(autopar.measured.hygiene: a forked child exits at once; the parent runs its cleanups and kills its
children). A run directory a killed worker was writing stays marked incomplete for a rerun to
finish (autopar.search.run_state), as after any crash. A worker that dies on its own (the kernel's
out-of-memory killer, a crash) loses nothing either: the jobs left without a result run here, one
at a time (a rerun of a search resumes the run directory its worker left marked incomplete)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

#: the jobs of the map the workers serve: set before the pool forks, read by index in the workers
_jobs: list = []


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return 1


def _run_job(i: int):
    return _jobs[i]()


def forked_map(jobs: Sequence[Callable[[], T]], done: Callable[[int, T], None] | None = None) -> list[T]:
    """Each job's result, in order, the jobs spread over min(jobs, cores) forked workers; `done(i,
    result)` here as job i's result arrives (while the others still run). A job's exception is raised
    here (the first in order)."""
    workers = min(len(jobs), usable_cores())
    if workers < 2 or not hasattr(os, "fork"):
        results = []
        for i, job in enumerate(jobs):
            results.append(job())
            if done is not None:
                done(i, results[-1])
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    _jobs[:] = jobs
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_run_job, i) for i in range(len(jobs))]
            index = {f: i for i, f in enumerate(futures)}
            try:
                for f in as_completed(futures):
                    if done is not None and f.exception() is None:
                        done(index[f], f.result())
            except BrokenProcessPool:  # a worker died: what it and the others had not finished runs here
                pass
        results = []
        for job, f in zip(jobs, futures):
            lost = f.cancelled() or isinstance(f.exception(), BrokenProcessPool)
            results.append(job() if lost else f.result())  # a job's own error is raised as it was
        return results
    finally:
        _jobs.clear()
