"""Terminal output of `autopar search`: progress, the top-k table, the winner's reason, what-if."""

from __future__ import annotations

import math
import time

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autopar.cli.render import console
from autopar.search.run import SearchResult
from autopar.spec.hardware import GIB


class SearchProgress:
    """A progress bar that appears only once an operation has run for more than a second."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.start = time.perf_counter()
        self.progress: Progress | None = None
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()

    def update(self, label: str, done: int, total: int) -> None:
        if not self.enabled or time.perf_counter() - self.start < 1.0:
            return
        if self.progress is None:
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=True,
                console=Console(stderr=True),
            )
            self.progress.start()
        if label not in self.tasks:
            self.tasks[label] = self.progress.add_task(label, total=total)
        self.progress.update(self.tasks[label], completed=done, total=total)


def top_table(r: SearchResult) -> Table:
    q = r.question
    t = Table(
        box=box.SIMPLE_HEAD,
        title=f"Top {len(r.top)} of {r.counts['fit']:,} plans that fit "
        f"({q.model.name}, {q.num_gpus} x {q.cluster.gpu.key}, seq {q.seq_len}, gbs {q.global_batch_size})",
        title_justify="left",
    )
    for col in (
        "#",
        "layout",
        "schedule",
        "stages",
        "recompute",
        "ZeRO",
        "mbs",
        "memory GiB",
        "step s",
        "tokens/s",
        "MFU",
        "bubble",
        "dominant cost",
        "runs on",
    ):
        t.add_column(
            col,
            justify="left"
            if col in ("layout", "schedule", "stages", "recompute", "dominant cost", "runs on")
            else "right",
        )
    run = r.options.training
    for col in run_headers(run):
        t.add_column(col, justify="right")
    cap = q.cluster.gpu.hbm_bytes / GIB
    for i, (_, row) in enumerate(r.top.iterrows(), start=1):
        sched = row["pp_schedule"] if row["pp"] > 1 else "-"
        t.add_row(
            str(i),
            str(row["plan_name"]) + (" +tpo" if row["tp_comm_overlap"] else ""),
            sched,
            stage_balance(row),
            row["recompute"],
            str(row["zero_stage"]),
            str(row["micro_batch_size"]),
            f"{row['memory_gib']:.1f} / {cap:.0f}",
            f"{row['step_time_s']:.3f}",
            f"{row['tokens_per_s']:,.0f}",
            f"{100 * row['mfu']:.1f}%",
            f"{100 * row['bubble_fraction']:.1f}%",
            str(row["dominant_cost"]),
            _runs_on(row),
            *run_cells(row, run),
        )
    return t


def run_headers(run) -> list[str]:
    """The whole-run columns of a table (none without --tokens)."""
    if run is None:
        return []
    return ["days", "goodput", "GPU-hours"] + (["cost"] if run.priced else [])


def run_cells(row, run) -> list[str]:
    """A plan's whole-run cells (run_headers): days to train after goodput, GPU-hours, cost."""
    from autopar.spec.training_run import money_text, never_text

    if run is None:
        return []
    late = run.deadline_s is not None and not bool(row.get("meets_deadline", True))
    over = run.budget is not None and not bool(row.get("within_budget", True))
    cells = [
        never_text(float(row["days"]), "{:.1f}") + (" late" if late else ""),
        f"{100 * row['goodput']:.1f}%",
        never_text(float(row["gpu_hours"]) / 1e6, "{:.3g}M"),
    ]
    cost = float(row["cost"])
    return cells + (
        [never_text(cost, "{}") if not math.isfinite(cost) else money_text(cost) + (" over" if over else "")]
        if run.priced
        else []
    )


def _runs_on(row) -> str:
    """The trainers that can run the plan; the one it is timed on (the fastest) first if they differ."""
    names = str(row["trainers"]).split(", ")
    return ", ".join([row["trainer"]] + [n for n in names if n != row["trainer"]]) if len(names) > 1 else names[0]


