"""Assemble the report and comparison pages: one self-contained HTML file each, plotly.js inlined
once, no network access (no CDN, no fonts, no MathJax), a few lines of inline JavaScript to sort
tables. Opens from disk in any browser.

`write_report(run_dir)` is what `autopar search` calls after writing a run directory.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from autopar import __version__
from autopar.errors import InputError
from autopar.report import compare_tables as C
from autopar.report import figures as F
from autopar.report import run_data as D
from autopar.report import run_tables as R
from autopar.report import tables as T
from autopar.report import trial_tables as X
from autopar.report.format import compare_kind, fmt
from autopar.report.page import cell, e, fig, kv, page, table
from autopar.search.atomic import write_with

REPORT_FILE = "report.html"

TOP_COLUMNS = [
    ("rank", "#", "int"),
    ("plan_name", "layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    ("zero_stage", "ZeRO", "int"),
    ("micro_batch_size", "mbs", "int"),
    ("layout_text", "stages", "t"),
    ("memory_gib", "memory GiB", "gib"),
    ("step_time_s", "step s", "s"),
    ("tokens_per_s", "tokens/s", "count"),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", "count"),
    ("mfu", "MFU", "pct"),
    ("bubble_fraction", "bubble", "pct"),
    ("dominant_cost", "dominant cost", "t"),
    ("trainers", "runs on", "t"),
]
TRAINER_COLUMNS = [
    ("trainer", "trainer", "t"),
    ("plan_name", "layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    ("zero_stage", "ZeRO", "int"),
    ("micro_batch_size", "mbs", "int"),
    ("memory_gib", "memory GiB", "gib"),
    ("step_time_s", "step s", "s"),
    ("tokens_per_s", "tokens/s", "count"),
    ("mfu", "MFU", "pct"),
    ("vs_best", "vs best", "pct_signed"),
]
PARETO_COLUMNS = [
    ("plan_name", "layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    ("zero_stage", "ZeRO", "int"),
    ("micro_batch_size", "mbs", "int"),
    ("memory_gib", "memory GiB", "gib"),
    ("tokens_per_s", "tokens/s", "count"),
    ("step_time_s", "step s", "s"),
    ("mfu", "MFU", "pct"),
]
TRIAL_COLUMNS = [
    ("trial", "trial", "t"),
    ("plan_name", "layout", "t"),
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
    ("note", "proxy changes / why not run", "t"),
]
#: the whole-run columns of the top and what-if tables (with --tokens)
RUN_COLUMNS = [
    ("days", "days", "days"),
    ("goodput", "goodput", "pct"),
    ("gpu_hours", "GPU-hours", "count"),
    ("cost", "cost", "money"),
]
WHATIF_COLUMNS = [
    ("scenario", "scenario", "t"),
    ("plan_name", "best layout", "t"),
    ("pp_schedule", "schedule", "t"),
    ("recompute", "recompute", "t"),
    ("memory_gib", "memory GiB", "gib"),
    ("step_time_s", "step s", "s"),
    ("tokens_per_s", "tokens/s", "count"),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", "count"),
    ("mfu", "MFU", "pct"),
    ("plans_fit", "plans that fit", "count"),
    ("link", "report", "html"),
]


def _pp_dash(df: pd.DataFrame) -> pd.DataFrame:
    """Schedules shown only where there is a pipeline."""
    df = df.copy()
    if "pp" in df.columns:
        df["pp_schedule"] = df["pp_schedule"].where(df["pp"] > 1, "-")
    return df


# ---- the report ----------------------------------------------------------------------------------


def report_html(run: D.RunData, scenario_runs: list[D.RunData] | None = None, out_dir: Path | None = None) -> str:
    """The whole report page of a run: the answer, then one section per part of the run (each a
    (nav anchor, nav label, HTML) from its builder; a builder with nothing to show returns None)."""
    q = run.question
    model = q.get("model", {}).get("name", "?")
    title = f"autopar: {model} on {q.get('num_gpus', '?')} x {q.get('cluster', {}).get('gpu', '?')}"
    parts = [f"<h1>{e(title)}</h1>", f'<p class="answer">{e(T.answer(run))}</p>']
    why = run.top.get("why") or run.search.get("why", "")
    if why:
        parts.append(f'<p class="why">{e(why)}</p>')
    built = [
        ("question", "question", f'<h2 id="question">The question</h2>{kv(T.question_rows(run))}'),
        *_answer_sections(run, why),
        _run_section(run),
        _plans_section(run),
        _optuna_section(run),
        _trials_section(run),
        _whatif_section(run, scenario_runs, out_dir),
    ]
    built = [b for b in built if b is not None]
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
    out = [
        (
            "top",
            "top plans",
            f'<h2 id="top">Top {len(top)} plans that fit</h2>'
            f'<p class="note">Click a column to sort. Memory: peak per GPU on the most loaded '
            f"pipeline rank, of {top['memory_capacity_gib'].iloc[0]:.1f} GiB.</p>"
            + table(_pp_dash(top), TOP_COLUMNS + _run_columns(top), row_class=lambda i, r: "win" if i == 0 else ""),
        )
    ]
    per_trainer = T.trainer_table(run)
    if len(per_trainer) > 1:
        out.append(
            (
                "trainers",
                "per trainer",
                '<h2 id="trainers">The best plan per trainer</h2>'
                '<p class="note">Each trainer runs only what its capability table allows '
                "(autopar/spec/data/trainers.toml) and at the speed of its own performance profile."
                "</p>" + table(_pp_dash(per_trainer), TRAINER_COLUMNS),
            )
        )
    out.append(
        (
            "breakdown",
            "breakdowns",
            '<h2 id="breakdown">Where the step time and the memory go</h2>'
            + fig(F.time_figure(T.time_breakdown(rows)), "fig-time")
            + fig(F.memory_figure(T.memory_breakdown(rows), run.headroom_gib), "fig-memory"),
        )
    )
    return out


def _run_columns(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The whole-run columns the frame has (none without --tokens; cost only with a price)."""
    return [c for c in RUN_COLUMNS if c[0] in df.columns and df[c[0]].notna().any()]


