"""What-if: the same question over several GPU counts, GPU kinds, sequence lengths and global
batch sizes, best plan per scenario. The global batch is part of the question, never a searched
knob: it changes what training converges to, not only how fast a step runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from autopar import forked
from autopar.errors import InputError
from autopar.figures import MFU, PLAN_NAME, STEP_TIME_S
from autopar.search.enumerate import knob_choices
from autopar.search.run import SearchOptions, SearchResult, row_summary, run_search, top_entries, trainers_ruled_out
from autopar.search.space import SearchSpace, chosen_space
from autopar.search.training import check_question_run
from autopar.search.what_if import MAX_SCENARIOS as MAX_SCENARIOS
from autopar.search.what_if import Scenario
from autopar.spec.model import ModelSpec
from autopar.spec.question import Question
from autopar.spec.resolve import DEFAULT_TOKENS_PER_STEP, resolve_cluster
from autopar.spec.routing import FORCED_BALANCED, REAL_ROUTER_IMBALANCE
from autopar.spec.trainers import TRAINERS


def scenario_space(space: SearchSpace | None, sc: Scenario, model: ModelSpec) -> SearchSpace:
    """The space a scenario searches: the given one, or without one the space chosen from the model
    and the scenario's sequence length (autopar.search.space.chosen_space); with --dtype, the
    space's dtype knob set to that one precision, named after it (`default+fp8`) so that each
    precision of a what-if has its own run directory."""
    if space is None:
        space = chosen_space(model.moe is not None, sc.seq_len)
    if sc.dtype is None:
        return space
    pinned = space.with_knobs(dtype=[sc.dtype])
    return replace(pinned, name=f"{space.name}+{sc.dtype}")


def global_batch(space: SearchSpace, seq_len: int, gbs: int | None) -> int:
    """--gbs, else the space's tokens_per_step (default 4M tokens) in sequences."""
    if gbs:
        return gbs
    tokens = space.knobs.get("tokens_per_step", DEFAULT_TOKENS_PER_STEP)
    return max(1, round(tokens / seq_len))


def _routing_note(q: Question) -> list[str]:
    """For a MoE model: the routing the plans are priced with (autopar.spec.routing)."""
    if q.model.moe is None:
        return []
    if q.routing_imbalance == FORCED_BALANCED:
        return ["MoE routing: forced balance (--routing-imbalance 1), as benchmark runs force it"]
    caveat = (
        " (measured on an aux-loss router; this model's bias-balanced router may stay closer to the mean)"
        if q.model.moe.router_bias and q.routing_imbalance == REAL_ROUTER_IMBALANCE
        else ""
    )
    return [
        f"MoE routing: a real router, the busiest expert rank {q.routing_imbalance:g}x the mean (at most ep)"
        f"{caveat}; --routing-imbalance 1 prices forced balance"
    ]


