"""Terminal output of `autopar search`: progress, the top-k table, the winner's reason, what-if."""

from __future__ import annotations

import math
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autopar.cli.render import (
    SCHEDULE_SHORT,
    TRAINER_LETTERS,
    Col,
    SafeConsole,
    compact_table,
    console,
    dropped_line,
    fitted_table,
    schedule_legend,
    trainer_legend,
)
from autopar.figures import (
    COST,
    DAYS,
    ENERGY_MWH,
    GOODPUT,
    GPU_HOURS,
    HIGH,
    LOW,
    MEETS_DEADLINE,
    MEMORY_GIB,
    MFU,
    PLAN_NAME,
    STAGE_IMBALANCE,
    STEP_TIME_S,
    SUPPORT,
    SUPPORT_GAPS,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    WITHIN_BUDGET,
)
from autopar.search.run import SearchResult
from autopar.spec.hardware import GIB
from autopar.spec.recompute_modules import recompute_label, recompute_legend
from autopar.spec.rules import rejection_summary
from autopar.spec.trainers import get_trainer
from autopar.terminal import printable


class SearchProgress:
    """A progress bar that appears only once an operation has run for more than a second."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.start = time.perf_counter()
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}

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
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=True,
                console=SafeConsole(stderr=True),
            )
            self.progress.start()
        if label not in self.tasks:
            self.tasks[label] = self.progress.add_task(label, total=total)
        self.progress.update(self.tasks[label], completed=done, total=total)


#: the top table's columns: the layout, its step time and MFU always; the others go, least
#: important first (`drop` 1, 2, ...), when the terminal is too narrow
TOP_COLUMNS = (
    Col("#"),
    Col("layout", left=True),
    Col("sched", left=True, drop=9),
    Col("stages", left=True, drop=7),
    Col("recomp", left=True, drop=10),
    Col("ZeRO", drop=4),
    Col("mbs", drop=5),
    Col("mem GiB", drop=11),
    Col("step s"),
    Col("80% range"),  # the interval and the support stay at any width: how sure the figure is
    Col("tokens/s", drop=1),
    Col("MFU"),
    Col(SUPPORT.header, left=True),
    Col("runs on", left=True, drop=6),
)


def top_table(r: SearchResult, width: int) -> tuple[Table, list[str]]:
    """The top-k table fitted to `width` (autopar.cli.render.fitted_table) and the headers it drops.
    Each row is a structurally different plan (autopar.search.results.STRUCTURE_KEY); '+N' after
    its layout counts the variants folded under it (top.json lists them)."""
    q = r.question
    title = (
        f"Top {len(r.top)} of {r.counts['fit']:,} plans that fit "
        f"({q.model.name}, {q.num_gpus} x {q.cluster.gpu.key}, seq {q.seq_len}, gbs {q.global_batch_size})"
    )
    uneven = any(stage_balance(row) not in ("-", "even") for _, row in r.top.iterrows())
    cols = [c for c in TOP_COLUMNS if c.header != "stages" or uneven]
    cap = q.cluster.gpu.hbm_bytes / GIB
    rows = []
    for i, (_, row) in enumerate(r.top.iterrows(), start=1):
        cells = {
            "#": str(i),
            "layout": layout_cell(row) + variants_text(row),
            "sched": _schedule(row),
            "stages": stage_balance(row),
            "recomp": recompute_label(row["recompute"], row.get("recompute_modules")),
            "ZeRO": str(row["zero_stage"]),
            "mbs": str(row["micro_batch_size"]),
            "mem GiB": f"{row[MEMORY_GIB]:.1f}/{cap:.1f}",  # the capacity as estimate and compare print it
            "step s": f"{row[STEP_TIME_S]:.3f}",
            "80% range": step_range(row),
            "tokens/s": f"{row[TOKENS_PER_S]:,.0f}",
            "MFU": f"{100 * row[MFU]:.1f}%",
            SUPPORT.header: support_cell(row),
            "runs on": _runs_on(row),
        }
        rows.append([cells[c.header] for c in cols])
    return fitted_table(title, cols, rows, width)


def run_table(r: SearchResult) -> Table | None:
    """The whole run of each top plan (with --tokens; its own table, so that the top table fits
    a 120-column terminal): days to train after goodput, GPU-hours, cost."""
    from autopar.spec.training_run import tokens_text

    run = r.options.training
    if run is None or r.top.empty:
        return None
    t = compact_table(f"The whole run of the top plans ({tokens_text(run.tokens)} tokens)")
    for col in ["#", "layout"] + run_headers(run):
        t.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    for i, (_, row) in enumerate(r.top.iterrows(), start=1):
        t.add_row(str(i), str(row[PLAN_NAME]), *run_cells(row, run))
    return t


def _schedule(row) -> str:
    return SCHEDULE_SHORT.get(row["pp_schedule"], row["pp_schedule"]) if row["pp"] > 1 else "-"


def step_range(row) -> str:
    """The step time's 80 % interval, '13.3-15.8' (autopar.calibration.uncertainty)."""
    if LOW[STEP_TIME_S] not in row.index:
        return "-"
    lo, hi = float(row[LOW[STEP_TIME_S]]), float(row[HIGH[STEP_TIME_S]])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "unknown"
    digits = 1 if hi >= 10 else 2 if hi >= 1 else 3
    return f"{lo:.{digits}f}-{hi:.{digits}f}"