def _run_section(run: D.RunData) -> tuple[str, str, str] | None:
    """With --tokens: the winner's time and cost, and where the days of the top plans go."""
    rows = T.top_rows(run)
    if R.training_run(run) is None or not len(rows) or "days" not in rows.columns:
        return None
    t = R.training_run(run)
    deadline = t["deadline_s"] / 86_400 if t.get("deadline_s") else None
    return (
        "run",
        "time and cost",
        '<h2 id="run">Time and cost of the whole run</h2>'
        '<p class="note">Days to train = tokens / tokens per second / goodput. Goodput: the share of the '
        "wall time left after checkpoint writes (every Young/Daly interval), work redone after an "
        "interruption and restarts; interruptions per GPU-hour, checkpoint bandwidth and restart time from "
        "the cluster's <code>reliability:</code> (default: the Llama 3 paper's 16,384-GPU cluster).</p>"
        + kv(R.run_panel(run, rows.iloc[0]))
        + fig(F.run_figure(R.run_breakdown(rows), R.RUN_TERMS, deadline), "fig-run"),
    )


def _plans_section(run: D.RunData) -> tuple[str, str, str]:
    """The scatter of the plans kept (memory against throughput) and the Pareto front."""
    sc = T.scatter_frame(run.plans, keep=T.top_rows(run).index)
    w = T.winner(run)
    win = (
        (float(w["peak_memory_bytes"]) / T.GIB, float(w["tokens_per_s"]), str(w["plan_name"]))
        if w is not None
        else None
    )
    cap = float(run.plans["memory_capacity_bytes"].max()) / T.GIB if len(run.plans) else None
    pareto = T.pareto_table(run.plans)
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
    figure = (
        fig(F.scatter_figure(sc, T.category_order(sc["category"]), win, cap, run.headroom_gib), "fig-scatter")
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
        f'<p class="note">{e(T.method_text(run.search))}.</p>' + fig(F.history_figure(hist), "fig-optuna"),
    )


def _trials_section(run: D.RunData) -> tuple[str, str, str] | None:
    """Predicted against measured, per trial (full size, proxy, or not run here)."""
    if not (run.trials or run.trial_problems):
        return None
    tt = X.trials_table(run.trials)
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
        body.append(table(tt, TRIAL_COLUMNS))
        figs = F.trials_figures(tt)
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
        fig(F.whatif_run_figure(wt, t["deadline_s"] / 86_400 if t.get("deadline_s") else None), "fig-whatif-run")
        if t is not None and wt["days"].notna().any()
        else ""
    )
    picks = "".join(f'<p class="answer">{e(line)}</p>' for line in R.whatif_answers(wt, t))
    return (
        "whatif",
        "what-if",
        f'<h2 id="whatif">What-if: the best plan per scenario ({len(wt)})</h2>'
        + picks
        + rows
        + fig(F.whatif_figure(wt), "fig-whatif")
        + days,
    )


