"""`autopar search`: evaluate the whole space exactly, streamed in bounded memory
(autopar.search.streaming), or let Optuna sample it when it is too large to finish in about ten
seconds; rank what fits, per trainer too; persist the run directory (autopar.search.run_dir)."""

from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from autopar import __version__
from autopar.calibration.estimate import estimate_per_trainer
from autopar.calibration.uncertainty import interval_fields, support_text
from autopar.cost.goodput import RUN_COLUMNS, with_null_reasons
from autopar.figures import (
    AXES,
    BUBBLE_FRACTION,
    COMM_BYTES,
    COMM_BYTES_PER_GPU,
    DAYS,
    DOMINANT_COST,
    FITS,
    HFU,
    LAYOUT_TEXT,
    LOW,
    MEETS_DEADLINE,
    MEM,
    MEMORY_BYTES,
    MEMORY_CAPACITY_BYTES,
    MEMORY_MISS_GIB,
    MEMORY_TERMS,
    MFU,
    MODEL_TFLOPS_PER_GPU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    REJECTED_BY,
    STEP_TIME_S,
    SUPPORT,
    SUPPORT_GAPS,
    SUPPORT_REASON,
    TIME,
    TIME_S,
    TIME_TERMS,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    VARIANT_OF,
    WITHIN_BUDGET,
)
from autopar.search.enumerate import Enumerator
from autopar.search.evaluate import evaluate
from autopar.search.margins import HEADROOM_TRADE, stored_margin
from autopar.search.options import SearchOptions
from autopar.search.optuna_search import optuna_search
from autopar.search.results import (
    best_per_trainer,
    ep_choice_line,
    rank_first_for_headroom,
    row_plan,
    sureness_lines,
    top_and_variants,
    top_plans,
    why_winner,
)
from autopar.search.run_dir import (
    SCHEMA_VERSION,
    PlansWriter,
    rejection_bits,
    write_csv,
    write_scatter,
    write_search_info,
    write_top,
)
from autopar.search.run_state import RunState
from autopar.search.space import SearchSpace
from autopar.search.streaming import FIT_MASK, Streamed, StreamOptions, stream
from autopar.search.training import plan_file_columns, with_run_columns
from autopar.spec.question import Question
from autopar.spec.table import TRAINER, PlanTable
from autopar.spec.trainers import TRAINERS


@dataclass
class SearchResult:
    question: Question
    options: SearchOptions
    plans: pd.DataFrame  # the plans kept: each trainer's fastest, the Pareto front, a sample (not every plan)
    #: the top-k structurally different plans that fit (autopar.search.results.STRUCTURE_KEY),
    #: fastest first (`trainers`: who runs each; `variants`: how many are folded under each)
    top: pd.DataFrame
    method: str  # "exhaustive" | "optuna-<sampler>"
    why: str
    run_dir: Path
    timings: dict = field(default_factory=dict)
    layouts: list = field(default_factory=list)
    history: list = field(default_factory=list)
    per_trainer: dict = field(default_factory=dict)  # trainer -> its fastest fitting plan (a row), or None
    counts: dict = field(default_factory=dict)  # evaluated, valid, fit
    rejections: dict = field(default_factory=dict)  # reason label -> plans it rejects
    pareto: pd.DataFrame = field(default_factory=pd.DataFrame)
    scatter: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: how sure the answer is: the winner's support, the runner-up against its interval
    sureness: list = field(default_factory=list)
    #: the other plans of the top plans' structures, fastest first (`variant_of`: the top rank)
    variants: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: lines about the question itself: the default global batch adapted to the GPUs, or forcing pp / cp
    notes: list = field(default_factory=list)

    @property
    def winner(self) -> pd.Series | None:
        return None if self.top.empty else self.top.iloc[0]