def support_cell(row) -> str:
    """'calib' (every knob within published runs of its trainer) or 'extrap' (a reason is in --json)."""
    if SUPPORT_GAPS not in row.index:
        return "-"
    return "calib" if int(row[SUPPORT_GAPS]) == 0 else "extrap"


def run_headers(run) -> list[str]:
    """The whole-run columns of a table (none without --tokens)."""
    if run is None:
        return []
    return [DAYS.header, GOODPUT.header, GPU_HOURS.header] + ([COST.header] if run.priced else []) + [ENERGY_MWH.header]


def run_cells(row, run) -> list[str]:
    """A plan's whole-run cells (run_headers): days to train after goodput, GPU-hours, cost."""
    from autopar.spec.training_run import gpu_hours_text, money_text, never_text

    if run is None:
        return []
    late = run.deadline_s is not None and not bool(row.get(MEETS_DEADLINE, True))
    over = run.budget is not None and not bool(row.get(WITHIN_BUDGET, True))
    cells = [
        never_text(float(row[DAYS]), "{:.1f}") + (" late" if late else ""),
        f"{100 * row[GOODPUT]:.1f}%",
        gpu_hours_text(float(row[GPU_HOURS])),
    ]
    cost = float(row[COST])
    energy = float(row.get(ENERGY_MWH, math.nan))
    return (
        cells
        + (
            [never_text(cost, "{}") if not math.isfinite(cost) else money_text(cost) + (" over" if over else "")]
            if run.priced
            else []
        )
        + [f"{energy:,.0f}" if math.isfinite(energy) else "-"]
    )


def _runs_on(row) -> str:
    """The trainers that can run the plan, abbreviated (TRAINER_LETTERS); the one it is timed on
    (the fastest) first if they differ; then, marked *, those that run an FP8 plan once its FP8
    settings are named as its own trainer runs them (top.json: fp8_flags)."""
    names = str(row["trainers"]).split(", ")
    ordered = [row["trainer"]] + [n for n in names if n != row["trainer"]] if len(names) > 1 else names
    flagged = [n for n in _flagged_trainers(row) if n not in names]
    return " ".join([TRAINER_LETTERS.get(n, n) for n in ordered] + [f"{TRAINER_LETTERS.get(n, n)}*" for n in flagged])


def _flagged_trainers(row) -> list[str]:
    return [n for n in str(row.get("trainers_with_flags", "") or "").split(", ") if n]


#: the flags a layout cell may carry after the plan's name, each with its legend words
FLAG_LEGEND = {
    "+tpo": "TP communication overlap (--tp-comm-overlap)",
    "+deepep": "DeepEP / HybridEP token dispatcher (--moe-dispatcher deepep)",
    "+epo": "EP all-to-all overlap (--ep-comm-overlap)",
}