def write_report(
    run_dir: str | Path, *, out: str | Path | None = None, scenarios: list[str | Path] | None = None
) -> Path:
    """(Re)build the report of a run directory; returns the file written (default
    RUN_DIR/report.html). `scenarios`: the run directories of the search this run belongs to (this
    one included); several are a what-if, recorded in RUN_DIR/whatif.json so a later `autopar
    report` keeps the what-if section; one (or none) removes a whatif.json left by an earlier
    what-if. None (the default, a rebuild): keep whatever whatif.json says. Raises InputError for
    a missing or corrupt run directory."""
    run = D.load_run(run_dir)
    d = Path(run_dir)
    if scenarios is not None:  # a fresh search: record its scenarios, or forget a what-if of the past
        dirs = [Path(s) for s in scenarios]
        if len(dirs) > 1:
            D.write_scenarios(d, dirs)
        else:
            (d / D.WHATIF_FILE).unlink(missing_ok=True)
        run.scenarios = dirs
    scenario_runs = None
    if len(run.scenarios) > 1:
        scenario_runs = []
        for s in run.scenarios:
            if Path(s).resolve() == d.resolve():
                scenario_runs.append(run)
            elif Path(s).is_dir():
                try:
                    scenario_runs.append(D.load_run(s, with_trials=False, with_scenarios=False))
                except InputError:  # a scenario removed or broken since: leave it out
                    continue
    path = Path(out) if out is not None else d / REPORT_FILE
    _mkdir_write(path, report_html(run, scenario_runs, out_dir=path.parent))
    return path


def write_reports(run_dirs: list[str | Path]) -> list[Path]:
    """The reports of one search (what `autopar search` calls): one report per run directory;
    several directories are the scenarios of a what-if, and each report shows them side by side."""
    # one directory twice (e.g. two scenarios into one --run-dir) is one scenario
    seen: dict[Path, Path] = {}
    for d in run_dirs:
        seen.setdefault(Path(d).resolve(), Path(d))
    unique = list(seen.values())
    return [write_report(d, scenarios=unique) for d in unique]


# ---- the comparison ------------------------------------------------------------------------------


def compare_html(cmp) -> str:
    """cmp: autopar.report.compare.Comparison."""
    q = cmp.question
    labels = cmp.labels
    title = f"autopar compare: {len(labels)} layouts of {q.describe()}"
    parts = [
        f"<h1>{e(title)}</h1>",
        f'<p class="why">{e(q.model.name)} on {q.num_gpus} x {q.cluster.gpu.key} ({q.cluster.gpus_per_node} per '
        f"node), sequence length {q.seq_len}. Rows that differ are shaded; the best value of a ranked row is "
        f"green.</p>",
        '<table class="kv">'
        + "".join(f"<tr><td>{e(it.label)}</td><td>{e(it.source)}</td></tr>" for it in cmp.items)
        + "</table>",
    ]
    t = cmp.table
    head = '<th class="t">metric</th>' + "".join(f"<th>{e(lab)}</th>" for lab in labels)
    rows, section = [], None
    for _, r in t.iterrows():
        if r["section"] != section:
            section = r["section"]
            rows.append(f'<tr class="sec"><td colspan="{len(labels) + 1}">{e(section)}</td></tr>')
        kind = compare_kind(r["section"], r["key"])
        best = set(str(r["best"]).split(", ")) if r["best"] else set()
        cells = "".join(
            cell(
                r[lab],
                kind,
                text=not isinstance(r[lab], (int, float)) or isinstance(r[lab], bool),
                cls="best" if lab in best else "",
            )
            for lab in labels
        )
        better = {"lower": " (lower is better)", "higher": " (higher is better)"}.get(r["better"], "")
        cls = ' class="diff"' if r["differs"] else ""
        rows.append(f'<tr{cls}><td class="t m" title="{e(r["key"] + better)}">{e(r["metric"])}</td>{cells}</tr>')
    parts.append(
        f'<h2 id="table">Side by side</h2><div class="scroll"><table class="cmp"><thead><tr>{head}'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )
    est_rows = C.estimate_rows(labels, cmp.estimate_dicts())
    parts.append(
        '<h2 id="breakdown">Breakdowns</h2>'
        + fig(F.time_figure(T.time_breakdown(est_rows, labels)), "fig-time")
        + fig(F.memory_figure(T.memory_breakdown(est_rows, labels)), "fig-memory")
        + fig(F.comm_figure(C.comm_breakdown(est_rows, labels)), "fig-comm")
    )
    parts.append(
        f"<footer>autopar {e(__version__)}; estimates of the analytic cost model; written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}.</footer>"
    )
    return page(title, "\n".join(parts))


def write_compare(cmp, out: str | Path) -> Path:
    path = Path(out)
    _mkdir_write(path, compare_html(cmp))
    return path


def _mkdir_write(path: Path, text: str) -> None:
    """Atomically (a reader, or a second search worker writing the same run directory, never sees
    half a page), creating the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
