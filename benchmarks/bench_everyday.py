"""Benchmark of the everyday commands, each one whole `autopar` process as a user starts it
(interpreter start and imports included), against the goals of issue 26:

    --help                      autopar --help                                   goal <= 0.3 s
    bad input                   autopar search --model 70b --gpus -8 (exit 2)    goal <= 0.3 s
    main job                    autopar search --model 70b --gpus 256            goal <= 1 s
    6-scenario what-if          --gpus 512,1024,2048 --gpu h100-sxm,b200         goal <= 3 s
    14 M-plan space             benchmarks/spaces/scale-l.yaml, 70B / 4,096      goal <= 15 s

Each command runs once to warm up, then `--repeat` times (the 14 M-plan space once); the median is printed with the
machine's load average, since on a shared 2-core machine a busy neighbour doubles a figure, and
with the process's CPU seconds (user + system), which a neighbour changes far less: compare
before and after on CPU seconds when the machine is shared. `--root` times another checkout's
autopar (e.g. `git archive main | tar -x -C /tmp/before`), so that before and after run back to
back in the same conditions. The timings are recorded in docs/benchmarks.md. Prints figures;
asserts nothing.

Run: .venv/bin/python benchmarks/bench_everyday.py [--repeat N] [--skip-large] [--root DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
AUTOPAR = [sys.executable, "-m", "autopar"]
WHAT_IF = ["--gpus", "512,1024,2048", "--gpu", "h100-sxm,b200"]


def case_list(run_dir: Path) -> list[tuple[str, list[str], int, float, int]]:
    """(name, arguments, expected exit code, goal in seconds, repeats factor)."""
    return [
        ("--help", ["--help"], 0, 0.3, 1),
        ("bad input", ["search", "--model", "70b", "--gpus", "-8"], 2, 0.3, 1),
        ("main job", ["search", "--model", "70b", "--gpus", "256", "--run-dir", str(run_dir / "main")], 0, 1.0, 1),
        (
            "6-scenario what-if",
            ["search", "--model", "70b", *WHAT_IF],  # a what-if writes under reports/ of the cwd
            0,
            3.0,
            1,
        ),
        (
            "14 M-plan space",
            [
                "search",
                "--model",
                "llama3-70b",
                "--gpus",
                "4096",
                "--space",
                str(HERE / "spaces" / "scale-l.yaml"),
                "--max-exhaustive",
                str(10**9),
                "--run-dir",
                str(run_dir / "large"),
            ],
            0,
            15.0,
            0,
        ),
    ]


def timed(args: list[str], expect: int, cwd: Path, root: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one whole process; stops the benchmark if it
    exits otherwise than expected."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(
        [*AUTOPAR, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd, env=_env(root)
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != expect:
        raise SystemExit(f"autopar {' '.join(args)} exited {proc.returncode}, not {expect}: {proc.stderr[-1500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _env(root: Path) -> dict[str, str]:
    """The checkout's autopar first on the path, whatever the cwd, with bytecode caching on: a
    user's installed package has its .pyc files, and an environment with PYTHONDONTWRITEBYTECODE
    would otherwise compile every module on every start (about 0.5 s of the main job)."""
    root = str(root)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per command (median printed)")
    ap.add_argument("--skip-large", action="store_true", help="leave out the 14 M-plan space")
    ap.add_argument(
        "--root", type=Path, default=HERE.parent, help="the checkout whose autopar is timed (default: this one)"
    )
    args = ap.parse_args()
    print(f"autopar of {args.root.resolve()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"{'command':22} {'median s':>9} {'min s':>7} {'CPU s':>7} {'goal s':>7}  met  load (1 min)")
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv, expect, goal, factor in case_list(Path(tmp)):
            if factor == 0 and args.skip_large:
                continue
            timed(argv, expect, Path(tmp), args.root)  # warm-up: writes the bytecode caches, fills the page cache
            runs = [timed(argv, expect, Path(tmp), args.root) for _ in range(max(1, args.repeat * factor))]
            med = statistics.median(w for w, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            print(
                f"{name:22} {med:>9.2f} {min(w for w, _ in runs):>7.2f} {cpu:>7.2f} {goal:>7.1f}  "
                f"{'yes' if med <= goal else 'no ':3}  {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
