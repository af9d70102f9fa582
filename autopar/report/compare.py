"""`autopar compare`: two or more layouts of one question (model, cluster, GPU count, sequence
length), estimated by the cost model and aligned metric by metric.

A layout comes from a run directory (its winner, or `DIR#rank` from top.json), a plan JSON file (an
object with a `plan` mapping: a trial file or `autopar estimate --json` output), or, through the
CLI, a flag string such as "--tp 8 --pp 4". This module resolves the first two and checks that all
the layouts answer the same question; the CLI parses flag strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from autopar.calibration.estimate import Estimate, estimate
from autopar.errors import InputError
from autopar.report import compare_tables as C
from autopar.report import run_data as D
from autopar.spec.hardware import cluster_from_dict
from autopar.spec.plan import ParallelPlan
from autopar.spec.question import Question
from autopar.spec.routing import FORCED_BALANCED


@dataclass
class CompareItem:
    source: str  # what the user gave
    plan: ParallelPlan
    question: Question
    label: str = ""


@dataclass
class Comparison:
    items: list[CompareItem]
    estimates: list[Estimate]
    table: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def labels(self) -> list[str]:
        return [i.label for i in self.items]

    @property
    def question(self) -> Question:
        return self.items[0].question

    def estimate_dicts(self) -> list[dict]:
        return [e.to_dict() | {"name": i.plan.describe()} for i, e in zip(self.items, self.estimates)]


def split_rank(arg: str) -> tuple[str, int | None]:
    """'DIR#3' -> ('DIR', 3); anything else -> (arg, None)."""
    head, sep, tail = arg.rpartition("#")
    if sep and tail.isdigit() and head:
        return head, int(tail)
    return arg, None


def question_from_search(search: dict, origin: str) -> Question:
    from autopar.spec.presets import model_from_dict

    try:
        q = search["question"]
        m = dict(q["model"])
        model = model_from_dict(m.pop("name"), m)
        cluster = cluster_from_dict(q["cluster"], origin=origin)
        return Question(
            model=model,
            cluster=cluster,
            num_gpus=int(q["num_gpus"]),
            seq_len=int(q["seq_len"]),
            global_batch_size=int(q["global_batch_size"]),
            # a run directory of before the routing was recorded priced forced balance
            routing_imbalance=float(q.get("routing_imbalance", FORCED_BALANCED)),
        )
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(
            f"{origin}: the question is incomplete ({type(e).__name__}: {e}); rerun `autopar search`"
        ) from None


def item_from_run(arg: str) -> CompareItem:
    """A run directory's winner, or DIR#rank (1-based, from top.json)."""
    path, rank = (arg, None) if Path(arg).is_dir() else split_rank(arg)  # a directory named 'x#2' is one
    d = Path(path)
    if not d.is_dir():
        raise InputError(
            f"run directory '{d}' does not exist; give a run directory, a plan JSON file or a "
            f'flag string such as "--tp 8 --pp 4"'
        )
    missing = [f for f in ("top.json", "search.json") if not (d / f).exists()]  # a special file: the reader says
    if missing:
        raise InputError(
            f"'{d}' is not an autopar run directory: {', '.join(missing)} missing; rerun "
            f"`autopar search ... --run-dir {d}`"
        )
    top, search = D.read_json(d / "top.json"), D.read_json(d / "search.json")
    entries = top.get("top") or []
    r = 1 if rank is None else rank
    if not entries:
        raise InputError(f"run '{d}' has no plan that fits, so there is no winner to compare")
    if not 1 <= r <= len(entries):
        raise InputError(
            f"run '{d}' has {len(entries)} ranked plans in top.json; '#{r}' is out of range "
            f"(use {d}#1 .. {d}#{len(entries)})"
        )
    try:
        plan = ParallelPlan.from_dict(entries[r - 1]["plan"])
    except (KeyError, TypeError) as e:
        raise InputError(f"'{d / 'top.json'}' entry #{r} has no usable plan ({e}); rerun `autopar search`") from None
    return CompareItem(source=f"{d}#{r}", plan=plan, question=question_from_search(search, f"'{d / 'search.json'}'"))


def file_names_its_question(arg: str) -> bool:
    """Whether a plan file says its model (so it can stand without --model, and lend its question
    to flag-string layouts)."""
    data = D.read_json(Path(arg))
    return "model" in data or "question" in data


