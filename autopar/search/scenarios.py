"""What-if: the same question over several GPU counts, GPU kinds, sequence lengths and global
batch sizes, best plan per scenario. The global batch is part of the question, never a searched
knob: it changes what training converges to, not only how fast a step runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autopar.search.enumerate import Question
from autopar.search.run import SearchOptions, SearchResult, row_summary, run_search
from autopar.search.space import SearchSpace
from autopar.spec.model import ModelSpec
from autopar.spec.resolve import DEFAULT_TOKENS_PER_STEP, resolve_cluster
from autopar.spec.trainers import TRAINERS


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


def run_scenarios(model: ModelSpec, space: SearchSpace, scenarios: list[Scenario], *, gpus_per_node=None,
                  cluster_file=None, run_dir: Path | None = None, progress=None,
                  trainers: tuple[str, ...] = TRAINERS, **opts) -> list[SearchResult]:
    out = []
    for sc in scenarios:
        cluster = resolve_cluster(sc.gpu or "h100-sxm", gpus_per_node, cluster_file)
        q = Question(model=model, num_gpus=sc.num_gpus, cluster=cluster, seq_len=sc.seq_len,
                     global_batch_size=global_batch(space, sc.seq_len, sc.gbs), trainers=trainers)
        out.append(run_search(q, SearchOptions(space=space, run_dir=run_dir, **opts), progress=progress))
    return out


def result_json(r: SearchResult) -> dict:
    q = r.question
    return {"model": q.model.name, "num_gpus": q.num_gpus, "gpu": q.cluster.gpu.key, "seq_len": q.seq_len,
            "global_batch_size": q.global_batch_size, "trainers": list(q.trainers), "space": r.options.space.name,
            "method": r.method,
            "plans_evaluated": r.counts["evaluated"], "plans_fit": r.counts["fit"], "why": r.why,
            "run_dir": str(r.run_dir), "timings_s": r.timings,
            "top": [row_summary(row, r.layouts) | {"rank": i + 1, "trainers": str(row["trainers"]).split(", ")}
                    for i, (_, row) in enumerate(r.top.iterrows())],
            "per_trainer": {t: None if row is None else row_summary(row, r.layouts)
                            for t, row in r.per_trainer.items()}}