def layout_flags(row) -> list[str]:
    """The plan's settings that its name does not show and that decide its time: TP overlap, and for a
    plan with expert parallelism its dispatcher and EP overlap (FLAG_LEGEND)."""
    ep = int(row["ep"]) if "ep" in row.index else 1
    return (
        (["+tpo"] if row["tp_comm_overlap"] else [])
        + (["+deepep"] if ep > 1 and row.get("moe_dispatcher") == "deepep" else [])
        + (["+epo"] if ep > 1 and bool(row.get("ep_comm_overlap", False)) else [])
    )


def flags_legend(rows) -> str:
    """'+tpo: TP communication overlap (...), ...' for the flags the rows' layout cells carry; '' for none."""
    used = {f for row in rows for f in layout_flags(row)}
    return ", ".join(f"{f}: {words}" for f, words in FLAG_LEGEND.items() if f in used)


def layout_cell(row) -> str:
    """The layout with its flags (`layout_flags`), +offF (a share F of the optimizer in host memory),
    +act (activations offloaded to host memory)."""
    share = float(row["optimizer_offload"]) if "optimizer_offload" in row.index else 0.0
    acts = int(row["offload_modules"]) if "offload_modules" in row.index else 0
    return (
        " ".join([str(row[PLAN_NAME]), *layout_flags(row)])
        + (f" +off{share:g}" if share > 0 else "")
        + (" +act" if acts else "")
    )


def variants_text(row) -> str:
    """' +2' after a layout with two variants folded under it, '' without."""
    n = int(row["variants"]) if "variants" in row.index else 0
    return f" +{n}" if n else ""


def top_legend(r: SearchResult, shown: list[str]) -> list[str]:
    """The lines under the top table that spell out what its shown columns abbreviate."""
    named = {n for _, row in r.top.iterrows() for n in [*str(row["trainers"]).split(", "), *_flagged_trainers(row)]}
    lines = [trainer_legend(named)] if "runs on" in shown else []
    flags = sorted({str(row["fp8_flags"]) for _, row in r.top.iterrows() if _flagged_trainers(row)})
    if "runs on" in shown and flags:
        named_as = flags[0] if len(flags) == 1 else "the flags top.json gives as fp8_flags"
        lines.append(f"*: runs the plan with its FP8 settings named as its own trainer runs them ({named_as})")
    if "sched" in shown and (schedules := schedule_legend(set(r.top.loc[r.top["pp"] > 1, "pp_schedule"]))):
        lines.append(schedules)
    rows = [row for _, row in r.top.iterrows()] + [w for w in r.per_trainer.values() if w is not None]
    if "recomp" in shown and (
        sel := recompute_legend(recompute_label(w["recompute"], w.get("recompute_modules")) for w in rows)
    ):
        lines.append(sel)
    notes = []
    if legend := flags_legend(rows):
        notes.append(legend)
    if any(variants_text(row) for _, row in r.top.iterrows()):
        notes.append(
            "+N: N more plans of the layout's structure, differing only in mbs, ZeRO, stage layout, recompute or flags "
            "(top.json lists them)"
        )
    if any(float(row.get("optimizer_offload", 0.0)) > 0 for _, row in r.top.iterrows()):
        notes.append("+offF: a share F of the optimizer states offloaded to host memory")
    if any(int(row.get("offload_modules", 0)) for _, row in r.top.iterrows()):
        notes.append("+act: activations offloaded to host memory (--offload-modules)")
    if "80% range" in shown:
        notes.append("80% range: the step time's 80 % interval")
    if SUPPORT.header in shown:
        notes.append("support: calib(rated) or extrap(olated)")
    return lines + (["; ".join(notes)] if notes else [])


