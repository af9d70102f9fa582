"""Plans to export from an `autopar search` run directory: rank N of top.json, with the model,
cluster and sequence length of search.json's question."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autopar.errors import InputError
from autopar.search.run_dir import read_json
from autopar.spec.hardware import ClusterSpec, cluster_from_dict
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan


@dataclass(frozen=True)
class RunEntry:
    plan: ParallelPlan
    model: ModelSpec
    cluster: ClusterSpec
    seq_len: int
    num_gpus: int
    rank: int
    of: int  # entries in top.json
    entry: dict  # the top.json entry (plan_name, step_time_s, ...)
    #: (trainer, recipe) the search's --recipe named (search.json's question)
    recipes: tuple[tuple[str, str], ...] = ()


def load_run_plan(run_dir: str | Path, rank: int) -> RunEntry:
    d = Path(run_dir)
    if not d.is_dir():
        raise InputError(
            f"run directory '{run_dir}' does not exist; pass the --run-dir of an `autopar search` "
            f"(default reports/<model>_<gpus>x<gpu>_...)"
        )
    top = read_json(d / "top.json")
    search = read_json(d / "search.json")
    entries = top.get("top") if isinstance(top, dict) else None
    if not isinstance(entries, list):
        raise InputError(f"{d / 'top.json'} has no 'top' list; rerun the search")
    if not entries:
        trainers = (search.get("question") or {}).get("trainers") if isinstance(search, dict) else None
        on = f" on {', '.join(trainers)}" if isinstance(trainers, list) and trainers else ""
        raise InputError(
            f"{d / 'top.json'} ranks no plan (nothing valid fit{on}); nothing to export: rerun the "
            f"search with another --trainer, more GPUs or another --space"
        )
    if not isinstance(rank, int) or rank < 1 or rank > len(entries):
        raise InputError(f"--rank {rank} is out of range: {d / 'top.json'} ranks plans 1..{len(entries)}")
    entry = entries[rank - 1]
    try:
        q = search["question"]
        from autopar.spec.presets import model_from_dict

        mdict = dict(q["model"])
        model = model_from_dict(mdict.pop("name"), mdict)
        cdict = dict(q["cluster"])
        cdict.pop("name", None)
        cluster = cluster_from_dict(cdict, origin=f"{d / 'search.json'} cluster")
        plan = ParallelPlan.from_dict(entry["plan"])
        seq_len, num_gpus = int(q["seq_len"]), int(q["num_gpus"])
        recipes = tuple((str(t), str(r)) for t, r in (q.get("recipes") or {}).items())
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(
            f"{d} has an unreadable plan or question ({type(e).__name__}: {e}); rerun the search"
        ) from None
    if plan.num_gpus != num_gpus:
        raise InputError(
            f"rank {rank} of {d} uses {plan.num_gpus} GPUs but the search asked for {num_gpus}; rerun the search"
        )
    return RunEntry(
        plan=plan,
        model=model,
        cluster=cluster,
        seq_len=seq_len,
        num_gpus=num_gpus,
        rank=rank,
        of=len(entries),
        entry=entry,
        recipes=recipes,
    )