def run_slug(q: Question, space: SearchSpace) -> str:
    """A stable run-directory name from the question, so a rerun finds (and resumes) its study."""
    raw = f"{q.model.name}_{q.num_gpus}x{q.cluster.gpu.key}_s{q.seq_len}_gbs{q.global_batch_size}_{space.name}"
    if set(q.trainers) != set(TRAINERS):
        raw += "_" + "+".join(q.trainers)
    slug = re.sub(r"[^A-Za-z0-9_.+-]", "-", raw)
    if len(slug) > 120:  # a file name has at most 255 bytes: a long model or space name is cut, plus a hash
        import hashlib

        slug = slug[:100] + "-" + hashlib.sha256(raw.encode()).hexdigest()[:12]
    return slug


def row_summary(row: pd.Series | dict, layouts) -> dict:
    """A plan and its estimate as plain data (top.json entries, Optuna user attributes)."""
    row = row.to_dict() if isinstance(row, pd.Series) else row  # one dict: a Series lookup per field is slow
    plan = row_plan(row, layouts)
    out = {"plan_index": int(row["plan_index"])} if "plan_index" in row else {}
    return (
        out
        | {
            PLAN_NAME: str(row[PLAN_NAME]),
            "trainer": str(row["trainer"]),
            "plan": plan.to_dict(),
            FITS: bool(row[FITS]),
            REJECTED_BY: str(row[REJECTED_BY]),
            STEP_TIME_S: float(row[STEP_TIME_S]),
            TOKENS_PER_S: float(row[TOKENS_PER_S]),
            TOKENS_PER_S_PER_GPU: float(row[TOKENS_PER_S_PER_GPU]),
            MODEL_TFLOPS_PER_GPU: float(row[MODEL_TFLOPS_PER_GPU]),
            MFU: float(row[MFU]),
            HFU: float(row[HFU]),
            BUBBLE_FRACTION: float(row[BUBBLE_FRACTION]),
            PEAK_MEMORY_BYTES: float(row[PEAK_MEMORY_BYTES]),
            MEMORY_CAPACITY_BYTES: float(row[MEMORY_CAPACITY_BYTES]),
            MEMORY_BYTES: {t: float(row[MEM[t]]) for t in MEMORY_TERMS},
            TIME_S: {t: float(row[TIME[t]]) for t in TIME_TERMS},
            COMM_BYTES_PER_GPU: {a: float(row[COMM_BYTES[a]]) for a in AXES},
            DOMINANT_COST: str(row[DOMINANT_COST]),
            "layout": str(row[LAYOUT_TEXT]),
        }
        | _interval_summary(row)
        | (
            {
                "run": with_null_reasons(
                    {
                        c: float(row[c]) if c not in (MEETS_DEADLINE, WITHIN_BUDGET) else bool(row[c])
                        for c in RUN_COLUMNS + (MEETS_DEADLINE, WITHIN_BUDGET)
                        if c in row
                    }
                )
            }
            if DAYS in row
            else {}
        )
    )


def _interval_summary(row: dict) -> dict:
    """The plan's 80 % intervals and support (autopar.calibration.uncertainty), as `estimate --json` has them."""
    if LOW[STEP_TIME_S] not in row:
        return {}
    return interval_fields(row, str(row[SUPPORT_REASON]) if SUPPORT_REASON in row else None)


def with_support(df: pd.DataFrame, q: Question, layouts: list) -> pd.DataFrame:
    """The plans shown with `support` and `support_reason`: the gaps in words and the nearest
    published run (autopar.calibration.uncertainty.support_text)."""
    if df.empty or SUPPORT_GAPS not in df.columns:
        return df
    texts = [
        support_text(int(r[SUPPORT_GAPS]), row_plan(r, layouts), q.model, q.cluster, q.seq_len)
        for _, r in df.iterrows()
    ]
    return df.assign(**{SUPPORT: [t[0] for t in texts], SUPPORT_REASON: [t[1] for t in texts]})