def item_from_file(arg: str, shared: Question | None) -> CompareItem:
    """A JSON file holding a `plan` mapping, and optionally `model` (preset name or model dict),
    `num_gpus`, `gpu`, `seq_len` (the shared question fills in what is absent)."""
    path = Path(arg)
    data = D.read_json(path)
    if not isinstance(data.get("plan"), dict):
        raise InputError(
            f"'{path}': no 'plan' object; a plan file is JSON with a 'plan' mapping (a trial file, "
            f"or `autopar estimate --json` output)"
        )
    try:
        plan = ParallelPlan.from_dict(data["plan"])
    except TypeError as e:
        raise InputError(f"'{path}': the plan is malformed ({e})") from None
    if "question" in data:  # a search.json-shaped file
        return CompareItem(source=str(path), plan=plan, question=question_from_search(data, f"'{path}'"))
    if shared is None and data.get("model") is None:  # null: not said (the schema allows it)
        raise InputError(f"'{path}' does not say which model it is for; give --model and --gpus")
    from dataclasses import replace

    from autopar.spec.presets import model_from_dict, resolve_model
    from autopar.spec.resolve import resolve_cluster

    q = replace(shared) if shared is not None else None
    model = data.get("model")
    if isinstance(model, str):
        model = resolve_model(model)
    elif isinstance(model, dict):
        m = dict(model)
        model = model_from_dict(m.pop("name", "model"), m)
    if q is None:
        assert model is not None  # without a shared question the file names its model (above)
        gpus = data.get("num_gpus") or plan.num_gpus
        q = Question(
            model=model,
            cluster=resolve_cluster(data.get("gpu") or "h100-sxm"),
            num_gpus=int(gpus),
            seq_len=int(data.get("seq_len") or model.seq_len),
        )
    else:
        if model is not None:
            q.model = model
        if data.get("gpu") is not None and data["gpu"] != q.cluster.gpu.key:
            q.cluster = resolve_cluster(data["gpu"], q.cluster.gpus_per_node)
        if data.get("num_gpus") is not None:
            q.num_gpus = int(data["num_gpus"])
        if data.get("seq_len"):
            q.seq_len = int(data["seq_len"])
    return CompareItem(source=str(path), plan=plan, question=q)


def check_same_question(items: list[CompareItem], reference: tuple[str, Question] | None = None) -> None:
    """All layouts must be of one model on one cluster (GPU count and sequence length included);
    `reference`: (name, question) they must also match, e.g. the command's --model/--gpus options."""
    named = ([reference] if reference else []) + [
        (f"layout #{i} '{it.source}'", it.question) for i, it in enumerate(items, start=1)
    ]
    first_name, a = named[0]
    for name, b in named[1:]:
        if b.key() != a.key():
            what = (
                "models"
                if a.key()[0] != b.key()[0]
                else "clusters"
                if a.key()[1] != b.key()[1]
                else "GPU counts"
                if a.num_gpus != b.num_gpus
                else "sequence lengths"
            )
            raise InputError(
                f"compare needs one model and cluster, but the {what} differ ({first_name}: "
                f"{a.describe()}; {name}: {b.describe()}); compare layouts of one question (for "
                f"several GPU counts or GPUs, run a what-if: autopar search --gpus 128,256)"
            )


def compare(items: list[CompareItem], reference: tuple[str, Question] | None = None) -> Comparison:
    """Estimate every layout and align them. Raises InputError for fewer than two layouts, for
    layouts of different questions, and for invalid plans (they have no meaningful estimate)."""
    if len(items) < 2:
        raise InputError(
            f"compare needs two or more layouts, got {len(items)}; e.g. autopar compare --model 70b "
            f'--gpus 256 "--tp 8 --pp 4" "--tp 4 --pp 8"'
        )
    check_same_question(items, reference)
    ests = []
    for i, it in enumerate(items, start=1):
        q = it.question
        e = estimate(
            it.plan, q.model, q.cluster, num_gpus=q.num_gpus, seq_len=q.seq_len, routing_imbalance=q.routing_imbalance
        )
        if not e.valid:
            raise InputError(f"layout #{i} ({it.source}) is invalid: {'; '.join(e.reasons)}")
        ests.append(e)
        it.label = f"#{i} {it.plan.describe()}"
    cmp = Comparison(items=items, estimates=ests)
    cmp.table = C.compare_table(cmp.labels, cmp.estimate_dicts())
    return cmp
