"""Benchmark: wall time of `autopar estimate` (whole process, imports included) and of the
vectorised cost model on many plans. Prints figures; asserts nothing.

Run: .venv/bin/python benchmarks/bench_estimate.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import numpy as np

CMD = [
    sys.executable,
    "-m",
    "autopar",
    "estimate",
    "--model",
    "70b",
    "--gpus",
    "256",
    "--tp",
    "8",
    "--pp",
    "4",
    "--seq-len",
    "8192",
    "--gbs",
    "512",
]


def cli_wall(repeats: int = 5) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(CMD, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


def table_throughput(n: int = 20000) -> tuple[int, float]:
    from autopar.calibration.estimate import estimate_table
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import get_preset
    from autopar.spec.table import PlanTable

    rng = np.random.default_rng(0)
    tp = rng.choice([1, 2, 4, 8], n)
    pp = rng.choice([1, 2, 4, 8], n)
    table = PlanTable.from_columns(
        tp=tp,
        pp=pp,
        dp=256 // (tp * pp),
        micro_batch_size=rng.choice([1, 2], n),
        global_batch_size=np.full(n, 512),
        zero_stage=rng.choice([0, 1, 2, 3], n),
    )
    model, cluster = get_preset("70b"), default_cluster("h100-sxm")
    t = time.perf_counter()
    estimate_table(table, model, cluster, num_gpus=256, seq_len=8192)
    return n, time.perf_counter() - t


if __name__ == "__main__":
    walls = cli_wall()
    print(
        f"autopar estimate (70B, 256 GPUs, tp8 pp4), whole process: median {statistics.median(walls):.3f} s, "
        f"min {min(walls):.3f} s, max {max(walls):.3f} s over {len(walls)} runs"
    )
    n, secs = table_throughput()
    print(f"vectorised estimate_table: {n} plans in {secs:.3f} s = {n / secs:,.0f} plans/s")
