"""`autopar export`: launch configs for real trainers, from a search result by rank or from plan flags."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.cli.plan_flags import with_plan_flags
from autopar.export.registry import EXPORTERS
from autopar.figures import PLAN_NAME
from autopar.spec.resolve import PlanRequest


def _help() -> str:
    import autopar.export  # noqa: F401  (registers the exporters)

    lines = [
        "Write ready-to-run launch configs for a plan: rank N of an `autopar search` run directory "
        "(--run DIR --rank N), or a plan given with the same flags as `autopar estimate`. With --run, "
        "plan flags change the ranked plan (e.g. --pp-schedule 1f1b) and autopar re-estimates it.",
        "The plan is re-targeted to each format's trainer (--to deepspeed exports it as DeepSpeed's) and "
        "re-estimated with that trainer; --to torchrun / slurm launch --trainer (default: the plan's own). "
        "A plan a trainer cannot run is refused with the line of its capability table that forbids it "
        "(exit 2), the same line the search applies; with several formats (--to all, or a comma list such "
        "as --to megatron,nemo), refused formats are skipped with the reason and the rest are written.",
        "Every file carries a header: model, cluster, trainer, predicted memory, step time, MFU and the "
        "command that produced it.",
        "\b\nFormats (--to):",
    ]
    for name, e in EXPORTERS.items():
        lines.append(f"\b\n  {name}: {e.title}\n    {e.example}")
    lines.append(
        "\b\nExample, end to end:\n"
        "  autopar search --model 70b --gpus 256 --trainer megatron --run-dir runs/70b\n"
        "  autopar export --run runs/70b --rank 1 --to megatron --out launch/\n"
        "  (without --trainer the search ranks every trainer's plans; --to T re-targets rank N to T,\n"
        "  or refuses it with T's capability line; plan flags such as --zero 1 change it first)\n"
        "  cd launch/megatron && bash submit_slurm.sh   (checks DATA_PATH, TOKENIZER, MEGATRON_LM, then sbatch)"
    )
    return "\n\n".join(lines)


def _given(ctx: typer.Context) -> list[str]:
    """The command line as given (options set on the command line only), for the headers."""
    words = ["autopar", "export"]
    for p in ctx.command.params:
        src = ctx.get_parameter_source(p.name)
        if src is None or getattr(src, "name", "") != "COMMANDLINE":
            continue
        v = ctx.params[p.name]
        if isinstance(v, bool) and (p.is_flag if hasattr(p, "is_flag") else False):
            opts = p.opts if v else (p.secondary_opts or p.opts)
            words.append(opts[0])
        else:
            words += [p.opts[0], str(v)]
    return words


To = Annotated[str, typer.Option("--to", help="Format(s): a name below, a comma list, or all.")]
Run = Annotated[
    Optional[Path], typer.Option("--run", help="An `autopar search` run directory (top.json, search.json).")
]
Rank = Annotated[int, typer.Option("--rank", help="With --run: which ranked plan (1 = fastest).")]
Out = Annotated[
    Optional[Path],
    typer.Option(
        "--out",
        "-o",
        help="Output directory; each format goes to OUT/<format>/ (default: RUN/export-rank<N>, or ./autopar-export).",
    ),
]
TorchtitanVersion = Annotated[
    str,
    typer.Option(
        "--torchtitan-version",
        help="torchtitan release: 0.3 and later get a Python config, 0.2.2 and earlier a TOML file.",
    ),
]
TorchtitanBase = Annotated[
    Optional[str],
    typer.Option(
        "--torchtitan-base",
        help="torchtitan base config for models without a preset: module:function (>= 0.3) or name:flavor (<= 0.2.2).",
    ),
]
Recipe = Annotated[
    Optional[str],
    typer.Option(
        "--recipe", help="NeMo 2 recipe module / Megatron-Bridge recipe function (default: the model preset's)."
    ),
]
Partition = Annotated[Optional[str], typer.Option("--partition", help="SLURM partition.")]
Account = Annotated[Optional[str], typer.Option("--account", help="SLURM account.")]
TimeLimit = Annotated[Optional[str], typer.Option("--time", help="SLURM time limit, e.g. 04:00:00.")]
JobName = Annotated[str, typer.Option("--job-name", help="SLURM job name.")]
ContainerImage = Annotated[Optional[str], typer.Option("--container-image", help="SLURM (pyxis) container image.")]
MasterPort = Annotated[int, typer.Option("--master-port", help="Rendezvous port.")]
ShortRun = Annotated[
    Optional[int],
    typer.Option(
        "--short-run",
        help="A smoke run instead of training: K steps on the trainer's mock data, no checkpoints, every step "
        "logged (what `search --measure-with` launches).",
    ),
]
# the question of a plan given by flags (with --run, it comes from the run directory)
Model = Annotated[
    Optional[str], typer.Option("--model", "-m", help="Without --run: preset, HF config.json or model file.")
]
Gpus = Annotated[Optional[int], typer.Option("--gpus", "-g", help="Without --run: number of GPUs.")]
Gpu = Annotated[Optional[str], typer.Option("--gpu", help="Without --run: GPU preset (default h100-sxm).")]


@app.command(help=_help(), no_args_is_help=True)
@with_plan_flags
def export(
    ctx: typer.Context,
    to: To,
    run: Run = None,
    rank: Rank = 1,
    out: Out = None,
    torchtitan_version: TorchtitanVersion = "0.3",
    torchtitan_base: TorchtitanBase = None,
    recipe: Recipe = None,
    partition: Partition = None,
    account: Account = None,
    time_limit: TimeLimit = None,
    job_name: JobName = "autopar",
    container_image: ContainerImage = None,
    master_port: MasterPort = 29500,
    short_run: ShortRun = None,
    model: Model = None,
    gpus: Gpus = None,
    gpu: Gpu = None,
    gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None,
    seq_len: o.SeqLen = None,
    plan: PlanRequest = PlanRequest(),
) -> None:
    from autopar.cli.checks import output_dir
    from autopar.errors import InputError
    from autopar.export import ExportOptions, SlurmOptions

    _check_options(master_port, time_limit, rank, short_run)
    formats = _formats(to)
    if torchtitan_base is not None:  # checked even when no torchtitan file is written
        from autopar.export.torchtitan import check_base, toml_era

        check_base(torchtitan_base, toml_era(torchtitan_version))
    if rank != 1 and run is None:
        raise InputError("--rank needs --run")
    question = {
        "--model": model,
        "--gpus": gpus,
        "--gpu": gpu,
        "--gpus-per-node": gpus_per_node,
        "--cluster": cluster,
        "--seq-len": seq_len,
    }
    spec, clus, s, the_plan, source, default_out, recipes = _the_plan(run, rank, question, plan)
    options = ExportOptions(
        seq_len=s,
        command=shlex.join(_given(ctx)),
        source=source,
        torchtitan_version=torchtitan_version,
        torchtitan_base=torchtitan_base,
        recipe=recipe,
        recipes=recipes,
        master_port=master_port,
        short_run_steps=short_run,
        slurm=SlurmOptions(
            job_name=job_name, partition=partition, account=account, time=time_limit, container_image=container_image
        ),
    )
    output_dir(out or default_out, "--out" if out is not None else "the default output folder")
    bundles, refused = _render_all(formats, the_plan, spec, clus, options)
    _write(bundles, refused, out or default_out)


def _the_plan(run: Path | None, rank: int, question: dict, request: PlanRequest):
    """(model, cluster, seq_len, plan, source, default output folder, the run's recipes): rank N of
    --run, or the plan of the flags; `question` maps --model, --gpus, --gpu, --gpus-per-node,
    --cluster, --seq-len to their values."""
    from autopar.errors import InputError

    if run is not None:
        fixed = [f for f, v in question.items() if v is not None]
        if fixed:
            raise InputError(f"{', '.join(fixed)} come from the run directory; drop them (or drop --run)")
        spec, clus, s, the_plan, source, recipes = _from_run(run, rank, request)
        return spec, clus, s, the_plan, source, run / f"export-rank{rank}", recipes
    if question["--model"] is None or question["--gpus"] is None:
        raise InputError(
            "give --run DIR --rank N, or a plan with --model and --gpus (and the plan flags of `autopar estimate`)"
        )
    q = question
    spec, clus, s, the_plan = _from_flags(
        q["--model"], q["--gpus"], q["--gpu"], q["--gpus-per-node"], q["--cluster"], q["--seq-len"], request
    )
    return spec, clus, s, the_plan, None, Path("autopar-export"), ()


#: SLURM --time forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]
_SLURM_TIME = re.compile(r"(\d{1,7}(:\d{1,2}){0,2}|\d{1,5}-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite)", re.IGNORECASE)


def _check_options(master_port: int, time_limit: str | None, rank: int, short_run: int | None = None) -> None:
    """The launch options' values: a port, a SLURM time limit, a rank, the short run's steps (one
    line naming the option)."""
    from autopar.errors import InputError, quoted
    from autopar.spec.schema import check_flags

    check_flags({"--master-port": master_port, "--rank": rank, "--short-run": short_run})
    if time_limit is not None and not _SLURM_TIME.fullmatch(time_limit):
        raise InputError(
            f"--time {quoted(time_limit)} is not a SLURM time limit; give minutes, HH:MM:SS or "
            f"D-HH:MM:SS, e.g. --time 04:00:00"
        )


def _render_all(formats: list[str], plan, spec, clus, options) -> tuple[list, list]:
    """Every format's bundle; with several formats (--to all or a comma list), the refused ones
    (format, ExportRefused) beside them; one format refused is one line (exit 2)."""
    from autopar.errors import InputError
    from autopar.export import ExportRefused, get_exporter

    bundles, refused = [], []
    for name in formats:
        try:
            bundles.append(get_exporter(name).render(plan, spec, clus, options))
        except ExportRefused as e:
            if len(formats) == 1:
                raise
            refused.append((name, e))
    if not bundles:
        raise InputError("no format can run this plan: " + " | ".join(str(e) for _, e in refused))
    return bundles, refused


def _write(bundles: list, refused: list, base: Path) -> None:
    from autopar.spec.hardware import GIB

    for b in bundles:
        d = base / b.format
        paths = b.write(d)
        print(f"{b.format}: wrote {', '.join(str(p) for p in paths)}")
        print(f"  run: cd {shlex.quote(str(d))} && {b.run}")
        for n in b.notes:
            print(f"  note: {n}")
    for name, e in refused:
        print(f"{name}: skipped, {e}", file=sys.stderr)
    for b in bundles:
        est = b.meta["estimate"]
        # memory alone: `fits` is also False for a plan whose rule an export option waived (--recipe)
        if est.peak_memory_bytes > est.memory_capacity_bytes:
            print(
                f"autopar: warning: {b.format}: this plan is predicted not to fit on {b.meta['trainer']} "
                f"({est.peak_memory_bytes / GIB:.1f} GiB of {est.memory_capacity_bytes / GIB:.1f} GiB per GPU)",
                file=sys.stderr,
            )


def _formats(to: str) -> list[str]:
    import autopar.export  # noqa: F401
    from autopar.export import get_exporter
    from autopar.spec.schema import parse_list

    names = parse_list(to, "--to", number=False, example="megatron,slurm")
    if names == ["all"]:
        return list(EXPORTERS)
    for n in names:
        get_exporter(n)  # unknown names: one line with the choices
    return names


def _from_flags(model, gpus, gpu, gpus_per_node, cluster, seq_len, request: PlanRequest):
    from autopar.spec.presets import resolve_model
    from autopar.spec.resolve import resolve_cluster, resolve_plan

    spec = resolve_model(model)
    clus = resolve_cluster(gpu or "h100-sxm", gpus_per_node, cluster)
    s = spec.seq_len if seq_len is None else seq_len
    return spec, clus, s, resolve_plan(spec, gpus, s, request)


def _from_run(run: Path, rank: int, request: PlanRequest):
    """Rank N of a run directory, with any plan flags applied on top (autopar.spec.resolve.rebase_plan)."""
    from autopar.export.source import load_run_plan
    from autopar.spec.resolve import rebase_plan

    e = load_run_plan(run, rank)
    where = f"rank {rank} of {e.of} in {run}/top.json ({e.entry.get(PLAN_NAME)}, {e.plan.trainer})"
    changed = request.flag_names()
    if not changed:
        return e.model, e.cluster, e.seq_len, e.plan, where, e.recipes
    plan = rebase_plan(e.plan, request, e.model, e.num_gpus, e.seq_len)
    changes = f"{where}, changed by {', '.join(changed)} and re-estimated"
    return e.model, e.cluster, e.seq_len, plan, changes, e.recipes