def trainer_table(r: SearchResult) -> Table:
    """The best plan each searched trainer can run, side by side."""
    from autopar.spec.trainers import get_trainer

    t = Table(box=box.SIMPLE_HEAD, title="The best plan per trainer", title_justify="left")
    for col in (
        "trainer",
        "layout",
        "schedule",
        "recompute",
        "ZeRO",
        "mbs",
        "memory GiB",
        "step s",
        "tokens/s",
        "MFU",
        "vs best",
    ):
        t.add_column(col, justify="left" if col in ("trainer", "layout", "schedule", "recompute") else "right")
    best = r.winner
    for name, row in r.per_trainer.items():
        title = get_trainer(name).title
        if row is None:
            t.add_row(title, "nothing fits", *[""] * 9)
            continue
        slower = row["step_time_s"] / best["step_time_s"] - 1 if best is not None else 0.0
        t.add_row(
            title,
            str(row["plan_name"]) + (" +tpo" if row["tp_comm_overlap"] else ""),
            row["pp_schedule"] if row["pp"] > 1 else "-",
            row["recompute"],
            str(row["zero_stage"]),
            str(row["micro_batch_size"]),
            f"{row['memory_gib']:.1f}",
            f"{row['step_time_s']:.3f}",
            f"{row['tokens_per_s']:,.0f}",
            f"{100 * row['mfu']:.1f}%",
            "best" if slower <= 1e-12 else f"+{100 * slower:.1f}%",
        )
    return t


def stage_balance(row) -> str:
    """'-' without a pipeline, 'even', or the uneven layout's busiest-rank imbalance."""
    if row["pp"] == 1:
        return "-"
    imb = float(row["stage_imbalance"])
    return "even" if imb <= 1.0 + 1e-9 else f"uneven {imb:.2f}x"


def print_result(r: SearchResult) -> None:
    c = console()
    n, valid, fit = r.counts["evaluated"], r.counts["valid"], r.counts["fit"]
    if not r.top.empty:
        c.print(top_table(r))
        if len(r.per_trainer) > 1:
            c.print(trainer_table(r))
    c.print(f"[bold]{r.why}[/bold]")
    how = (
        "exhaustive: every plan of the space evaluated, so this is the exact optimum of the cost model"
        if r.method == "exhaustive"
        else f"{r.method}: Optuna sampled the space ({len(r.history)} trials)"
    )
    c.print(f"{n:,} plans evaluated ({valid:,} valid, {fit:,} fit) in {r.timings.get('total_s', 0):.2f} s; {how}.")
    if r.rejections:
        c.print("Rejected by: " + ", ".join(f"{k} ({v:,})" for k, v in list(r.rejections.items())[:6]))
    files = (
        "plans.parquet, "
        + ("plans.csv, " if r.options.csv else "")
        + "top.json, scatter.parquet, search.json"
        + ("" if r.method == "exhaustive" else ", study.db")
    )
    c.print(f"Results: {r.run_dir}/ ({files})")


def print_whatif(results: list[SearchResult]) -> None:
    t = Table(box=box.SIMPLE_HEAD, title="What-if: the best plan per scenario", title_justify="left")
    run = results[0].options.training
    cols = [
        "GPUs",
        "GPU",
        "seq",
        "gbs",
        "best layout",
        "schedule",
        "recompute",
        "memory GiB",
        "step s",
        "tokens/s",
        "tokens/s/GPU",
        "MFU",
    ] + run_headers(run)
    for col in cols:
        t.add_column(col, justify="left" if col in ("GPU", "best layout", "schedule", "recompute") else "right")
    for r in results:
        q, w = r.question, r.winner
        if w is None:
            t.add_row(
                str(q.num_gpus),
                q.cluster.gpu.key,
                str(q.seq_len),
                str(q.global_batch_size),
                "nothing fits",
                *[""] * (len(cols) - 5),
            )
            continue
        t.add_row(
            str(q.num_gpus),
            q.cluster.gpu.key,
            str(q.seq_len),
            str(q.global_batch_size),
            str(w["plan_name"]),
            w["pp_schedule"] if w["pp"] > 1 else "-",
            w["recompute"],
            f"{w['memory_gib']:.1f}",
            f"{w['step_time_s']:.3f}",
            f"{w['tokens_per_s']:,.0f}",
            f"{w['tokens_per_s_per_gpu']:,.0f}",
            f"{100 * w['mfu']:.1f}%",
            *run_cells(w, run),
        )
    c = console()
    c.print(t)
    for r in results:
        c.print(f"  {r.run_dir}: {r.why}")


def print_answer(answer) -> None:
    """The whole run's answers (autopar.search.training.check_run), one line each."""
    c = console()
    for line in answer.lines:
        c.print(f"[bold]{line}[/bold]")