def run_search(
    q: Question, opts: SearchOptions, progress: Callable[[str, int, int], None] | None = None, interrupts=None
) -> SearchResult:
    """Answer the question under the space; write the run directory; return the result. The run
    directory is marked incomplete until search.json is written (autopar.search.run_state);
    `interrupts` (register/unregister, e.g. autopar.measured.hygiene from the CLI) tidies it on Ctrl-C
    or SIGTERM; a failure leaves it as it was, or marked incomplete for a rerun to finish."""
    t0 = time.perf_counter()
    run_dir = opts.run_dir or Path("reports") / run_slug(q, opts.space)
    headroom = float(opts.space.constraints.get("memory_headroom_gib", 0.0))
    enumerator = Enumerator(opts.space, q).require_plans()
    state = RunState(run_dir).prepare(q)
    handle = None
    if interrupts is not None:
        handle = interrupts.register(f"the search in {run_dir} (rerun the same command to finish it)", state.abandon)
    try:
        return _search(q, opts, enumerator, state, headroom, progress, t0)
    except BaseException:
        state.abandon()
        raise
    finally:
        if handle is not None:
            interrupts.unregister(handle)


def _search(
    q: Question, opts: SearchOptions, enumerator: Enumerator, state: RunState, headroom: float, progress, t0: float
) -> SearchResult:
    """The search proper (run_search): the plans, the result files, search.json last."""
    run_dir = state.run_dir
    history: list = []
    if enumerator.total <= opts.max_exhaustive:
        method = "exhaustive"
        writer = PlansWriter(run_dir, extra=plan_file_columns(q, opts.training))
        try:
            found = stream(
                q,
                enumerator,
                StreamOptions(top_k=opts.top_k, headroom_gib=headroom),
                write=writer.write,
                progress=progress,
            )
        except BaseException:
            writer.abort()
            raise
        state.replace_files()
        writer.close()
        timings = dict(found.timings)
    else:
        method = f"optuna-{opts.sampler}"
        found, history = optuna_search(q, opts, run_dir, headroom, progress, before_write=state.replace_files)
        timings = {"optuna_s": time.perf_counter() - t0}
    result = _result(q, opts, found, method, run_dir, timings, history, headroom)
    state.replace_files()
    t2 = time.perf_counter()
    write_run(result)
    timings["write_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    _write_search_json(result)
    state.finish()
    return result


def _result(q, opts, found: Streamed, method, run_dir, timings, history, headroom) -> SearchResult:
    margin = stored_margin()
    trade = float(opts.space.constraints.get("headroom_trade", HEADROOM_TRADE))
    # the plan the headroom rule ranks first, if any, leads every ranking below (rank_group)
    pool, headroom_line = rank_first_for_headroom(found.pool, margin, headroom, trade)
    if len(pool):  # the top plans and their variants: grouped by structure once, priced per trainer once
        top, variants = top_and_variants(pool, opts.top_k)
        shown = runs_on(pd.concat([top, variants], ignore_index=True), q, found.layouts, headroom)
        columns = ("trainers", "trainers_with_flags", "fp8_flags")
        top = top.assign(**{c: shown[c].to_numpy()[: len(top)] for c in columns})
        if len(variants):
            variants = variants.assign(**{c: shown[c].to_numpy()[len(top) :] for c in columns})
    else:
        top, variants = top_plans(pool, 0), top_and_variants(pool, opts.top_k)[1]
    runner = top.iloc[1] if len(top) > 1 else None
    counts = {"evaluated": found.evaluated, "valid": found.valid, "fit": found.fit}
    if len(top):
        why = headroom_line or why_winner(top.iloc[0], runner)
        if q.model.moe is not None:  # what decides the expert-parallel size
            why = " ".join(x for x in (why, ep_choice_line(top.iloc[0], pool)) if x)
    else:
        why = _no_fit_reason(counts, found.rejections, found.closest)
        why += offload_hint(q, found.closest, found.layouts, headroom) if counts.get("valid") else ""
    kept = pd.concat([pool, found.pareto, found.sample, found.closest], ignore_index=True)
    if "plan_index" in kept:
        kept = kept.drop_duplicates("plan_index")
    if "rank_group" in kept:  # the Pareto front's and the sample's rows are not the headroom pick
        kept = kept.assign(rank_group=kept["rank_group"].fillna(1).astype(int))
    per_trainer = {t: None for t in q.trainers} | (best_per_trainer(pool, margin, headroom, trade) if len(pool) else {})
    top = with_support(top, q, found.layouts)
    per_trainer = {
        t: None if row is None else with_support(row.to_frame().T, q, found.layouts).iloc[0]
        for t, row in per_trainer.items()
    }
    if opts.training is not None:  # days, GPU-hours, cost and goodput of every plan shown
        run = opts.training
        top, kept, pareto = (with_run_columns(df, q, run) for df in (top, kept, found.pareto))
        per_trainer = {
            t: None if row is None else with_run_columns(row.to_frame().T, q, run).iloc[0]
            for t, row in per_trainer.items()
        }
    else:
        pareto = found.pareto
    return SearchResult(
        question=q,
        options=opts,
        plans=kept,
        top=top,
        method=method,
        why=why,
        run_dir=run_dir,
        timings=timings,
        layouts=found.layouts,
        history=history,
        per_trainer=per_trainer,
        counts=counts,
        rejections=found.rejections,
        pareto=pareto,
        scatter=kept,
        sureness=sureness_lines(top, pool, margin),
        variants=variants,
    )


def runs_on(top: pd.DataFrame, q: Question, layouts: list, headroom: float) -> pd.DataFrame:
    """The top plans with `trainers`: every searched trainer whose capabilities admit the plan and on
    whose profile it fits. Priced as the walk prices (estimate_per_trainer: the rules once, each
    performance profile once, `fits` per trainer), not through a full estimate per (plan, trainer)."""
    table = PlanTable.from_plans([row_plan(r, layouts) for _, r in top.iterrows()])
    if FIT_MASK in top and top[FIT_MASK].notna().all():  # the walk priced every trainer already
        mask = top[FIT_MASK].to_numpy(dtype=np.int64)
        fits = np.stack([(mask >> TRAINER[t]) & 1 for t in q.trainers], axis=1).astype(bool)
    else:
        fits = _fits_per_trainer(table, q, headroom)
    names = [", ".join(t for t, ok in zip(q.trainers, row) if ok) for row in fits]
    flagged, flags = _runs_with_fp8_flags(table, fits, q, headroom)
    return top.assign(trainers=names, trainers_with_flags=flagged, fp8_flags=flags)


def _fits_per_trainer(table: PlanTable, q: Question, headroom: float) -> np.ndarray:
    """(plans, trainers): the plan is valid for the trainer and fits on its profile."""
    ests = estimate_per_trainer(
        table,
        q.model,
        q.cluster,
        tuple(q.trainers),
        num_gpus=q.num_gpus,
        seq_len=q.seq_len,
        headroom_gib=headroom,
        recipes=q.recipe_trainers,
        routing_imbalance=q.routing_imbalance,
    )
    return np.stack([e[FITS] for e in ests], axis=1) if ests else np.zeros((len(table), 0), dtype=bool)


def _runs_with_fp8_flags(table: PlanTable, fits: np.ndarray, q: Question, headroom: float) -> tuple[list, list]:
    """Per FP8 plan that leaves its recipe or parameter gather to its trainer's default: the other
    trainers that run it, and fit it, when those settings are named as its own trainer runs them
    (Megatron-Core's trainers differ only in those defaults: Bridge's recipes gather FP8 parameters,
    Megatron-LM does not unless told), and the flags that name them; '' where none."""
    from autopar.spec.fp8_recipes import param_gather_used, recipe_name

    flagged, flags = [""] * len(table), [""] * len(table)
    rows, plans = [], []
    for i in range(len(table)):
        plan = table.plan(i)
        if plan.dtype != "fp8" or "default" not in (plan.fp8_recipe, plan.fp8_param_gather):
            continue
        recipe = recipe_name(plan.dtype, plan.fp8_recipe, plan.trainer)
        gather = param_gather_used(plan.dtype, plan.fp8_recipe, plan.fp8_param_gather, plan.trainer)
        if recipe is None or gather is None:
            continue
        rows.append(i)
        plans.append(plan.with_(fp8_recipe=recipe, fp8_param_gather="on" if gather else "off"))
    if not rows:
        return flagged, flags
    named_fits = _fits_per_trainer(PlanTable.from_plans(plans), q, headroom)
    for j, (i, plan) in enumerate(zip(rows, plans)):
        more = [t for t, was, now in zip(q.trainers, fits[i], named_fits[j]) if now and not was]
        if more:
            flagged[i] = ", ".join(more)
            flags[i] = f"--fp8-recipe {plan.fp8_recipe} --fp8-param-gather {plan.fp8_param_gather}"
    return flagged, flags


def _no_fit_reason(counts: dict, rejections: dict, closest: pd.DataFrame) -> str:
    if not counts.get("valid"):
        top3 = ", ".join(list(rejections)[:3])
        return f"No plan is valid; the most common broken rules: {top3}."
    best = closest.iloc[0]
    return (
        f"No plan fits in memory; the closest is {best[PLAN_NAME]} ({best['recompute']} recompute, "
        f"zero {best['zero_stage']}), {best[MEMORY_MISS_GIB]:.1f} GiB over. Add GPUs, or widen the space "
        f"(more pp/tp, full recompute, zero 3)."
    )


def offload_hint(q: Question, closest: pd.DataFrame, layouts: list, headroom: float) -> str:
    """' Offloading its optimizer states ... would fit it' when the closest plan, re-estimated with its
    whole optimizer shard in host memory (--optimizer-offload 1, autopar.cost.offload), fits: with its
    ZeRO stage or ZeRO-1 (what every trainer that offloads accepts), by any searched trainer whose
    capabilities allow it (its GPU must state the host figures); the fastest such, or '' if none fits."""
    if not len(closest):
        return ""
    plan = row_plan(closest.iloc[0], layouts)
    if plan.optimizer_offload >= 1:
        return ""
    stages = dict.fromkeys((plan.zero_stage, 1))
    tried = [plan.with_(optimizer_offload=1.0, zero_stage=z, trainer=t) for z in stages for t in q.trainers]
    est = evaluate(PlanTable.from_plans(tried), q, headroom)
    fits = est[est[FITS].to_numpy(dtype=bool)]
    if not len(fits):
        return ""
    best = fits.sort_values(STEP_TIME_S).iloc[0]
    zero = f" --zero {best['zero_stage']}" if best["zero_stage"] != plan.zero_stage else ""
    return (
        f" Offloading its optimizer states to host memory would fit it (--optimizer-offload 1{zero} "
        f"--trainer {best['trainer']}: {best[PEAK_MEMORY_BYTES] / 2**30:.1f} GiB, "
        f"{best[STEP_TIME_S]:.3g} s per step)."
    )


def write_run(result: SearchResult) -> None:
    """top.json (top-k, the variants folded under them, best per trainer, Pareto front, all with
    full breakdowns), scatter.parquet and, with --csv, plans.csv (plans.parquet is written while the
    search streams)."""
    d = result.run_dir
    top, variants = top_entries(result)
    pareto = [row_summary(r, result.layouts) for r in result.pareto.to_dict("records")]
    per_trainer = {t: None if r is None else row_summary(r, result.layouts) for t, r in result.per_trainer.items()}
    write_top(
        d,
        {
            "why": result.why,
            "top": top,
            "variants": variants,
            "pareto": pareto,
            "per_trainer": per_trainer,
            "trainers_ruled_out": trainers_ruled_out(result),
        },
    )
    scatter = result.scatter.assign(
        in_pareto=result.scatter["plan_index"].isin(result.pareto["plan_index"]) if len(result.scatter) else []
    )
    write_scatter(d, scatter)
    if result.options.csv and (d / "plans.parquet").exists():
        write_csv(d)


def top_entries(result: SearchResult) -> tuple[list[dict], list[dict]]:
    """(the top-k, each with its rank, trainers and count of variants; the variants, each with
    `variant_of`: the rank it folds under) as top.json and `search --json` write them."""
    # rows as dicts, read once each (a Series per row costs more than the summary)
    top = [
        row_summary(r, result.layouts)
        | {"rank": i + 1, "trainers": _trainer_list(r), "variants": int(r.get("variants", 0))}
        | _flagged(r)
        for i, r in enumerate(result.top.to_dict("records"))
    ]
    variants = [
        row_summary(r, result.layouts) | {VARIANT_OF: int(r[VARIANT_OF]), "trainers": _trainer_list(r)}
        for r in result.variants.to_dict("records")
    ]
    return top, variants


def _trainer_list(row: pd.Series | dict, column: str = "trainers") -> list[str]:
    return [x for x in str(row.get(column, "") or "").split(", ") if x]


def _flagged(row: pd.Series | dict) -> dict:
    """The trainers that run an FP8 plan with its FP8 settings named, and those flags (none: {})."""
    more = _trainer_list(row, "trainers_with_flags")
    return {"trainers_with_flags": more, "fp8_flags": str(row.get("fp8_flags", ""))} if more else {}


def _write_search_json(result: SearchResult) -> None:
    q, o = result.question, result.options
    from importlib.metadata import version

    from autopar.secrets import mask_secrets

    info = {
        "schema_version": SCHEMA_VERSION,
        "autopar_version": __version__,
        "question": {
            "model": q.model.to_dict(),
            "num_gpus": q.num_gpus,
            "cluster": q.cluster.to_dict(),
            "seq_len": q.seq_len,
            "global_batch_size": q.global_batch_size,
            "trainers": list(q.trainers),
            "rank_by": q.rank_by,
            "recipes": dict(q.recipes),  # trainer -> the recipe `--recipe` named (the exports start from it)
            "routing_imbalance": q.routing_imbalance,  # MoE: the busiest expert rank / the mean
        },
        "space": {
            "name": o.space.name,
            "source": o.space.source,
            "knobs": o.space.knobs,
            "constraints": o.space.constraints,
        },
        # a --storage URL's password never reaches the file: user:***@host
        "options": {
            k: (mask_secrets(str(v)) if isinstance(v, (str, Path)) else v) for k, v in asdict(o).items() if k != "space"
        },
        "method": result.method,
        "plans_evaluated": result.counts.get("evaluated", 0),
        "plans_valid": result.counts.get("valid", 0),
        "plans_fit": result.counts.get("fit", 0),
        REJECTED_BY: result.rejections,
        "rule_bits": rejection_bits(),
        "why": result.why,
        "sureness": result.sureness,
        "timings_s": result.timings,
        "history": result.history,
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "pandas": pd.__version__,
            "optuna": version("optuna"),
        },
    }
    write_search_info(result.run_dir, info)