def mfu_legend(results: list[SearchResult]) -> str:
    """What the MFU columns divide by: the cost model's `mfu` (autopar.cost.columns) is model FLOPs
    per second per GPU over the GPU's dense BF16 peak, for FP8 plans too (so FP8 plans can pass 100 %)."""
    peaks = {r.question.cluster.gpu.key: r.question.cluster.gpu.bf16_tflops for r in results}
    shown = ", ".join(f"{peak:,.0f} TF/s ({key})" for key, peak in peaks.items())
    fp8 = any("fp8" in (r.options.space.knobs.get("dtype") or []) for r in results)
    return f"MFU vs the dense bf16 peak {shown}" + (", fp8 plans too (not the fp8 peak)" if fp8 else "")


#: the per-trainer table's columns (as TOP_COLUMNS: `drop` 1 goes first)
TRAINER_COLUMNS = (
    Col("trainer", left=True),
    Col("layout", left=True),
    Col("sched", left=True, drop=6),
    Col("recomp", left=True, drop=7),
    Col("ZeRO", drop=3),
    Col("mbs", drop=4),
    Col("mem GiB", drop=8),
    Col("step s"),
    Col("80% range"),
    Col("MFU"),
    Col("vs best", drop=5),
    Col(SUPPORT.header, left=True),
)


def trainer_table(r: SearchResult, width: int) -> tuple[Table, list[str]]:
    """The best plan each searched trainer can run, side by side, fitted to `width`."""
    from autopar.search.run import searched_trainers
    from autopar.search.scenarios import trainers_ruled_out
    from autopar.spec.trainers import get_trainer

    best = r.winner
    rows = []
    ruled_out = trainers_ruled_out(r)
    searched = searched_trainers(r)
    for name, row in r.per_trainer.items():
        title = get_trainer(name).title
        if row is None:
            why = "cannot run it (below)" if name in ruled_out else "nothing fits"
            why = why if name in searched else "not searched"  # the space's trainer knob leaves it out
            rows.append([title, why] + [""] * (len(TRAINER_COLUMNS) - 2))
            continue
        slower = row[STEP_TIME_S] / best[STEP_TIME_S] - 1 if best is not None else 0.0
        rows.append(
            [
                title,
                layout_cell(row),
                _schedule(row),
                recompute_label(row["recompute"], row.get("recompute_modules")),
                str(row["zero_stage"]),
                str(row["micro_batch_size"]),
                f"{row[MEMORY_GIB]:.1f}",
                f"{row[STEP_TIME_S]:.3f}",
                step_range(row),
                f"{100 * row[MFU]:.1f}%",
                "best" if slower <= 1e-12 else f"+{100 * slower:.1f}%",
                support_cell(row),
            ]
        )
    return fitted_table("The best plan per trainer", TRAINER_COLUMNS, rows, width)


def faster_with_flags(r: SearchResult) -> list[str]:
    """A line per trainer whose best plan of the table above is slower than a top plan it runs once
    that plan's FP8 settings are named ('runs on' M*): the table ranks the plans the space searched
    as they are, these are the same plans with the flags."""
    lines = []
    for trainer, best in r.per_trainer.items():
        if best is None:
            continue
        for i, (_, row) in enumerate(r.top.iterrows(), start=1):
            if trainer in _flagged_trainers(row) and float(row[STEP_TIME_S]) < float(best[STEP_TIME_S]):
                title = get_trainer(trainer).title
                lines.append(
                    f"{title} runs #{i} {row[PLAN_NAME]} ({float(row[STEP_TIME_S]):.3f} s) with {row['fp8_flags']}"
                )
                break
    return lines


def stage_balance(row) -> str:
    """'-' without a pipeline, 'even', or the uneven layout's busiest-rank imbalance."""
    if row["pp"] == 1:
        return "-"
    imb = float(row[STAGE_IMBALANCE])
    return "even" if imb <= 1.0 + 1e-9 else f"uneven {imb:.2f}x"


