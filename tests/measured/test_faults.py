"""Failures are data: a plan forced past a memory limit, a worker that raises and a worker that
hangs are each recorded with the right reason within the timeout, and nothing is left running."""

from __future__ import annotations

import time

import pytest

from autopar.measured.measure import measure_plan

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PLAN = {"dp": 2, "zero_stage": 0, "micro_batch_size": 1, "global_batch_size": 4, "dtype": "fp32"}


def test_oom_crash_hang(tmp_path, procs):
    cases = {
        "oom": (["--memory-limit-mib", "8"], 90),
        "crash": (["--fault", "raise-rank1"], 90),
        "timeout": (["--fault", "hang"], 15),
    }
    for expected, (args, timeout) in cases.items():
        work = tmp_path / expected
        t0 = time.perf_counter()
        doc = measure_plan("tiny", PLAN, 2, steps=1, timeout_s=timeout, workdir=work, worker_args=args)
        assert doc["status"] == expected, (expected, doc["outcome"], doc["reasons"])
        assert doc["reasons"] and not doc["measured"]
        if expected == "oom":
            # the worker's own OutOfMemoryError, or, when the limit kills it before it can write one (a
            # loaded machine), the launcher's out-of-memory outcome (autopar.measured.launcher)
            reasons = " ".join(doc["reasons"])
            assert "OutOfMemoryError" in reasons or "out of memory (allocation failure" in reasons, reasons
        assert time.perf_counter() - t0 < timeout + 20
        assert not procs(str(work)), procs(str(work))
    assert "injected fault" in " ".join(
        measure_plan("tiny", PLAN, 2, steps=1, timeout_s=90, workdir=tmp_path / "r", worker_args=["--fault", "raise"])[
            "reasons"
        ]
    )
