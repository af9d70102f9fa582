"""`autopar search`: enumerate and evaluate the whole space (exact, vectorised), or let Optuna
sample it when it is too large; rank what fits; persist everything in the run directory."""

from __future__ import annotations

import json
import platform
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from autopar import __version__
from autopar.cost.estimate import AXES, MEMORY_TERMS, TIME_TERMS, estimate_table
from autopar.search.atomic import write_atomic, write_with
from autopar.search.enumerate import Question, enumerate_plans, space_size
from autopar.search.results import best_per_trainer, frame, pareto_front, row_plan, top_plans, why_winner
from autopar.search.space import SearchSpace
from autopar.spec.hardware import GIB
from autopar.spec.table import PlanTable
from autopar.spec.trainers import TRAINERS

DEFAULT_MAX_EXHAUSTIVE = 2_000_000


@dataclass
class SearchOptions:
    space: SearchSpace
    top_k: int = 10
    max_exhaustive: int = DEFAULT_MAX_EXHAUSTIVE
    sampler: str = "tpe"
    n_trials: int = 200
    seed: int | None = None
    storage: str | None = None
    study_name: str | None = None
    multi_objective: bool = False
    run_dir: Path | None = None


@dataclass
class SearchResult:
    question: Question
    options: SearchOptions
    plans: pd.DataFrame  # every evaluated plan
    top: pd.DataFrame  # the top-k that fit, fastest first
    method: str  # "exhaustive" | "optuna-<sampler>"
    why: str
    run_dir: Path
    timings: dict = field(default_factory=dict)
    layouts: list = field(default_factory=list)
    history: list = field(default_factory=list)
    per_trainer: dict = field(default_factory=dict)  # trainer -> its fastest fitting plan (a row), or None

    @property
    def winner(self) -> pd.Series | None:
        return None if self.top.empty else self.top.iloc[0]


def run_slug(q: Question, space: SearchSpace) -> str:
    """A stable run-directory name from the question, so a rerun finds (and resumes) its study."""
    raw = f"{q.model.name}_{q.num_gpus}x{q.cluster.gpu.key}_s{q.seq_len}_gbs{q.global_batch_size}_{space.name}"
    if set(q.trainers) != set(TRAINERS):
        raw += "_" + "+".join(q.trainers)
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", raw)


def _apply_headroom(df: pd.DataFrame, headroom_gib: float) -> None:
    if headroom_gib <= 0:
        return
    limit = df["memory_capacity_bytes"] - headroom_gib * GIB
    over = df["valid"] & (df["peak_memory_bytes"] > limit)
    df.loc[over, "fits"] = False
    df.loc[over, "rejected_by"] = "memory"
    df.loc[over, "memory_miss_gib"] = (df.loc[over, "peak_memory_bytes"] - limit[over]) / GIB


def evaluate(table: PlanTable, q: Question, headroom_gib: float) -> pd.DataFrame:
    est = estimate_table(table, q.model, q.cluster, num_gpus=q.num_gpus, seq_len=q.seq_len)
    df = frame(table, est)
    _apply_headroom(df, headroom_gib)
    return df


def row_summary(row: pd.Series, layouts) -> dict:
    """A plan and its estimate as plain data (top.json entries, Optuna user attributes)."""
    plan = row_plan(row, layouts)
    return {
        "plan_name": str(row["plan_name"]),
        "trainer": str(row["trainer"]),
        "plan": plan.to_dict(),
        "fits": bool(row["fits"]),
        "rejected_by": str(row["rejected_by"]),
        "step_time_s": float(row["step_time_s"]),
        "tokens_per_s": float(row["tokens_per_s"]),
        "tokens_per_s_per_gpu": float(row["tokens_per_s_per_gpu"]),
        "model_tflops_per_gpu": float(row["model_tflops_per_gpu"]),
        "mfu": float(row["mfu"]), "hfu": float(row["hfu"]),
        "bubble_fraction": float(row["bubble_fraction"]),
        "peak_memory_bytes": float(row["peak_memory_bytes"]),
        "memory_capacity_bytes": float(row["memory_capacity_bytes"]),
        "memory_bytes": {t: float(row[f"mem_{t}"]) for t in MEMORY_TERMS},
        "time_s": {t: float(row[f"time_{t}"]) for t in TIME_TERMS},
        "comm_bytes_per_gpu": {a: float(row[f"comm_bytes_{a}"]) for a in AXES},
        "dominant_cost": str(row["dominant_cost"]),
        "layout": str(row["layout_text"]),
    }


