"""The report page of a run: the question and its answer, then one section per part of the run
(the top-k and the best plan per trainer, the breakdowns, the whole run's time and cost, every
plan's scatter and the Pareto front, Optuna's history, the trials, a what-if's scenarios), as one
HTML string (`page.page`). `html.write_report` writes it."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from autopar import __version__
from autopar.figures import (
    BUBBLE_FRACTION,
    COST,
    DAYS,
    DOMINANT_COST,
    ENERGY_MWH,
    GOODPUT,
    GPU_HOURS,
    LAYOUT_TEXT,
    LOW,
    MEMORY_CAPACITY_BYTES,
    MEMORY_GIB,
    MFU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    STEP_TIME_S,
    SUPPORT,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    VARIANT_OF,
    VS_BEST,
    VS_LEADER,
)
from autopar.report import answer_text as A
from autopar.report import run_data as D
from autopar.report import run_tables as R
from autopar.report import scatter_tables as S
from autopar.report import stage_tables as W
from autopar.report import top_tables as T
from autopar.report import trial_tables as X
from autopar.report.breakdown_figures import memory_figure, run_figure, time_figure
from autopar.report.format import fmt
from autopar.report.page import SUPPORT_CELL, e, fig, kv, page, table
from autopar.report.scatter_figures import scatter_figure
from autopar.report.stage_figures import stage_memory_figure, timeline_figure
from autopar.report.trial_figures import (
    history_figure,
    trials_figures,
    whatif_figure,
    whatif_mfu_figure,
    whatif_run_figure,
)
from autopar.spec.hardware import GIB

#: the file name of a run's report, in its run directory
REPORT_FILE = "report.html"

TOP_COLUMNS = [
    ("rank", "#", "int"),
    (PLAN_NAME, "layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    ("zero_stage", "ZeRO", "int"),
    ("micro_batch_size", "mbs", "int"),
    (LAYOUT_TEXT, "stages", "t"),
    (MEMORY_GIB, "memory GiB", "gib"),
    (STEP_TIME_S, "step s", "s"),
    (TOKENS_PER_S, "tokens/s", "count"),
    (TOKENS_PER_S_PER_GPU, "tokens/s/GPU", "count"),
    (MFU, "MFU", "pct"),
    (BUBBLE_FRACTION, "bubble", "pct"),
    (DOMINANT_COST, "dominant cost", "t"),
    ("trainers", "runs on", "t"),
    ("variants", "variants", "int"),
]
#: the variants folded under the top plans (autopar.report.top_tables.variant_table)
VARIANT_COLUMNS = [
    (VARIANT_OF, "of #", "int"),
    (PLAN_NAME, "layout", "t"),
    ("changes", "changes", "t"),
    (MEMORY_GIB, "memory GiB", "gib"),
    (STEP_TIME_S, "step s", "s"),
    (VS_LEADER, "vs its #", "pct_signed"),
    ("trainers", "runs on", "t"),
]
#: how sure: the step time's 80 % interval and the support (after the step time), where the run has them
SURE_COLUMNS: list[tuple[str, str, str]] = [
    (STEP_TIME_S, "80 % interval s", "interval"),
    (SUPPORT, SUPPORT.header, SUPPORT_CELL),
]
TRAINER_COLUMNS = [
    ("trainer", "trainer", "t"),
    (PLAN_NAME, "layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    ("zero_stage", "ZeRO", "int"),
    ("micro_batch_size", "mbs", "int"),
    (MEMORY_GIB, "memory GiB", "gib"),
    (STEP_TIME_S, "step s", "s"),
    (TOKENS_PER_S, "tokens/s", "count"),
    (MFU, "MFU", "pct"),
    (VS_BEST, "vs best", "pct_signed"),
]
PARETO_COLUMNS = [
    (PLAN_NAME, "layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    ("zero_stage", "ZeRO", "int"),
    ("micro_batch_size", "mbs", "int"),
    (MEMORY_GIB, "memory GiB", "gib"),
    (TOKENS_PER_S, "tokens/s", "count"),
    (STEP_TIME_S, "step s", "s"),
    (MFU, "MFU", "pct"),
]
TRIAL_COLUMNS = [
    ("trial", "trial", "t"),
    (PLAN_NAME, "layout", "t"),
    ("status", "status", "t"),
    ("kind", "ran as", "t"),
    ("predicted_step_time_s", "predicted s", "s"),
    ("measured_step_time_s", "measured s", "s"),
    ("step_time_error_s", "error s", "s_signed"),
    ("step_time_error", "error", "pct_signed"),
    ("predicted_memory_gib", "predicted GiB", "gib"),
    ("measured_memory_gib", "measured GiB", "gib"),
    ("memory_error_gib", "error GiB", "gib_signed"),
    ("memory_error", "error", "pct_signed"),
    ("proxy_step_time_s", "proxy measured s", "s"),
    ("proxy_predicted_step_time_s", "proxy predicted s", "s"),
    ("interval_before", "80 % interval s", "interval"),
    ("interval_after", "after calibration", "interval"),
    ("note", "proxy changes / why not run", "t"),
]
#: the whole-run columns of the top and what-if tables (with --tokens)
RUN_COLUMNS = [(f, f.header, f.kind) for f in (DAYS, GOODPUT, GPU_HOURS, COST, ENERGY_MWH)]
WHATIF_COLUMNS = [
    ("scenario", "scenario", "t"),
    (PLAN_NAME, "best layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    (MEMORY_GIB, "memory GiB", "gib"),
    (STEP_TIME_S, "step s", "s"),
    (TOKENS_PER_S, "tokens/s", "count"),
    (TOKENS_PER_S_PER_GPU, "tokens/s/GPU", "count"),
    (MFU, "MFU", "pct"),
    ("plans_fit", "plans that fit", "count"),
    ("link", "report", "html"),
]
STAGE_COLUMNS = [
    ("stage", "stage", "int"),
    ("layers", "layers", "int"),
    ("params", "parameters per GPU", "human"),
    (MEMORY_GIB, "memory GiB", "gib"),
    ("share_of_capacity", "of the GPU", "pct"),
    ("time_per_mb_s", "s per microbatch", "s4"),
    ("role", "", "t"),
]


def _pp_dash(df: pd.DataFrame) -> pd.DataFrame:
    """Schedules shown only where there is a pipeline."""
    df = df.copy()
    if "pp" in df.columns:
        df["pp_schedule"] = df["pp_schedule"].where(df["pp"] > 1, "-")
    return df


def report_html(run: D.RunData, scenario_runs: list[D.RunData] | None = None, out_dir: Path | None = None) -> str:
    """The whole report page of a run: the answer, then one section per part of the run (each a
    (nav anchor, nav label, HTML) from its builder; a builder with nothing to show returns None)."""
    q = run.question
    model = q.get("model", {}).get("name", "?")
    title = f"autopar: {model} on {q.get('num_gpus', '?')} x {q.get('cluster', {}).get('gpu', '?')}"
    parts = [f"<h1>{e(title)}</h1>", f'<p class="answer">{e(A.answer(run))}</p>']
    why = run.top.get("why") or run.search.get("why", "")
    if why:
        parts.append(f'<p class="why">{e(why)}</p>')
    if sure := A.sureness(run):
        parts.append('<ul class="sure">' + "".join(f"<li>{e(line)}</li>" for line in sure) + "</ul>")
    if A.has_intervals(run):
        parts.append(f'<p class="note">{e(A.INTERVAL_NOTE)}</p>')
    stages = W.winner_stages(run)
    sections = [
        ("question", "question", f'<h2 id="question">The question</h2>{kv(A.question_rows(run))}'),
        *_answer_sections(run, why),
        _stages_section(run, stages),
        _export_section(run, stages),
        _run_section(run),
        _plans_section(run),
        _optuna_section(run),
        _trials_section(run),
        _whatif_section(run, scenario_runs, out_dir),
    ]
    built = [b for b in sections if b is not None]
    head = "<nav>" + "".join(f'<a href="#{a}">{e(b)}</a>' for a, b, _ in built if b) + "</nav>"
    foot = (
        f"<footer>autopar {e(__version__)}; run directory {e(str(run.run_dir))}; "
        f"written {time.strftime('%Y-%m-%d %H:%M:%S')}. Numbers from top.json, search.json and scatter.parquet "
        f"(the plans the search kept).</footer>"
    )
    return page(title, "\n".join(parts + [head] + [html_ for _, _, html_ in built] + [foot]))


def _answer_sections(run: D.RunData, why: str) -> list[tuple[str, str, str]]:
    """The top-k table, the best plan per trainer and the breakdowns; or why nothing fits."""
    top = T.top_table(run)
    if not len(top):
        return [("top", "top plans", f'<h2 id="top">No plan fits</h2><p>{e(why)}</p>')]
    rows = T.top_rows(run)
    sure = _sure_columns(top)
    sure_note = (
        " 80 % interval: of the step time (how to read it: under the answer above); support: hover it for why."
        if sure
        else ""
    )
    out = [
        (
            "top",
            "top plans",
            f'<h2 id="top">Top {len(top)} plans that fit</h2>'
            f'<p class="note">Click a column to sort. Memory: peak per GPU on the most loaded '
            f"pipeline rank, of {top['memory_capacity_gib'].iloc[0]:.1f} GiB.{e(sure_note)}</p>"
            + table(
                _pp_dash(top),
                _with_sure(TOP_COLUMNS, sure) + _run_columns(top),
                row_class=lambda i, r: "win" if i == 0 else "",
            ),
        )
    ]
    variants = T.variant_table(run)
    if len(variants):
        out.append(
            (
                "variants",
                "variants",
                '<h2 id="variants">Variants folded under the top plans</h2>'
                '<p class="note">Plans of the same process grid, schedule and recompute as a top plan '
                "that differ only in micro-batch, ZeRO stage, stage layout or a flag: each is listed "
                "under the top plan it is a variant of, with what it changes.</p>" + table(variants, VARIANT_COLUMNS),
            )
        )
    per_trainer, dropped = T.trainer_table(run), T.dropped_trainers(run)
    if len(per_trainer) > 1 or len(dropped):
        dropped_html = (
            '<p class="note">Trainers with no plan here:</p><ul class="dropped">'
            + "".join(f"<li><b>{e(r.trainer)}</b>: {e(r.why)}</li>" for r in dropped.itertuples())
            + "</ul>"
            if len(dropped)
            else ""
        )
        out.append(
            (
                "trainers",
                "per trainer",
                '<h2 id="trainers">The best plan per trainer</h2>'
                '<p class="note">Each trainer runs only what its capability table allows '
                "(autopar/spec/data/trainers.toml) and at the speed of its own performance profile."
                "</p>"
                + (
                    table(_pp_dash(per_trainer), _with_sure(TRAINER_COLUMNS, _sure_columns(per_trainer)))
                    if len(per_trainer)
                    else ""
                )
                + dropped_html,
            )
        )
    out.append(
        (
            "breakdown",
            "breakdowns",
            '<h2 id="breakdown">Where the step time and the memory go</h2>'
            + (
                '<p class="note">The black bar on each step time: its 80 % interval.</p>'
                if rows[LOW[STEP_TIME_S]].notna().any()
                else ""
            )
            + fig(time_figure(T.time_breakdown(rows)), "fig-time")
            + fig(memory_figure(T.memory_breakdown(rows), run.headroom_gib), "fig-memory"),
        )
    )
    return out


def _sure_columns(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The interval and support columns, where the frame has an interval (not a run from before)."""
    has = LOW[STEP_TIME_S] in df.columns and df[LOW[STEP_TIME_S]].notna().any()
    return SURE_COLUMNS if has else []


