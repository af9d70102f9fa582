"""`autopar compare`: two or more layouts of one model and cluster, side by side."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.cli.plan_flags import with_plan_flags
from autopar.json_out import dumps
from autopar.spec.resolve import PlanRequest

OptModel = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="Model of the flag-string layouts (preset, config.json or model file); default: the run directory's.",
    ),
]
OptGpus = Annotated[Optional[int], typer.Option("--gpus", "-g", help="Number of GPUs; default: the run directory's.")]
OptGpu = Annotated[
    Optional[str], typer.Option("--gpu", help="GPU preset (default: the run directory's, else h100-sxm).")
]

# ---- flag strings: the plan flags of `autopar estimate`, parsed by a private one-command app ------

_flags = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


@_flags.command()
@with_plan_flags
def _layout(
    model: OptModel = None,
    gpus: OptGpus = None,
    gpu: OptGpu = None,
    gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None,
    seq_len: o.SeqLen = None,
    plan: PlanRequest = PlanRequest(),
) -> tuple[dict, PlanRequest]:
    return dict(model=model, gpus=gpus, gpu=gpu, gpus_per_node=gpus_per_node, cluster=cluster, seq_len=seq_len), plan


def parse_flags(text: str, where: str) -> tuple[dict, PlanRequest]:
    """A flag string ("--tp 8 --pp 4 --recompute full") -> (its question flags, its plan flags)."""
    import typer

    from autopar.errors import InputError

    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise InputError(f"{where}: {e}") from None
    if any(t in ("--help", "-h") for t in tokens):
        raise InputError(
            f"{where}: a layout takes the plan flags of `autopar estimate` (see `autopar estimate --help`)"
        )
    try:
        return _flags(args=tokens, prog_name="layout", standalone_mode=False)
    except typer.TyperException as e:  # click's usage errors, as typer raises them
        msg = (e.format_message() if hasattr(e, "format_message") else str(e)).strip().rstrip(".").replace("\n", " ")
        raise InputError(f"{where}: {msg}; a layout takes the plan flags of `autopar estimate`") from None


def _question(
    base, *, model=None, gpus=None, gpu=None, gpus_per_node=None, cluster=None, seq_len=None, gbs=None, where: str = ""
):
    """The question from a base (a run's, or None) and flag values overriding it."""
    from dataclasses import replace

    from autopar.errors import InputError
    from autopar.spec.presets import resolve_model
    from autopar.spec.question import Question
    from autopar.spec.resolve import resolve_cluster
    from autopar.spec.schema import check_flags

    try:
        check_flags({"--gpus": gpus, "--seq-len": seq_len})
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    if base is None and (model is None or gpus is None):
        raise InputError(
            f"{where}: give --model and --gpus (or a run directory) so the layouts have a model and "
            f'cluster, e.g. autopar compare --model 70b --gpus 256 "--tp 8 --pp 4" "--tp 4 --pp 8"'
        )
    if base is None:
        q = Question(
            model=resolve_model(model),
            cluster=resolve_cluster(gpu or "h100-sxm", gpus_per_node, cluster),
            num_gpus=gpus,
            seq_len=0,
        )
    else:
        q = replace(base)
    if base is not None:
        if model is not None:
            q.model = resolve_model(model)
            q.seq_len = 0
        if gpu is not None or gpus_per_node is not None or cluster is not None:
            q.cluster = resolve_cluster(gpu or q.cluster.gpu.key, gpus_per_node or q.cluster.gpus_per_node, cluster)
        if gpus is not None:
            q.num_gpus = gpus
    if seq_len is not None:
        q.seq_len = seq_len
    if not q.seq_len:
        q.seq_len = q.model.seq_len
    if gbs is not None:
        q.global_batch_size = gbs
    return q


def item_from_flags(text: str, index: int, shared, trainer: str | None = None):
    """A flag-string layout; `trainer` (the command's --trainer) applies when the string names none."""
    from autopar.errors import InputError
    from autopar.report.compare import CompareItem
    from autopar.spec.resolve import default_dtype, resolve_plan
    from autopar.spec.trainers import default_trainer

    where = f'layout #{index} "{text}"'
    question, request = parse_flags(text, where)
    q = _question(shared, **question, where=where)
    try:
        plan = resolve_plan(
            q.model,
            q.num_gpus,
            q.seq_len,
            request.with_defaults(
                gbs=q.global_batch_size,
                dtype=default_dtype(q.cluster),
                trainer=trainer or default_trainer(q.cluster.gpu.key),
            ),
        )
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return CompareItem(source=text, plan=plan, question=q)


# ---- the command ---------------------------------------------------------------------------------


Layouts = Annotated[
    list[str],
    typer.Argument(
        help='Two or more layouts: quoted plan flags ("--tp 8 --pp 4", the flags of `autopar estimate`), a run '
        "directory (its winner) or DIR#RANK, or a plan JSON file (a trial file, `autopar estimate --json`).",
        show_default=False,
        metavar="PLAN_OR_RUN",
    ),
]
Gbs = Annotated[
    Optional[int],
    typer.Option(
        "--gbs", help="Global batch of the flag-string layouts (default: the run directory's, else ~4M tokens)."
    ),
]
Trainer = Annotated[
    Optional[str],
    typer.Option(
        "--trainer",
        help="Trainer of the flag-string layouts that name "
        "none (default megatron); run directories and plan files keep "
        "their own.",
    ),
]
Out = Annotated[
    Optional[Path], typer.Option("--out", "-o", help="Also write the comparison as a self-contained HTML page here.")
]


@app.command(context_settings={"ignore_unknown_options": True})
def compare(
    layouts: Layouts,
    model: OptModel = None,
    gpus: OptGpus = None,
    gpu: OptGpu = None,
    gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None,
    seq_len: o.SeqLen = None,
    gbs: Gbs = None,
    trainer: Trainer = None,
    out: Out = None,
    as_json: o.Json = False,
) -> None:
    """Compare two or more layouts of one model on one cluster: every breakdown aligned, differences
    highlighted; a terminal table, and an HTML page with --out.

    Example: autopar compare --model 70b --gpus 256 "--tp 8 --pp 4" "--tp 4 --pp 8 --recompute full" reports/run#2
    """
    from autopar.cli.checks import output_file
    from autopar.errors import InputError
    from autopar.report.compare import compare as run_compare

    PlanRequest(trainer=trainer).check()  # an unknown --trainer: one line with "did you mean"
    if out is not None and out.is_dir():
        raise InputError(f"--out '{out}' is a directory; give a file name such as {out / 'compare.html'}")
    output_file(out, "--out")
    flags = dict(model=model, gpus=gpus, gpu=gpu, gpus_per_node=gpus_per_node, cluster=cluster, seq_len=seq_len)
    cmp = run_compare(*_items(layouts, flags, gbs, trainer))
    if out is not None:
        from autopar.report.html import write_compare

        write_compare(cmp, out)
    if as_json:
        print(dumps(compare_json(cmp, out), indent=2))
        return
    from autopar.cli.render import console

    c = console()
    for table in compare_tables(cmp, c.width):
        c.print(table)
    if out is not None:
        c.print(f"Comparison: {out}")


def _kinds(layouts: list[str]) -> list[str]:
    """Each layout's kind: "flags" (a quoted flag string), "run" (a run directory, or DIR#RANK) or "file"
    (a plan JSON file); anything else is refused."""
    from autopar.errors import InputError
    from autopar.report.compare import split_rank

    kinds = []
    for i, arg in enumerate(layouts, start=1):
        path, _ = split_rank(arg)
        if arg.lstrip().startswith("-"):
            kinds.append("flags")
        elif Path(arg).is_dir() or Path(path).is_dir():
            kinds.append("run")
        elif Path(arg).is_file():
            kinds.append("file")
        else:
            raise InputError(
                f"layout #{i} '{arg}' is not a run directory, a plan JSON file or a quoted flag string "
                f'such as "--tp 8 --pp 4"'
            )
    return kinds


def _items(layouts: list[str], flags: dict, gbs: int | None, trainer: str | None) -> tuple[list, tuple | None]:
    """(the CompareItem of each layout, the reference question). Run directories and plan files that name
    their question are read first; the first of their questions, overridden by the command's options
    (`flags`: model, gpus, gpu, gpus_per_node, cluster, seq_len; and `gbs`), is the question of the flag
    strings and of the plan files that name none. The reference is the command's options when they
    override a layout's question, else None."""
    from autopar.report.compare import file_names_its_question, item_from_file, item_from_run

    kinds = _kinds(layouts)
    items: list = [None] * len(layouts)
    for i, (arg, kind) in enumerate(zip(layouts, kinds)):  # layouts that know their question first
        if kind == "run":
            items[i] = item_from_run(arg)
        elif kind == "file" and file_names_its_question(arg):
            items[i] = item_from_file(arg, None)
    base = next((it.question for it in items if it is not None), None)
    options_given = any(v is not None for v in flags.values())
    shared = None
    if options_given or base is not None:
        shared = _question(base, **flags, gbs=gbs, where="compare")
    for i, (arg, kind) in enumerate(zip(layouts, kinds)):
        if kind == "file" and items[i] is None:
            items[i] = item_from_file(arg, shared)
        elif kind == "flags":
            items[i] = item_from_flags(arg, i + 1, shared, trainer)
    reference = ("the command's --model/--gpus/... options", shared) if options_given and base is not None else None
    return items, reference


def compare_json(cmp, out: Path | None) -> dict:
    """The comparison as `autopar compare --json` prints it: the question, the HTML page (or None) and
    each layout's label, source and estimate."""
    q = cmp.question
    return {
        "model": q.model.name,
        "gpu": q.cluster.gpu.key,
        "num_gpus": q.num_gpus,
        "seq_len": q.seq_len,
        "html": str(out) if out else None,
        "layouts": [{"label": it.label, "source": it.source} | e for it, e in zip(cmp.items, cmp.estimate_dicts())],
    }


def compare_tables(cmp, width: int) -> list:
    """The aligned comparison, one row per metric and one column per layout, as tables that fit
    `width` columns: as many layouts side by side as fit, the metric column repeated in each; rows
    that differ in bold yellow, the best value of a ranked row in green."""
    from rich.text import Text

    from autopar.cli.render import compact_table
    from autopar.report.format import compare_kind, fmt

    q = cmp.question
    metric: list = []
    cells: dict[str, list] = {lab: [] for lab in cmp.labels}
    section = None
    for _, r in cmp.table.iterrows():
        if r["section"] != section:
            section = r["section"]
            metric.append(Text(section, style="bold underline"))
            for lab in cmp.labels:
                cells[lab].append(Text(""))
        kind = compare_kind(r["section"], r["key"])
        best = set(str(r["best"]).split(", ")) if r["best"] else set()
        metric.append(Text("  " + r["metric"], style="bold yellow" if r["differs"] else ""))
        for lab in cmp.labels:
            cells[lab].append(Text(fmt(r[lab], kind), style="bold green" if lab in best else ""))
    need = {lab: max([len(lab)] + [len(c) for c in cells[lab]]) for lab in cmp.labels}
    room = width - max(len(m) for m in metric) - 2  # compact_table: an edge either side
    groups: list[list[str]] = [[]]
    for lab in cmp.labels:  # and two spaces between columns
        if groups[-1] and sum(need[x] + 2 for x in groups[-1]) + need[lab] + 2 > room:
            groups.append([])
        groups[-1].append(lab)
    title = (
        f"{len(cmp.items)} layouts of {q.model.name} on {q.num_gpus} x {q.cluster.gpu.key}, seq {q.seq_len} "
        f"(differences in yellow, best in green)"
    )
    tables = []
    for n, group in enumerate(groups, start=1):
        part = f", part {n} of {len(groups)}" if len(groups) > 1 else ""
        t = compact_table(title + part)
        t.add_column("metric", no_wrap=True)
        for lab in group:
            t.add_column(lab, justify="right", no_wrap=True)
        for i, m in enumerate(metric):
            t.add_row(m, *[cells[lab][i] for lab in group])
        tables.append(t)
    return tables
