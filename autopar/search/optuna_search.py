"""The search when the space is too large to walk: Optuna samples it (a study that resumes from its
storage, shared by workers), then every completion of every structure any worker tried is priced
and kept as the exhaustive walk prices and keeps its plans, and written as plans.parquet, in the
streamed results' shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from autopar.errors import InputError
from autopar.search.evaluate import best_completion
from autopar.search.options import SearchOptions
from autopar.search.run_dir import PlansWriter
from autopar.search.run_state import question_summary, recorded_summary, summary_text
from autopar.search.space import SearchSpace
from autopar.search.streaming import StreamOptions, stream_table
from autopar.search.training import plan_file_columns
from autopar.spec.question import Question


def optuna_search(
    q: Question,
    opts: SearchOptions,
    run_dir: Path,
    headroom: float,
    progress,
    before_write: Callable[[], None] = lambda: None,
):
    """Optuna samples the space (the study resumes from its storage); every structure any worker
    tried is priced again, chunk by chunk, and written as plans.parquet (published after
    `before_write`)."""
    from autopar.search import optuna_driver as od

    url = od.storage_url(opts.storage, run_dir)
    name = opts.study_name or run_dir.name
    directions: list[od.Direction] = ["minimize", "maximize"] if opts.multi_objective else ["minimize"]
    study = od.load_or_create_study(
        url, name, od.make_sampler(opts.sampler, opts.seed, opts.multi_objective), directions
    )
    _claim_study(study, q, opts.space, run_dir)
    od.fail_stale(study, older_than_s=5.0)
    od.run_study(
        opts.space,
        q,
        study,
        opts.n_trials,
        lambda table: best_completion(table, q, headroom)[0],
        opts.multi_objective,
        on_trial=(lambda n: progress("optuna trials", n, opts.n_trials)) if progress else None,
    )
    od.wait_for_running(study)  # the other workers' last trials: every worker reports the whole study
    # every completion of every structure any worker tried, priced again as the walk prices its chunks
    trials = [t for t in study.get_trials(deepcopy=False) if "outer" in t.user_attrs]
    first_seen: dict[tuple, int] = {}
    for t in trials:
        first_seen.setdefault(tuple(sorted(t.user_attrs["outer"].items())), t.number)
    table = od.structures_table(opts.space, q, [dict(k) for k in first_seen])
    table.columns["plan_index"] = np.arange(len(table), dtype=np.int64)
    writer = PlansWriter(run_dir, extra=plan_file_columns(q, opts.training))
    try:  # priced and kept as the exhaustive walk does: light columns, the kept rows in full
        found = stream_table(q, table, StreamOptions(top_k=opts.top_k, headroom_gib=headroom), write=writer.write)
    except BaseException:
        writer.abort()
        raise
    before_write()
    writer.close()
    return found, od.study_history(study)


def _claim_study(study, q: Question, space: SearchSpace, run_dir: Path) -> None:
    """Mark the study with its question; refuse one that holds another question's trials (a run
    directory or --study-name reused for another model, GPU count, ...)."""
    import hashlib

    mine = question_summary(q) | {"space": space.name, "trainers": sorted(q.trainers)}
    if q.rank_by != "expected":  # another objective: the study of the central prediction is not this one
        mine["rank_by"] = q.rank_by
    key = hashlib.sha256(json.dumps(mine, sort_keys=True, default=str).encode()).hexdigest()[:16]
    have = study.user_attrs.get("question_key")
    if have == key:
        return
    other = study.user_attrs.get("question", "another question")
    if have is None:  # a new study, or one an older autopar made: its run directory's search.json tells
        old = recorded_summary(run_dir)
        if not (study.get_trials(deepcopy=False) and old is not None and old != question_summary(q)):
            study.set_user_attr("question_key", key)
            study.set_user_attr("question", f"{summary_text(mine)}, space {space.name}")
            return
        other = summary_text(old)
    raise InputError(
        f"study '{study.study_name}' holds the trials of another question ({other}); give another "
        f"--run-dir or --study-name, or delete the study"
    )
