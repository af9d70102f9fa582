"""What-if: the same question over several GPU counts, GPU kinds, sequence lengths and global
batch sizes, best plan per scenario. The global batch is part of the question, never a searched
knob: it changes what training converges to, not only how fast a step runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autopar.errors import InputError
from autopar.search.enumerate import knob_choices
from autopar.search.run import SearchOptions, SearchResult, row_summary, run_search, top_entries
from autopar.search.space import SearchSpace
from autopar.search.training import check_question_run
from autopar.spec.model import ModelSpec
from autopar.spec.question import Question
from autopar.spec.resolve import DEFAULT_TOKENS_PER_STEP, resolve_cluster
from autopar.spec.trainers import TRAINERS

#: scenarios of one what-if at most (each is a whole search)
MAX_SCENARIOS = 64


@dataclass(frozen=True)
class Scenario:
    num_gpus: int
    gpu: str | None  # None: from the cluster file
    seq_len: int
    gbs: int | None = None  # sequences; None: the space's tokens_per_step


def global_batch(space: SearchSpace, seq_len: int, gbs: int | None) -> int:
    """--gbs, else the space's tokens_per_step (default 4M tokens) in sequences."""
    if gbs:
        return gbs
    tokens = space.knobs.get("tokens_per_step", DEFAULT_TOKENS_PER_STEP)
    return max(1, round(tokens / seq_len))


def run_scenarios(
    model: ModelSpec,
    space: SearchSpace,
    scenarios: list[Scenario],
    *,
    gpus_per_node=None,
    cluster_file=None,
    run_dir: Path | None = None,
    progress=None,
    trainers: tuple[str, ...] = TRAINERS,
    rank_by: str = "expected",
    interrupts=None,
    **opts,
) -> list[SearchResult]:
    questions = []
    for sc in scenarios:  # every scenario checked before any is searched
        cluster = resolve_cluster(sc.gpu or "h100-sxm", gpus_per_node, cluster_file)
        q = Question(
            model=model,
            num_gpus=sc.num_gpus,
            cluster=cluster,
            seq_len=sc.seq_len,
            global_batch_size=global_batch(space, sc.seq_len, sc.gbs),
            trainers=trainers,
            rank_by=rank_by,
        )
        check_batch(space, q, given=sc.gbs is not None)
        questions.append(q)
    check_question_run(questions, opts.get("training"), space.knobs.get("dtype") or ["bf16"])
    return [
        run_search(q, SearchOptions(space=space, run_dir=run_dir, **opts), progress=progress, interrupts=interrupts)
        for q in questions
    ]


def check_batch(space: SearchSpace, q: Question, given: bool) -> None:
    """Refuse, before searching, a global batch that no layout of the space can split: every plan
    needs it to be a multiple of micro-batch x dp (dp = GPUs / (tp*pp*cp)). Names the smallest
    batch at least as large that some layout splits."""
    n, choices = q.num_gpus, knob_choices(space, q)
    products = {1}
    for axis in ("tp", "pp", "cp"):  # partial products that divide the GPUs (at most its divisors)
        products = {x * v for x in products for v in choices[axis] if n % (x * v) == 0}
    units = {m * (n // x) for x in products for m in choices["mbs"]}
    gbs = q.batch
    if not units or any(gbs % u == 0 for u in units):
        return
    better = min(-(-gbs // u) * u for u in units)
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
        "trainers": list(q.trainers),
        "rank_by": q.rank_by,
        "space": r.options.space.name,
        "method": r.method,
        "plans_evaluated": r.counts["evaluated"],
        "plans_fit": r.counts["fit"],
        "why": r.why,
        "sureness": r.sureness,
        "run_dir": str(r.run_dir),
        "timings_s": r.timings,
        "top": top,
        "variants": variants,
        "per_trainer": {t: None if row is None else row_summary(row, r.layouts) for t, row in r.per_trainer.items()},
    }


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
        raise InputError("; ".join(blocked))
    rules = ", ".join(f"{k} ({v:,} plans)" for k, v in list(r.rejections.items())[:3])
    where = f"{q.model.name} on {q.num_gpus:,} x {q.cluster.gpu.key}" + (
        " (and every other scenario)" if len(results) > 1 else ""
    )
    trainer = "another --trainer, " if any(":" in k for k in list(r.rejections)[:3]) else ""
    raise InputError(
        f"no plan of the space is valid for {where}; the most common broken rules: {rules}; use {trainer}fewer "
        f"GPUs, another --gbs, or a wider --space"
    )


def trainers_ruled_out(result: SearchResult) -> list[str]:
    """Per trainer of the question that one of its capability lines rules out for every plan of
    the space (no recipe for the model, no MoE, an attention variant it lacks): a sentence naming
    the trainer, what it lacks, the source of that line and what to do instead."""
    from autopar.spec.trainers import get_trainer

    q = result.question
    per_trainer = result.counts.get("evaluated", 0) / max(len(q.trainers), 1)
    out = []
    for key in q.trainers:
        t = get_trainer(key)
        for rule, count in result.rejections.items():
            owner, _, kind = rule.partition(":")
            cap = t.recipes if kind == "recipes" else t.capabilities.get(kind)
            if owner != key or count < per_trainer or cap is None:
                continue
            lacks = f"has no recipe for {q.model.name}" if kind == "recipes" else f"cannot run {q.model.name} ({kind})"
            out.append(f"{t.title} {lacks} ({cap.source})" + (f"; {cap.instead}" if cap.instead else ""))
            break
    return out