def run_scenarios(
    model: ModelSpec,
    space: SearchSpace | None,
    scenarios: list[Scenario],
    *,
    gpus_per_node=None,
    cluster_file=None,
    run_dir: Path | None = None,
    progress=None,
    trainers: tuple[str, ...] = TRAINERS,
    rank_by: str = "expected",
    interrupts=None,
    recipes: tuple[tuple[str, str], ...] = (),
    power_limit_w: float | None = None,
    routing_imbalance: float | None = None,
    on_result: Callable[[SearchResult], None] | None = None,
    **opts,
) -> list[SearchResult]:
    """Each scenario's search; `on_result(result)` here as each search ends (the CLI reads the run back
    for the reports while a what-if's other scenarios are still searched)."""
    questions, notes, spaces = [], [], []
    for sc in scenarios:  # every scenario checked before any is searched
        sp = scenario_space(space, sc, model)
        cluster = resolve_cluster(sc.gpu or "h100-sxm", gpus_per_node, cluster_file, power_limit_w)
        q = Question(
            model=model,
            num_gpus=sc.num_gpus,
            cluster=cluster,
            seq_len=sc.seq_len,
            global_batch_size=global_batch(sp, sc.seq_len, sc.gbs),
            trainers=trainers,
            rank_by=rank_by,
            recipes=recipes,
            routing_imbalance=REAL_ROUTER_IMBALANCE if routing_imbalance is None else routing_imbalance,
        )
        q, note = adapt_default_batch(sp, q) if sc.gbs is None else (q, None)
        check_batch(sp, q, given=sc.gbs is not None)
        questions.append(q)
        notes.append(([] if note is None else [note]) + _routing_note(q))
        spaces.append(sp)
    dtypes = list(dict.fromkeys(d for sp in spaces for d in sp.knobs.get("dtype") or ["bf16"]))
    check_question_run(questions, opts.get("training"), dtypes)
    searches = [
        partial(run_search, q, SearchOptions(space=sp, run_dir=run_dir, **opts), interrupts=interrupts)
        for q, sp in zip(questions, spaces)
    ]
    if forked.workers_for(len(searches)) > 1:  # a what-if on the machine's cores (autopar.forked)
        n = len(searches)
        # an interrupt stops the workers where they are: the runs they leave marked incomplete are what
        # a rerun finishes, as the interrupt's line says
        what = f"the what-if's {n} searches (rerun the same command to finish them)"
        handle = interrupts.register(what, lambda: None) if interrupts is not None else None
        finished: list[int] = []

        def done(i: int, r: SearchResult) -> None:
            finished.append(i)
            if progress is not None:
                progress("scenarios searched", len(finished), n)
            if on_result is not None:
                on_result(r)

        try:
            results = forked.forked_map(searches, done=done)
        finally:
            if handle is not None:
                interrupts.unregister(handle)
    else:  # here, with the walk's own progress
        results = []
        for search in searches:
            results.append(search(progress=progress))
            if on_result is not None:
                on_result(results[-1])
    for r, scenario_notes, sc, sp in zip(results, notes, scenarios, spaces):
        forced = batch_forces_model_parallel(sp, r) if sc.gbs is None else None
        r.notes = scenario_notes + ([forced] if forced else [])
    return results


