"""Independent jobs of one command on the machine's cores: the scenarios of a what-if, their
reports. Workers are forked (Linux), so they start with everything the parent has imported and
loaded and receive nothing by pickling; only each job's result travels back. On one core (or with
RAM free for one worker only), or for one job, the jobs run here in order, as before.

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

from autopar.processes import ram_bytes, usable_cores

T = TypeVar("T")

#: the jobs of the map the workers serve: set before the pool forks, read by index in the workers
_jobs: list = []


#: RAM set aside per worker: a search holds about 0.3 GiB at its peak, up to 14 M plans
#: (docs/benchmarks.md), and a report less; a GiB each leaves the rest of the machine its room
WORKER_BYTES = 2**30


def workers_for(jobs: int) -> int:
    """Workers for `jobs` jobs: at most one per usable core (affinity, CPU quota) and one per
    WORKER_BYTES of available RAM (cgroup limit included), at least one."""
    return max(1, min(jobs, usable_cores(), int(ram_bytes()[1] // WORKER_BYTES)))


def _run_job(i: int):
    return _jobs[i]()


def forked_map(jobs: Sequence[Callable[[], T]], done: Callable[[int, T], None] | None = None) -> list[T]:
    """Each job's result, in order, the jobs spread over `workers_for(jobs)` forked workers; `done(i,
    result)` here as job i's result arrives (while the others still run). A job's exception is raised
    here (the first in order)."""
    workers = workers_for(len(jobs))
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