def searched_trainers(result: SearchResult) -> tuple[str, ...]:
    """The trainers of the question the space searched (a space's `trainer` knob may name fewer)."""
    q = result.question
    named = result.options.space.knobs.get("trainer") if result.options.space is not None else None
    return tuple(t for t in q.trainers if not isinstance(named, list) or t in named)


def trainers_ruled_out(result: SearchResult) -> dict[str, str]:
    """Per searched trainer that one of its capability lines rules out for every plan of the space
    (no recipe for the model, no MoE, an attention variant it lacks), and that therefore has no plan
    that fits: a sentence naming the trainer, what it lacks, the source of that line and what to do
    instead."""
    from autopar.spec.trainers import get_trainer

    q = result.question
    searched = searched_trainers(result)
    per_trainer = result.counts.get("evaluated", 0) / max(len(searched), 1)
    out: dict[str, str] = {}
    for key in searched:
        if result.per_trainer.get(key) is not None:
            continue  # it has a plan that fits: nothing rules it out
        t = get_trainer(key)
        for rule, count in result.rejections.items():
            owner, _, kind = rule.partition(":")
            cap = t.recipes if kind == "recipes" else t.capabilities.get(kind)
            if owner != key or count < per_trainer or cap is None:
                continue
            lacks = f"has no recipe for {q.model.name}" if kind == "recipes" else f"cannot run {q.model.name} ({kind})"
            out[key] = f"{t.title} {lacks} ({cap.source})" + (f"; {cap.instead}" if cap.instead else "")
            break
    return out
