"""Benchmark of `autopar validate --runs FILE` on a large calibration CSV (10,000 valid rows should
validate in under 5 s, as --json and as a table): the bundled rows repeated (with new row ids) to N rows, timed as a
whole process, and the library's stages timed apart (reading and the per-row range checks, building
the cases, predicting them), so the stage that needs to be faster is named.

Prints figures; asserts nothing.

Run: .venv/bin/python benchmarks/bench_validate_runs.py [--rows N]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_checks import row_problem
from autopar.calibration.run_rows import bundled_runs, load_runs
from autopar.calibration.validation import evaluate_cases


def big_csv(path: Path, n: int) -> Path:
    """The bundled rows, repeated to `n` rows with distinct row ids."""
    rows = bundled_runs()
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        for i in range(n):
            w.writerow(dict(rows[i % len(rows)], row_id=str(100_000 + i)))
    return path


def timed(f, *args):
    t = time.perf_counter()
    out = f(*args)
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = big_csv(Path(tmp) / "runs.csv", args.rows)
        print(f"{args.rows:,} rows, {path.stat().st_size / 2**20:.1f} MiB")
        rows, t_read = timed(load_runs, path)
        _, t_check = timed(lambda: [row_problem(r) for r in rows])
        (cases, skipped), t_build = timed(build_cases, rows)  # the checks included
        _, t_eval = timed(evaluate_cases, cases, skipped, None)
        print(f"read {t_read:.2f} s; range checks {t_check:.2f} s")
        print(f"build the cases {t_build:.2f} s ({len(cases):,} cases, {len(skipped):,} skipped)")
        print(f"predict them {t_eval:.2f} s")
        for how, extra in (("--json", ["--json"]), ("table", [])):
            t = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-m", "autopar", "validate", "--runs", str(path), *extra],
                capture_output=True,
                text=True,
                env={**os.environ, "COLUMNS": "120"},
            )
            wall = time.perf_counter() - t
            lines = p.stdout.count("\n")
            print(
                f"autopar validate --runs, {how} (whole process): {wall:.1f} s (goal 5 s), "
                f"{lines:,} lines, exit {p.returncode}"
            )
        print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