def _with_sure(columns: list[tuple[str, str, str]], sure: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The columns with the sure ones right after the step time."""
    at = next(i for i, c in enumerate(columns) if c[0] == STEP_TIME_S) + 1
    return columns[:at] + sure + columns[at:]


def _run_columns(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The whole-run columns the frame has (none without --tokens; cost only with a price)."""
    return [c for c in RUN_COLUMNS if c[0] in df.columns and df[c[0]].notna().any()]


def _stages_section(run: D.RunData, stages: W.WinnerStages | None) -> tuple[str, str, str] | None:
    """The winner's memory per pipeline stage and its step per stage (the cost model's schedule)."""
    if stages is None:
        return None
    est = stages.estimate
    sm, tl = W.stage_memory(est), W.timeline(est)
    pipe, m = float(tl["pipeline_s"].iloc[0]), est.num_microbatches
    pace = float(sm["time_per_mb_s"].max())
    bubble = float(tl["bubble"].iloc[0])
    tail = float(tl[["dp", "tp_step", "optimizer"]].iloc[0].sum())
    bubble_text = (
        f"{fmt(bubble, 's')} s is the {e(str(est.plan.pp_schedule))} schedule's bubble"
        if est.plan.pp > 1
        else "none is bubble (no pipeline)"
    )
    stale = (
        ""
        if stages.same_as_run
        else f'<p class="note">This autopar ({e(__version__)}) prices the winner differently from the run '
        f"(step {fmt(est.step_time_s, 's')} s against top.json's {fmt(stages.entry.get(STEP_TIME_S), 's')} s): "
        "the figures below are today's estimate.</p>"
    )
    return (
        "stages",
        "pipeline stages",
        f'<h2 id="stages">The winner\'s pipeline stages: {e(est.plan.describe())}</h2>'
        + stale
        + f'<p class="note">Peak memory per GPU of each of the {est.plan.pp} pipeline stage(s), from the '
        "estimate with every rank costed: the first stages hold more microbatches' activations in flight "
        "(autopar.cost.pipeline), the first and last the embedding and the LM head.</p>"
        + table(sm, STAGE_COLUMNS, row_class=lambda i, r: "win" if r["role"] else "")
        + fig(stage_memory_figure(sm, run.headroom_gib), "fig-stage-memory")
        + f'<p class="note">One step per stage, as the cost model prices it: each stage runs its {m} '
        f"microbatches at its own time per microbatch; the pipeline runs at the pace of the slowest stage, "
        f"{m} x {fmt(pace, 's4')} s / (1 - bubble fraction {fmt(est.bubble_fraction, 'pct')}) = "
        f"{fmt(pipe, 's')} s, of which {bubble_text}; then {fmt(tail, 's')} s after the pipeline (exposed DP "
        f"communication, TP per-step reductions, optimizer step). Forward and backward are each stage's {m} "
        "microbatches summed, "
        f"split by FLOPs (forward = MFU / (3 x HFU) = {fmt(W.forward_share(est), 'pct')} of a "
        "microbatch: the backward does twice the forward's FLOPs, plus any recomputed forward); in the "
        "run they interleave, one forward and one backward at a time.</p>" + fig(timeline_figure(tl), "fig-timeline"),
    )


def _export_section(run: D.RunData, stages: W.WinnerStages | None) -> tuple[str, str, str] | None:
    """The `autopar export` command of the winner, per trainer that runs it."""
    if stages is None:
        return None
    cmds = W.export_commands(run, stages)
    lines = "".join(
        f'<p class="note">{e(t)}{" (the trainer it is ranked on)" if i == 0 else ""}:</p>'
        f'<pre class="cmd"><code>{e(c)}</code></pre>'
        for i, (t, c) in enumerate(cmds)
    )
    return (
        "export",
        "export",
        '<h2 id="export">Export this plan</h2>'
        '<p class="note">Writes the launch configs of the winner (rank 1 of this run directory) for a '
        "trainer, into RUN/export-rank1/&lt;format&gt;/ (or --out DIR). Add torchrun or slurm to --to "
        f"(--to {e(cmds[0][0])},slurm) for the launch scripts; <code>autopar export --help</code> lists "
        "every format and option.</p>" + lines,
    )


def _run_section(run: D.RunData) -> tuple[str, str, str] | None:
    """With --tokens: the winner's time and cost, and where the days of the top plans go."""
    rows = T.top_rows(run)
    if R.training_run(run) is None or not len(rows) or DAYS not in rows.columns:
        return None
    return (
        "run",
        "time and cost",
        '<h2 id="run">Time and cost of the whole run</h2>'
        '<p class="note">Days to train = tokens / tokens per second / goodput. Goodput: the share of the '
        "wall time left after checkpoint writes (every Young/Daly interval), work redone after an "
        "interruption and restarts; interruptions per GPU-hour, checkpoint bandwidth and restart time from "
        "the cluster's <code>reliability:</code> (default: the Llama 3 paper's 16,384-GPU cluster).</p>"
        + kv(R.run_panel(run, rows.iloc[0]))
        + fig(run_figure(R.run_breakdown(rows), R.RUN_TERMS, R.deadline_days(run)), "fig-run"),
    )


def _plans_section(run: D.RunData) -> tuple[str, str, str]:
    """The scatter of the plans kept (memory against throughput) and the Pareto front."""
    sc = S.scatter_frame(run.plans, keep=T.top_rows(run).index)
    w = T.winner(run)
    win = (float(w[PEAK_MEMORY_BYTES]) / GIB, float(w[TOKENS_PER_S]), str(w[PLAN_NAME])) if w is not None else None
    cap = float(run.plans[MEMORY_CAPACITY_BYTES].max()) / GIB if len(run.plans) else None
    pareto = S.pareto_table(run.plans)
    note = ""
    if run.plans_evaluated > len(run.plans):
        note = (
            f" Drawn: the {len(run.plans):,} plans the search kept of the {run.plans_evaluated:,} it evaluated "
            f"(each trainer's fastest, the whole Pareto front and a uniform sample of each category; "
            f"plans.parquet in the run directory has them all)."
        )
    if sc.attrs.get("without_estimate"):
        note += f" {sc.attrs['without_estimate']:,} plans have no finite estimate and are not drawn."
    limit = f", the dotted one the search's limit ({run.headroom_gib:g} GiB headroom)" if run.headroom_gib else ""
    if LOW[TOKENS_PER_S] in sc.columns and sc[LOW[TOKENS_PER_S]].notna().any():
        limit += ". The faint vertical bar on each point: its 80 % interval of throughput"
    figure = (
        fig(scatter_figure(sc, S.category_order(sc["category"]), win, cap, run.headroom_gib), "fig-scatter")
        if len(sc)
        else "<p>No plan has an estimate to draw.</p>"
    )
    return (
        "plans",
        "every plan",
        '<h2 id="plans">The evaluated plans</h2>'
        '<p class="note">Peak memory per GPU (log scale) against throughput; hover a point for its '
        f"layout. The dashed red line is the GPU's capacity{limit}.{e(note)}</p>"
        + figure
        + f"<h3>Pareto front ({len(pareto)} plans): no other fitting plan is both faster and smaller</h3>"
        + table(_pp_dash(pareto), PARETO_COLUMNS),
    )


def _optuna_section(run: D.RunData) -> tuple[str, str, str] | None:
    hist = X.optuna_history(run)
    if not len(hist):
        return None
    return (
        "optuna",
        "Optuna",
        '<h2 id="optuna">Optuna optimisation history</h2>'
        f'<p class="note">{e(A.method_text(run.search))}.</p>' + fig(history_figure(hist), "fig-optuna"),
    )


def _trials_section(run: D.RunData) -> tuple[str, str, str] | None:
    """Predicted against measured, per trial (full size, proxy, or not run here)."""
    if not (run.trials or run.trial_problems):
        return None
    measured = got if isinstance(got := run.search.get("measured"), dict) else {}
    intervals = ivs if isinstance(ivs := measured.get("intervals"), dict) else {}
    tt = X.trials_table(run.trials, intervals.get("plans"))
    summ = X.trials_summary(tt)
    body = [f'<h2 id="trials">Trials: predicted vs measured ({summ["trials"]})</h2>']
    if len(tt):
        body.append(
            f'<p class="note">Error = (predicted - measured) / measured. Mean absolute error: step time '
            f"{fmt(summ['step_time_mape'], 'pct')}, peak memory {fmt(summ['memory_mape'], 'pct')}.</p>"
        )
        if (tt["kind"] != "full").any():
            body.append(
                '<p class="note">Ran as <b>proxy</b>: a scaled-down trial (fewer ranks, layers, width '
                "or sequence; see the last column) whose measured step time and memory are scaled back to "
                "the plan by the estimate's ratio (predicted plan / predicted proxy on the machine it ran "
                "on); the proxy's own measured and predicted step times are in the proxy columns. "
                "<b>not run</b>: the plan cannot run on this machine, for the reason given.</p>"
            )
        if intervals.get("half_width_log") is not None:
            body.append(
                f'<p class="note">80 % interval of step time: before, from the published runs of the plan\'s '
                f"regime; after calibration, the calibrated prediction within the split-conformal band of the "
                f"{int(intervals.get('trials') or 0)} calibrated trials' own errors "
                f"(x/ {math.exp(float(intervals['half_width_log'])):.3f}).</p>"
            )
        body.append(table(tt, TRIAL_COLUMNS))
        figs = trials_figures(tt)
        body.append(fig(figs[0], "fig-trials-time") + fig(figs[1], "fig-trials-memory"))
    for p in run.trial_problems:
        body.append(f'<p class="note">skipped {e(p)}</p>')
    return ("trials", "trials", "".join(body))


def _whatif_section(
    run: D.RunData, scenario_runs: list[D.RunData] | None, out_dir: Path | None
) -> tuple[str, str, str] | None:
    """The best plan per scenario of a what-if, each linking to its own report."""
    if not scenario_runs or len(scenario_runs) < 2:
        return None
    wt = X.whatif_table(scenario_runs, current=run.run_dir)
    base = Path(out_dir or run.run_dir).resolve()
    links = []
    for r, cur in zip(scenario_runs, wt["current"]):
        target = Path(r.run_dir).resolve() / REPORT_FILE
        links.append("this report" if cur else quote(Path(os.path.relpath(target, base)).as_posix()))
    wt = wt.assign(link=[lk if lk == "this report" else f'<a href="{e(lk)}" title="{e(lk)}">open</a>' for lk in links])
    cols = WHATIF_COLUMNS[:-1] + _run_columns(wt) + WHATIF_COLUMNS[-1:]
    rows = table(wt, cols, row_class=lambda i, r: "win" if r["current"] else "")
    t = R.training_run(run)
    days = (
        fig(whatif_run_figure(wt, R.deadline_days(run)), "fig-whatif-run")
        if t is not None and wt[DAYS].notna().any()
        else ""
    )
    picks = "".join(f'<p class="answer">{e(line)}</p>' for line in R.whatif_answers(wt, t))
    mfu = fig(whatif_mfu_figure(wt), "fig-whatif-mfu") if wt.loc[wt[MFU].notna(), "num_gpus"].nunique() > 1 else ""
    return (
        "whatif",
        "what-if",
        f'<h2 id="whatif">What-if: the best plan per scenario ({len(wt)})</h2>'
        + picks
        + rows
        + fig(whatif_figure(wt), "fig-whatif")
        + mfu
        + days,
    )