def _batch_units(space: SearchSpace, q: Question) -> tuple[set[int], set[int]]:
    """(micro-batch x dp of every layout of the space on q's GPUs, the GPUs of one replica of each):
    a global batch splits over a layout when it is a multiple of its micro-batch x dp, with dp =
    GPUs / (tp*pp*cp)."""
    n, choices = q.num_gpus, knob_choices(space, q)
    products = {1}
    for axis in ("tp", "pp", "cp"):  # partial products that divide the GPUs (at most its divisors)
        products = {x * v for x in products for v in choices[axis] if n % (x * v) == 0}
    return {m * (n // x) for x in products for m in choices["mbs"]}, products


def smallest_splitting_batch(space: SearchSpace, q: Question) -> int | None:
    """The smallest global batch >= q's that some layout of the space splits (a multiple of its
    micro-batch x dp); None when no layout divides the GPUs."""
    units, _ = _batch_units(space, q)
    return min((-(-q.batch // u) * u for u in units), default=None)


def adapt_default_batch(space: SearchSpace, q: Question) -> tuple[Question, str | None]:
    """The default global batch (the space's tokens_per_step, not the user's --gbs) when some
    layout splits it; else the smallest batch above it that some layout splits (it keeps at least
    the tokens per step the default asks for, and the fewest more), with the line that says so."""
    better = smallest_splitting_batch(space, q)
    if better is None or better == q.batch:
        return q, None
    note = (
        f"the default global batch ({q.batch:,} sequences of {q.seq_len:,} tokens) cannot be split over "
        f"{q.num_gpus:,} GPUs, so this search uses {better:,} sequences ({better * q.seq_len:,} tokens per "
        f"step), the smallest batch above it that a layout of the space splits; give --gbs to choose another"
    )
    return replace(q, global_batch_size=better), note


def batch_forces_model_parallel(space: SearchSpace, r: SearchResult) -> str | None:
    """A warning when the global batch is what forces the best plan's pipeline / context
    parallelism: dp is at most the batch (one sequence per replica), so a replica spans at least
    GPUs / batch GPUs; when that is more than the space's largest tp, every layout needs pp x cp > 1,
    and a larger --gbs lets dp take those GPUs instead. It says what the batch costs: the MFU the
    same search reaches at a larger batch (`larger_batch`: the one a published run of the model
    trained with, cited, else the smallest that lets one replica fit in tp), and the what-if to run.
    The batch is never changed: it is a training choice."""
    from autopar.search.run import row_plan

    q = r.question
    widest_tp = max(knob_choices(space, q)["tp"])
    replica = -(-q.num_gpus // q.batch)  # the fewest GPUs a replica spans, at dp = the batch
    if r.winner is None or replica <= widest_tp:
        return None
    plan = row_plan(r.winner, r.layouts)
    line = (
        f"warning: the global batch ({q.batch:,} sequences) is what forces cp{plan.cp}·pp{plan.pp} here: it "
        f"allows at most dp={q.batch:,} on {q.num_gpus:,} GPUs, so each replica spans at least {replica:,} "
        f"GPUs, more than tp (at most {widest_tp}) takes; a larger --gbs lets dp grow and pp, cp shrink"
    )
    bigger = larger_batch(space, q, widest_tp)
    if bigger is None:
        return line
    gbs, why = bigger
    there = _winner_at(space, r, gbs)
    if there is None:
        return line
    return (
        f"{line}. What it costs: {100 * float(r.winner[MFU]):.1f} % MFU here against "
        f"{100 * float(there[MFU]):.1f} % for {there[PLAN_NAME]} at --gbs {gbs:,} ({why}); the what-if: "
        f"--gbs {q.batch},{gbs}. autopar keeps the batch you train with: it is a training choice"
    )


def larger_batch(space: SearchSpace, q: Question, widest_tp: int) -> tuple[int, str] | None:
    """(a larger global batch, why that one): the batch a published run of the model trained with
    at scale (autopar.spec.presets.published_batch, with its source), else the smallest batch that
    lets a replica fit in the widest tp; each rounded up to a batch some layout of the space splits;
    None when neither is larger than q's."""
    from autopar.spec.presets import published_batch

    published = published_batch(q.model.name)
    wants = []
    if published is not None:
        tokens, source = published
        wants.append((tokens // q.seq_len, f"{tokens:,} tokens per step: {source}"))
    wants.append((-(-q.num_gpus // widest_tp), f"the smallest batch whose replicas fit in tp {widest_tp}"))
    for want, why in wants:
        gbs = smallest_splitting_batch(space, replace(q, global_batch_size=max(want, 1)))
        if gbs is not None and gbs > q.batch:
            return gbs, why
    return None


def _winner_at(space: SearchSpace, r: SearchResult, gbs: int):
    """The winner of the same search at another global batch (its run directory thrown away, and
    nothing written to the user's Optuna storage)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="autopar-batch-") as tmp:
        opts = replace(r.options, run_dir=Path(tmp), storage=None, study_name=None, csv=False)
        other = run_search(replace(r.question, global_batch_size=gbs), opts)
    return other.winner


def check_batch(space: SearchSpace, q: Question, given: bool) -> None:
    """Refuse, before searching, a global batch that no layout of the space can split: every plan
    needs it to be a multiple of micro-batch x dp (dp = GPUs / (tp*pp*cp)). Names the smallest
    batch at least as large that some layout splits."""
    n = q.num_gpus
    units, products = _batch_units(space, q)
    gbs = q.batch
    if not units or any(gbs % u == 0 for u in units):
        return
    better = smallest_splitting_batch(space, q)
    fewest = min(n // x for x in products)
    what = f"--gbs {gbs}" if given else f"the default global batch ({gbs} sequences of {q.seq_len} tokens)"
    raise InputError(
        f"{what} cannot be split over {n:,} GPUs: a global batch must be a multiple of micro-batch x "
        f"dp, and every layout of the space leaves at least dp = {fewest:,}; raise --gbs to {better:,} "
        f"(or another multiple of micro-batch x dp), or use fewer GPUs"
    )


def result_json(r: SearchResult) -> dict:
    q = r.question
    top, variants = top_entries(r)
    return {
        "model": q.model.name,
        "num_gpus": q.num_gpus,
        "gpu": q.cluster.gpu.key,
        "seq_len": q.seq_len,
        "global_batch_size": q.global_batch_size,
        "notes": list(r.notes),  # the default batch adapted to the GPUs, or forcing pp / cp
        "trainers": list(q.trainers),
        "trainers_ruled_out": trainers_ruled_out(r),  # trainer -> why it can run no plan of the space
        "rank_by": q.rank_by,
        "space": r.options.space.name,
        "space_chosen": r.options.space.chosen_because or None,  # None: named by --space
        "method": r.method,
        "plans_evaluated": r.counts["evaluated"],
        "plans_fit": r.counts["fit"],
        "why": r.why,
        "space_bounds": space_bounds(r),
        "sureness": r.sureness,
        "run_dir": str(r.run_dir),
        "timings_s": r.timings,
        "top": top,
        "variants": variants,
        "per_trainer": {t: None if row is None else row_summary(row, r.layouts) for t, row in r.per_trainer.items()},
    }


#: the integer knobs whose bound the winner can sit on: knob -> the plans' column
BOUNDED_KNOBS = {"tp": "tp", "pp": "pp", "vpp": "vpp", "cp": "cp", "mbs": "micro_batch_size"}


def _largest(space: SearchSpace, q: Question, knob: str) -> int:
    """The largest choice of an integer knob after the space's constraints (max_pp, max_cp, ...)."""
    choices = knob_choices(space, q)
    if knob == "vpp":
        return max(v for _, v in choices["sched_vpp"])
    return max(choices[knob])


def _next_possible(knob: str, value: int, row, q: Question) -> bool:
    """Whether twice the winner's `value` of `knob` is still a layout of the question: a divisor
    of the GPUs (tp within a node, pp up to the layers), vpp with a pipeline, mbs splitting the batch."""
    double = 2 * value
    if knob == "tp":
        return double <= q.cluster.gpus_per_node and q.num_gpus % double == 0
    if knob in ("pp", "cp"):
        return q.num_gpus % double == 0 and (knob == "cp" or double <= q.model.num_layers)
    if knob == "vpp":
        return int(row["pp"]) > 1 and int(row["pp"]) * double <= q.model.num_layers
    return q.batch % (double * int(row["dp"])) == 0  # mbs


def space_bounds(r: SearchResult) -> list[str]:
    """Where the winner (or the fastest plan, when the headroom rule ranked another first) sits on
    the space's largest choice of a knob that could go further, with the shipped space that goes
    furthest on it: 'cp hit the space's maximum 2: try --space
    long-context (cp up to 32)'. Results depend on the space; this says when they may."""
    from autopar.search.space import load_space, space_names

    q, space = r.question, r.options.space
    if r.winner is None:
        return []
    # the winner, and the fastest plan where the headroom rule ranked a slower one first
    shown = [r.winner, r.top.iloc[int(np.argmin(r.top[STEP_TIME_S].to_numpy(dtype=float)))]]
    out = []
    for knob, column in BOUNDED_KNOBS.items():
        largest = _largest(space, q, knob)
        on = [w for w in shown if int(w[column]) == largest and _next_possible(knob, largest, w, q)]
        if not on or largest <= 1:
            continue  # a knob the space leaves off (its one choice is 1) is a choice, not a bound
        value = largest
        wider = {n: _largest(load_space(n), q, knob) for n in space_names() if n not in ("local", space.name)}
        name, reach = max(wider.items(), key=lambda kv: kv[1], default=("", 0))
        fix = f"try --space {name} ({knob} up to {reach})" if reach > value else f"widen '{knob}' in a space file"
        out.append(f"{knob} hit the space's maximum {largest}: {fix}")
    return out


def check_any_valid(results: list[SearchResult]) -> None:
    """One line when no scenario has a single valid plan (every plan breaks a rule of the model,
    the batch or a trainer): the question has no answer, so it is bad input, not a result. A
    scenario where plans are valid but none fits in memory is a result (exit 0), and so is an Optuna
    search that sampled no valid plan (the space may hold some: more --n-trials can find them)."""
    if not results or any(r.counts.get("valid", 0) or r.method != "exhaustive" for r in results):
        return
    r = results[0]
    q = r.question
    blocked = trainers_ruled_out(r)
    if blocked and len(blocked) == len(q.trainers):  # the trainers, not the GPUs or the batch
        raise InputError("; ".join(blocked.values()))
    rules = ", ".join(f"{k} ({v:,} plans)" for k, v in list(r.rejections.items())[:3])
    where = f"{q.model.name} on {q.num_gpus:,} x {q.cluster.gpu.key}" + (
        " (and every other scenario)" if len(results) > 1 else ""
    )
    trainer = "another --trainer, " if any(":" in k for k in list(r.rejections)[:3]) else ""
    raise InputError(
        f"no plan of the space is valid for {where}; the most common broken rules: {rules}; use {trainer}fewer "
        f"GPUs, another --gbs, or a wider --space"
    )
