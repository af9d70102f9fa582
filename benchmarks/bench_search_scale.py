"""Benchmark of the exhaustive search at three space sizes (benchmarks/spaces/scale-{s,m,l}.yaml,
about 150k, 1.5M and 15M canonical plans of Llama 3 70B): for each, one whole `autopar search`
process (exhaustive, report included) and what it measured itself (search.json's timings):

    plans       canonical plans evaluated
    enumerate/s plans enumerated per second (the walk alone, chunk by chunk, no pricing)
    evaluate/s  plans priced per second through the full cost model (one core)
    process/s   plans per second of the whole process (imports, writing, report)
    wall s      the whole process
    peak RSS    the process's peak resident memory (wait4's ru_maxrss)

Reference: Calculon evaluates 406-748 configurations/s on this 2-core machine with two processes
(issue 14's measurement). Prints figures; asserts nothing.

Run: .venv/bin/python benchmarks/bench_search_scale.py [--sizes s,m,l] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autopar.search.enumerate import Enumerator, Question
from autopar.search.scenarios import global_batch
from autopar.search.space import load_space
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset

HERE = Path(__file__).parent
#: (size, space file, GPUs): the question each space was sized for
SIZES = {"s": ("scale-s.yaml", 256), "m": ("scale-m.yaml", 1024), "l": ("scale-l.yaml", 4096)}
MODEL = "llama3-70b"
CALCULON = "406-748 configurations/s (2 processes, this machine; issue 14)"


def enumerate_rate(space_file: Path, gpus: int) -> tuple[int, float]:
    """Plans enumerated per second: the search's chunked walk alone (trainer axis folded: a row
    stands for one plan per trainer)."""
    space, m = load_space(str(space_file)), get_preset(MODEL)
    q = Question(m, gpus, default_cluster("h100-sxm"), m.seq_len, global_batch(space, m.seq_len, None))
    t = time.perf_counter()
    e = Enumerator(space, q)
    per_row = len(e.trainer_codes)
    n = sum(len(table) * per_row for _, _, table in e.folded_chunks((1 << 16) // per_row))
    return n, n / (time.perf_counter() - t)


def search_process(space_file: Path, gpus: int, run_dir: Path) -> dict:
    """One whole `autopar search` process: wall time, peak RSS and its own timings."""
    cmd = [
        sys.executable,
        "-m",
        "autopar",
        "search",
        "--model",
        MODEL,
        "--gpus",
        str(gpus),
        "--space",
        str(space_file),
        "--max-exhaustive",
        str(10**9),
        "--run-dir",
        str(run_dir),
    ]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"search failed: {proc.stderr.read().decode()[-2000:]}")
    info = json.loads((run_dir / "search.json").read_text())
    return {
        "wall_s": wall,
        "peak_rss_gib": usage.ru_maxrss * 1024 / 2**30,
        "plans": info["plans_evaluated"],
        "evaluate_s": info["timings_s"]["evaluate_s"],
        "total_s": info["timings_s"]["total_s"],
        "report_mb": (run_dir / "report.html").stat().st_size / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="s,m,l", help="which spaces: s, m, l (comma list)")
    ap.add_argument("--keep", type=Path, help="keep the run directories here")
    args = ap.parse_args()
    print(
        f"{'space':8} {'plans':>11} {'enumerate/s':>12} {'evaluate/s':>11} {'process/s':>10} {'wall s':>7} "
        f"{'peak RSS':>9} {'report':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        for size in args.sizes.split(","):
            name, gpus = SIZES[size]
            space_file = HERE / "spaces" / name
            n, enum_rate = enumerate_rate(space_file, gpus)
            r = search_process(space_file, gpus, base / f"scale-{size}")
            print(
                f"scale-{size:2} {r['plans']:>11,} {enum_rate:>12,.0f} {r['plans'] / r['evaluate_s']:>11,.0f} "
                f"{r['plans'] / r['wall_s']:>10,.0f} {r['wall_s']:>7.1f} {r['peak_rss_gib']:>6.2f} GiB "
                f"{r['report_mb']:>4.1f} MB",
                flush=True,
            )
    print(f"reference: Calculon {CALCULON}")


if __name__ == "__main__":
    main()