def print_result(r: SearchResult) -> None:
    c = console()
    n, valid, fit = r.counts["evaluated"], r.counts["valid"], r.counts["fit"]
    if not r.top.empty:
        top, dropped = top_table(r, c.width)
        c.print(top)
        shown = [col.header for col in TOP_COLUMNS if col.header not in dropped]
        for line in top_legend(r, shown) + ([note] if (note := dropped_line(dropped)) else []):
            c.print(line)
        c.print(mfu_legend([r]))
        if (whole := run_table(r)) is not None:
            c.print(whole)
        if len(r.per_trainer) > 1:
            per, dropped = trainer_table(r, c.width)
            c.print(per)
            if note := dropped_line(dropped):
                c.print(note)
            from autopar.search.scenarios import trainers_ruled_out

            for line in trainers_ruled_out(r).values():  # a trainer no plan of which it can run: why
                c.print(line)
            for line in faster_with_flags(r):
                c.print(line, markup=False)
    c.print(Text(printable(r.why), style="bold"))
    for line in r.sureness:
        c.print(Text(printable(line), style="bold"))
    how = (
        "exhaustive: every plan of the space evaluated, so the fastest plan is the exact optimum of the cost model"
        if r.method == "exhaustive"
        else f"{r.method}: Optuna sampled the space ({len(r.history)} trials)"
    )
    c.print(f"{n:,} plans evaluated ({valid:,} valid, {fit:,} fit) in {r.timings.get('total_s', 0):.2f} s; {how}.")
    if r.rejections:
        c.print("Rejected by: " + rejection_summary(r.rejections))
    files = (
        "plans.parquet, "
        + ("plans.csv, " if r.options.csv else "")
        + "top.json, scatter.parquet, search.json"
        + ("" if r.method == "exhaustive" else ", study.db")
    )
    c.print(f"Results: {r.run_dir}/ ({files})")


#: the what-if table's columns (as TOP_COLUMNS: `drop` 1 goes first); the whole run's are added
WHATIF_COLUMNS = (
    Col("GPUs"),
    Col("GPU", left=True, drop=4),
    Col("seq", drop=3),
    Col("gbs", drop=2),
    Col("dtype", left=True, drop=9),
    Col("best layout", left=True),
    Col("schedule", left=True, drop=5),
    Col("recompute", left=True, drop=6),
    Col("memory GiB", drop=7),
    Col("step s"),
    Col("tokens/s", drop=1),
    Col("tokens/s/GPU", drop=8),
    Col("MFU"),
)


def print_whatif(results: list[SearchResult]) -> None:
    run = results[0].options.training
    cols = WHATIF_COLUMNS + tuple(Col(h) for h in run_headers(run))
    rows = []
    for r in results:
        q, w = r.question, r.winner
        dtype = "/".join(r.options.space.knobs.get("dtype") or ["bf16"])
        head = [str(q.num_gpus), q.cluster.gpu.key, str(q.seq_len), str(q.global_batch_size), dtype]
        if w is None:
            rows.append(head + ["nothing fits"] + [""] * (len(cols) - 6))
            continue
        rows.append(
            head
            + [
                layout_cell(w),
                SCHEDULE_SHORT.get(w["pp_schedule"], w["pp_schedule"]) if w["pp"] > 1 else "-",
                recompute_label(w["recompute"], w.get("recompute_modules")),
                f"{w[MEMORY_GIB]:.1f}",
                f"{w[STEP_TIME_S]:.3f}",
                f"{w[TOKENS_PER_S]:,.0f}",
                f"{w[TOKENS_PER_S_PER_GPU]:,.0f}",
                f"{100 * w[MFU]:.1f}%",
                *run_cells(w, run),
            ]
        )
    c = console()
    t, dropped = fitted_table("What-if: the best plan per scenario", cols, rows, c.width)
    c.print(t)
    if note := dropped_line(dropped):
        c.print(note)
    c.print(mfu_legend(results))
    if legend := flags_legend(r.winner for r in results if r.winner is not None):
        c.print(legend)
    for r in results:
        c.print(f"  {r.run_dir}: {r.why}")


def print_answer(answer) -> None:
    """The whole run's answers (autopar.search.training.check_run), one line each."""
    c = console()
    for line in answer.lines:
        c.print(Text(printable(line), style="bold"))
