"""`autopar compare`: two or more layouts of one model and cluster, side by side."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o

OptModel = Annotated[Optional[str], typer.Option("--model", "-m", help="Model of the flag-string layouts (preset, "
                                                 "config.json or model file); default: the run directory's.")]
OptGpus = Annotated[Optional[int], typer.Option("--gpus", "-g", help="Number of GPUs; default: the run directory's.")]
OptGpu = Annotated[Optional[str], typer.Option("--gpu", help="GPU preset (default: the run directory's, else "
                                               "h100-sxm).")]

# ---- flag strings: the plan flags of `autopar estimate`, parsed by a private one-command app ------

_flags = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


@_flags.command()
def _plan_flags(
    model: OptModel = None, gpus: OptGpus = None, gpu: OptGpu = None, gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None, seq_len: o.SeqLen = None,
    tp: o.Tp = 1, pp: o.Pp = 1, vpp: o.Vpp = 1, cp: o.Cp = 1, dp: o.Dp = None, ep: o.Ep = 1, etp: o.Etp = None,
    zero: o.Zero = 1, sp: o.Sp = None, mbs: o.Mbs = 1, gbs: o.Gbs = None, pp_schedule: o.PpSchedule = None,
    recompute: o.Recompute = "none", recompute_layers: o.RecomputeLayers = None, dtype: o.Dtype = None,
    grads: o.Grads = "fp32", pp_layout: o.PpLayout = None, pp_first: o.PpFirst = None, pp_last: o.PpLast = None,
    pp_embedding_as_layer: o.EmbeddingAsLayer = False, pp_loss_as_layer: o.LossAsLayer = False,
    tp_comm_overlap: o.TpCommOverlap = False,
) -> dict:
    return dict(locals())


QUESTION_FLAGS = ("model", "gpus", "gpu", "gpus_per_node", "cluster", "seq_len")


def parse_flags(text: str, where: str) -> dict:
    """A flag string ("--tp 8 --pp 4 --recompute full") -> its values (defaults filled in)."""
    from autopar.cli import click_exc
    from autopar.errors import InputError

    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise InputError(f"{where}: {e}") from None
    if any(t in ("--help", "-h") for t in tokens):
        raise InputError(f"{where}: a layout takes the plan flags of `autopar estimate` (see `autopar estimate --help`)")
    try:
        return _flags(args=tokens, prog_name="layout", standalone_mode=False)
    except click_exc.ClickException as e:
        msg = e.format_message().strip().rstrip(".").replace("\n", " ")
        raise InputError(f"{where}: {msg}; a layout takes the plan flags of `autopar estimate`") from None


def _question(base, *, model=None, gpus=None, gpu=None, gpus_per_node=None, cluster=None, seq_len=None, gbs=None,
              where: str = ""):
    """The question from a base (a run's, or None) and flag values overriding it."""
    from dataclasses import replace

    from autopar.errors import InputError
    from autopar.report.compare import Question
    from autopar.spec.presets import resolve_model
    from autopar.spec.resolve import resolve_cluster

    if base is None and (model is None or gpus is None):
        raise InputError(f"{where}: give --model and --gpus (or a run directory) so the layouts have a model and "
                         f"cluster, e.g. autopar compare --model 70b --gpus 256 \"--tp 8 --pp 4\" \"--tp 4 --pp 8\"")
    if base is None:
        q = Question(model=resolve_model(model), cluster=resolve_cluster(gpu or "h100-sxm", gpus_per_node, cluster),
                     num_gpus=gpus, seq_len=0)
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
    if (q.num_gpus is not None and q.num_gpus <= 0) or q.seq_len <= 0:
        raise InputError(f"{where}: --gpus and --seq-len must be positive")
    if gbs is not None:
        q.global_batch_size = gbs
    return q


def item_from_flags(text: str, index: int, shared):
    from autopar.errors import InputError
    from autopar.report.compare import CompareItem

    where = f"layout #{index} \"{text}\""
    v = parse_flags(text, where)
    q = _question(shared, **{k: v[k] for k in QUESTION_FLAGS}, where=where)
    try:
        plan = _resolve(q, v)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return CompareItem(source=text, plan=plan, question=q)


def _resolve(q, v):
    from autopar.spec.resolve import default_dtype, resolve_plan

    return resolve_plan(q.model, q.num_gpus, q.seq_len, tp=v["tp"], pp=v["pp"], cp=v["cp"], dp=v["dp"], ep=v["ep"],
                        etp=v["etp"], vpp=v["vpp"], zero=v["zero"], sp=v["sp"], mbs=v["mbs"],
                        gbs=v["gbs"] or q.global_batch_size, pp_schedule=v["pp_schedule"], recompute=v["recompute"],
                        recompute_layers=v["recompute_layers"], dtype=v["dtype"] or default_dtype(q.cluster),
                        grads=v["grads"],
                        pp_layout=v["pp_layout"], pp_first=v["pp_first"], pp_last=v["pp_last"],
                        embedding_as_layer=v["pp_embedding_as_layer"], loss_as_layer=v["pp_loss_as_layer"],
                        tp_comm_overlap=v["tp_comm_overlap"])


# ---- the command ---------------------------------------------------------------------------------

@app.command(context_settings={"ignore_unknown_options": True})
def compare(
    layouts: Annotated[list[str], typer.Argument(
        help="Two or more layouts: quoted plan flags (\"--tp 8 --pp 4\", the flags of `autopar estimate`), a run "
             "directory (its winner) or DIR#RANK, or a plan JSON file (a trial file, `autopar estimate --json`).",
        show_default=False, metavar="PLAN_OR_RUN")],
    model: OptModel = None, gpus: OptGpus = None, gpu: OptGpu = None, gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None, seq_len: o.SeqLen = None,
    gbs: Annotated[Optional[int], typer.Option("--gbs", help="Global batch of the flag-string layouts (default: "
                                               "the run directory's, else ~4M tokens).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the comparison as a "
                                                "self-contained HTML page here.")] = None,
    as_json: o.Json = False,
) -> None:
    """Compare two or more layouts of one model on one cluster: every breakdown aligned, differences
    highlighted; a terminal table, and an HTML page with --out.

    Example: autopar compare --model 70b --gpus 256 "--tp 8 --pp 4" "--tp 4 --pp 8 --recompute full" reports/run#2
    """
    from autopar.errors import InputError
    from autopar.report.compare import compare as run_compare
    from autopar.report.compare import file_names_its_question, item_from_file, item_from_run, split_rank

    if out is not None and out.is_dir():
        raise InputError(f"--out '{out}' is a directory; give a file name such as {out / 'compare.html'}")
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
            raise InputError(f"layout #{i} '{arg}' is not a run directory, a plan JSON file or a quoted flag string "
                             f"such as \"--tp 8 --pp 4\"")
    items: list = [None] * len(layouts)
    for i, (arg, kind) in enumerate(zip(layouts, kinds)):  # layouts that know their question first
        if kind == "run":
            items[i] = item_from_run(arg)
        elif kind == "file" and file_names_its_question(arg):
            items[i] = item_from_file(arg, None)
    base = next((it.question for it in items if it is not None), None)
    options_given = any(v is not None for v in (model, gpus, gpu, gpus_per_node, cluster, seq_len))
    shared = None
    if options_given or base is not None:
        shared = _question(base, model=model, gpus=gpus, gpu=gpu, gpus_per_node=gpus_per_node, cluster=cluster,
                           seq_len=seq_len, gbs=gbs, where="compare")
    for i, (arg, kind) in enumerate(zip(layouts, kinds)):
        if kind == "file" and items[i] is None:
            items[i] = item_from_file(arg, shared)
        elif kind == "flags":
            items[i] = item_from_flags(arg, i + 1, shared)
    reference = ("the command's --model/--gpus/... options", shared) if options_given and base is not None else None
    cmp = run_compare(items, reference)
    if out is not None:
        from autopar.report.html import write_compare

        write_compare(cmp, out)
    if as_json:
        q = cmp.question
        print(json.dumps({"model": q.model.name, "gpu": q.cluster.gpu.key, "num_gpus": q.num_gpus,
                          "seq_len": q.seq_len, "html": str(out) if out else None,
                          "layouts": [{"label": it.label, "source": it.source} | e
                                      for it, e in zip(cmp.items, cmp.estimate_dicts())]},
                         indent=2, default=float))
        return
    from autopar.cli.render import console

    c = console()
    c.print(compare_table(cmp))
    if out is not None:
        c.print(f"Comparison: {out}")


def compare_table(cmp):
    """The aligned rich table: one row per metric, one column per layout; rows that differ in bold
    yellow, the best value of a ranked row in green."""
    from rich.table import Table
    from rich.text import Text

    from autopar.report.format import compare_kind, fmt

    q = cmp.question
    t = Table(title=f"{len(cmp.items)} layouts of {q.model.name} on {q.num_gpus} x {q.cluster.gpu.key}, seq "
                    f"{q.seq_len} (differences in yellow, best in green)", title_justify="left")
    t.add_column("metric")
    for lab in cmp.labels:
        t.add_column(lab, justify="right")
    section = None
    for _, r in cmp.table.iterrows():
        if r["section"] != section:
            section = r["section"]
            t.add_row(Text(section, style="bold underline"), *[""] * len(cmp.labels))
        kind = compare_kind(r["section"], r["key"])
        best = set(str(r["best"]).split(", ")) if r["best"] else set()
        cells = [Text(fmt(r[lab], kind), style="bold green" if lab in best else "") for lab in cmp.labels]
        t.add_row(Text("  " + r["metric"], style="bold yellow" if r["differs"] else ""), *cells)
    return t