def run_search(q: Question, opts: SearchOptions, progress: Callable[[str, int, int], None] | None = None) -> SearchResult:
    """Answer the question under the space; write the run directory; return the result."""
    t0 = time.perf_counter()
    run_dir = opts.run_dir or Path("reports") / run_slug(q, opts.space)
    headroom = float(opts.space.constraints.get("memory_headroom_gib", 0.0))
    size = space_size(opts.space, q)
    timings: dict[str, float] = {}
    history: list = []
    if size <= opts.max_exhaustive:
        method = "exhaustive"
        table = enumerate_plans(opts.space, q)
        run_dir.mkdir(parents=True, exist_ok=True)
        timings["enumerate_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        df = evaluate(table, q, headroom)
        timings["evaluate_s"] = time.perf_counter() - t1
        layouts = table.layouts
    else:
        method = f"optuna-{opts.sampler}"
        run_dir.mkdir(parents=True, exist_ok=True)
        df, layouts, history = _optuna_search(q, opts, run_dir, headroom, progress)
        timings["optuna_s"] = time.perf_counter() - t0
    top = top_plans(df, opts.top_k)
    runner = top.iloc[1] if len(top) > 1 else None
    why = why_winner(top.iloc[0], runner) if len(top) else _no_fit_reason(df)
    result = SearchResult(question=q, options=opts, plans=df, top=top, method=method, why=why, run_dir=run_dir,
                          timings=timings, layouts=layouts, history=history, per_trainer=best_per_trainer(df))
    t2 = time.perf_counter()
    write_run(result)
    timings["write_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    _write_search_json(result)
    return result


def _no_fit_reason(df: pd.DataFrame) -> str:
    valid = df[df["valid"]]
    if valid.empty:
        reasons = df["rejected_by"].str.split(", ").explode().value_counts()
        return f"No plan is valid; the most common broken rules: {', '.join(reasons.index[:3])}."
    best = valid.sort_values("memory_miss_gib").iloc[0]
    return (f"No plan fits in memory; the closest is {best['plan_name']} ({best['recompute']} recompute, "
            f"zero {best['zero_stage']}), {best['memory_miss_gib']:.1f} GiB over. Add GPUs, or widen the space "
            f"(more pp/tp, full recompute, zero 3).")


def _optuna_search(q: Question, opts: SearchOptions, run_dir: Path, headroom: float, progress):
    from autopar.search import optuna_driver as od

    url = od.storage_url(opts.storage, run_dir)
    name = opts.study_name or run_dir.name
    directions = ["minimize", "maximize"] if opts.multi_objective else ["minimize"]
    study = od.load_or_create_study(url, name, od.make_sampler(opts.sampler, opts.seed, opts.multi_objective),
                                    directions)
    od.fail_stale(study, older_than_s=5.0)
    od.run_study(opts.space, q, study, opts.n_trials, lambda table: evaluate(table, q, headroom),
                 opts.multi_objective,
                 on_trial=(lambda n: progress("optuna trials", n, opts.n_trials)) if progress else None)
    # every completion of every structure any worker tried, re-evaluated in one vectorised pass
    trials = [t for t in study.get_trials(deepcopy=False) if "outer" in t.user_attrs]
    first_seen: dict[tuple, int] = {}
    for t in trials:
        first_seen.setdefault(tuple(sorted(t.user_attrs["outer"].items())), t.number)
    outers = [dict(k) for k in first_seen]
    table = od.structures_table(opts.space, q, outers)
    df = evaluate(table, q, headroom)
    return df, table.layouts, od.study_history(study)


def write_run(result: SearchResult) -> None:
    """plans.parquet + plans.csv (every evaluated plan), top.json (top-k with full breakdowns)."""
    d = result.run_dir
    # atomically: several workers sharing a run directory each write these (search --trials)
    write_with(d / "plans.parquet", lambda tmp: result.plans.to_parquet(tmp, index=False))
    write_with(d / "plans.csv", lambda tmp: result.plans.to_csv(tmp, index=False))
    top = [row_summary(r, result.layouts) | {"rank": i + 1, "trainers": str(r["trainers"]).split(", ")}
           for i, (_, r) in enumerate(result.top.iterrows())]
    pareto = [row_summary(r, result.layouts)["plan_name"] for _, r in pareto_front(result.plans).iterrows()]
    per_trainer = {t: None if r is None else row_summary(r, result.layouts) for t, r in result.per_trainer.items()}
    write_atomic(d / "top.json", json.dumps({"why": result.why, "top": top, "pareto": pareto,
                                             "per_trainer": per_trainer}, indent=2))


def _write_search_json(result: SearchResult) -> None:
    q, o = result.question, result.options
    from importlib.metadata import version

    info = {
        "autopar_version": __version__,
        "question": {"model": q.model.to_dict(), "num_gpus": q.num_gpus, "cluster": q.cluster.to_dict(),
                     "seq_len": q.seq_len, "global_batch_size": q.global_batch_size, "trainers": list(q.trainers)},
        "space": {"name": o.space.name, "source": o.space.source, "knobs": o.space.knobs,
                  "constraints": o.space.constraints},
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items() if k != "space"},
        "method": result.method,
        "plans_evaluated": int(len(result.plans)),
        "plans_valid": int(result.plans["valid"].sum()),
        "plans_fit": int(result.plans["fits"].sum()),
        "why": result.why,
        "timings_s": result.timings,
        "history": result.history,
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "pandas": pd.__version__,
                     "optuna": version("optuna")},
    }
    write_atomic(result.run_dir / "search.json", json.dumps(info, indent=2, default=str))
