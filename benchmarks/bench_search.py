"""Benchmark of `autopar search`: wall time of the main job (whole process), plans evaluated per
second on the 405B / 16,384 GPU space, and whether Optuna earns its place: forced through Optuna
(`--max-exhaustive 0`), its best predicted step time vs the exhaustive optimum over 5 seeds, and the
trials each seed needed to come within 2 %. Prints figures; asserts nothing.

Run: .venv/bin/python benchmarks/bench_search.py [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autopar.search.enumerate import Question, enumerate_plans
from autopar.search.results import ranked
from autopar.search.run import SearchOptions, evaluate, run_search
from autopar.search.scenarios import global_batch
from autopar.search.space import load_space
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset

CASES = (("llama3-70b", 256), ("llama3.1-405b", 16384))


def main_job_wall(repeats: int = 3) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeats):
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "autopar", "search", "--model", "70b", "--gpus", "256", "--run-dir", d],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            out.append(time.perf_counter() - t)
    return out


def question(model: str, gpus: int, space) -> Question:
    m = get_preset(model)
    return Question(
        model=m,
        num_gpus=gpus,
        cluster=default_cluster("h100-sxm"),
        seq_len=m.seq_len,
        global_batch_size=global_batch(space, m.seq_len, None),
    )


def exhaustive(model: str, gpus: int):
    space = load_space("default")
    q = question(model, gpus, space)
    t = time.perf_counter()
    table = enumerate_plans(space, q)
    df = evaluate(table, q, float(space.constraints.get("memory_headroom_gib", 0)))
    secs = time.perf_counter() - t
    return q, space, len(df), secs, float(ranked(df).iloc[0]["step_time_s"])


def optuna_seeds(q, space, best: float, seeds=range(5), n_trials: int = 200):
    rows = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            res = run_search(
                q,
                SearchOptions(
                    space=space,
                    max_exhaustive=0,
                    n_trials=n_trials,
                    seed=seed,
                    storage=str(Path(d) / "study.log"),
                    run_dir=Path(d),
                ),
            )
            secs = time.perf_counter() - t
        found = float(res.top.iloc[0]["step_time_s"]) if len(res.top) else float("inf")
        needed = next((h["number"] + 1 for h in res.history if h["best_so_far"] <= best * 1.02), None)
        rows.append((seed, found, 100 * (found / best - 1), needed, secs))
    return rows


if __name__ == "__main__":
    walls = main_job_wall()
    print(
        f"autopar search --model 70b --gpus 256 (whole process): median {statistics.median(walls):.2f} s "
        f"(min {min(walls):.2f}, max {max(walls):.2f})"
    )
    for model, gpus in CASES:
        q, space, n, secs, best = exhaustive(model, gpus)
        print(
            f"\n{model} on {gpus} H100, default space: {n:,} plans evaluated in {secs:.3f} s "
            f"({n / secs:,.0f} plans/s); exhaustive optimum {best:.4f} s/step"
        )
        if "--quick" in sys.argv:
            continue
        print(
            "  Optuna (TPE, --max-exhaustive 0, 200 trials):  seed | best step s | gap vs exhaustive | "
            "trials to within 2% | wall s"
        )
        for seed, found, gap, needed, wall in optuna_seeds(q, space, best):
            print(f"  {seed:>4} | {found:11.4f} | {gap:+16.2f}% | {str(needed):>19} | {wall:6.1f}")
