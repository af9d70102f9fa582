"""`autopar export`: launch configs for real trainers, from a search result by rank or from plan flags."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.export.registry import EXPORTERS


def _help() -> str:
    import autopar.export  # noqa: F401  (registers the exporters)

    lines = [
        "Write ready-to-run launch configs for a plan: rank N of an `autopar search` run directory "
        "(--run DIR --rank N), or a plan given with the same flags as `autopar estimate`. With --run, "
        "plan flags change the ranked plan (e.g. --pp-schedule 1f1b) and autopar re-estimates it.",
        "Every file carries a header: model, cluster, predicted memory, step time, MFU and the command "
        "that produced it. A plan a trainer cannot run is refused with the reason (exit 2); with "
        "--to all, refused formats are skipped with the reason and the rest are written.",
        "\b\nFormats (--to):",
    ]
    for name, e in EXPORTERS.items():
        lines.append(f"\b\n  {name}: {e.title}\n    {e.example}")
    lines.append("\b\nExample, end to end:\n"
                 "  autopar search --model 70b --gpus 256 --run-dir runs/70b\n"
                 "  autopar export --run runs/70b --rank 1 --to megatron --pp-schedule 1f1b --out launch/\n"
                 "  (Megatron-Core has no zero-bubble schedule: the ranked plan is re-estimated with 1F1B)\n"
                 "  cd launch/megatron && sbatch launch_slurm.sbatch")
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


@app.command(help=_help(), no_args_is_help=True)
def export(
    ctx: typer.Context,
    to: Annotated[str, typer.Option("--to", help="Format(s): a name below, a comma list, or all.")],
    run: Annotated[Optional[Path], typer.Option("--run", help="An `autopar search` run directory (top.json, "
                                                "search.json).")] = None,
    rank: Annotated[int, typer.Option("--rank", help="With --run: which ranked plan (1 = fastest).")] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output directory; each format goes to "
                                                "OUT/<format>/ (default: RUN/export-rank<N>, or ./autopar-export).")] = None,
    trainer: Annotated[str, typer.Option("--trainer", help="What --to torchrun / slurm launch: megatron, torchtitan, "
                                         "deepspeed, nemo or bridge.")] = "megatron",
    torchtitan_version: Annotated[str, typer.Option("--torchtitan-version", help="torchtitan release: 0.3 and later "
                                                    "get a Python config, 0.2.2 and earlier a TOML file.")] = "0.3",
    torchtitan_base: Annotated[Optional[str], typer.Option("--torchtitan-base", help="torchtitan base config for "
                                                           "models without a preset: module:function (>= 0.3) or "
                                                           "name:flavor (<= 0.2.2).")] = None,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="NeMo 2 recipe module / Megatron-Bridge recipe "
                                                  "function (default: the model preset's).")] = None,
    partition: Annotated[Optional[str], typer.Option("--partition", help="SLURM partition.")] = None,
    account: Annotated[Optional[str], typer.Option("--account", help="SLURM account.")] = None,
    time_limit: Annotated[Optional[str], typer.Option("--time", help="SLURM time limit, e.g. 04:00:00.")] = None,
    job_name: Annotated[str, typer.Option("--job-name", help="SLURM job name.")] = "autopar",
    container_image: Annotated[Optional[str], typer.Option("--container-image", help="SLURM (pyxis) container "
                                                           "image.")] = None,
    master_port: Annotated[int, typer.Option("--master-port", help="Rendezvous port.")] = 29500,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Without --run: preset, HF config.json or "
                                                 "model file.")] = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", "-g", help="Without --run: number of GPUs.")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="Without --run: GPU preset (default h100-sxm).")] = None,
    gpus_per_node: o.GpusPerNode = None, cluster: o.ClusterFile = None,
    seq_len: o.SeqLen = None,
    tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel size.")] = None,
    pp: Annotated[Optional[int], typer.Option("--pp", help="Pipeline-parallel size.")] = None,
    vpp: Annotated[Optional[int], typer.Option("--vpp", help="Virtual pipeline stages per pp rank.")] = None,
    cp: Annotated[Optional[int], typer.Option("--cp", help="Context-parallel size.")] = None,
    dp: o.Dp = None,
    ep: Annotated[Optional[int], typer.Option("--ep", help="Expert-parallel size.")] = None,
    etp: o.Etp = None,
    zero: Annotated[Optional[int], typer.Option("--zero", help="ZeRO stage 0-3.")] = None,
    sp: o.Sp = None,
    mbs: Annotated[Optional[int], typer.Option("--mbs", help="Micro-batch size.")] = None,
    gbs: o.Gbs = None,
    pp_schedule: o.PpSchedule = None,
    recompute: Annotated[Optional[str], typer.Option("--recompute", help="none | selective | full.")] = None,
    recompute_layers: o.RecomputeLayers = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="bf16 | fp8 | fp32.")] = None,
    grads: Annotated[Optional[str], typer.Option("--grads", help="Main-gradient dtype: fp32 | bf16.")] = None,
    pp_layout: o.PpLayout = None, pp_first: o.PpFirst = None, pp_last: o.PpLast = None,
    pp_embedding_as_layer: o.EmbeddingAsLayer = False, pp_loss_as_layer: o.LossAsLayer = False,
    tp_comm_overlap: Annotated[Optional[bool], typer.Option("--tp-comm-overlap/--no-tp-comm-overlap",
                                                            help="Overlap TP communication with GEMMs.")] = None,
) -> None:
    from autopar.errors import InputError
    from autopar.export import ExportOptions, ExportRefused, SlurmOptions, get_exporter

    plan_args = dict(tp=tp, pp=pp, vpp=vpp, cp=cp, dp=dp, ep=ep, etp=etp, zero=zero, sp=sp, mbs=mbs, gbs=gbs,
                     pp_schedule=pp_schedule, recompute=recompute, recompute_layers=recompute_layers, dtype=dtype,
                     grads=grads, pp_layout=pp_layout, pp_first=pp_first, pp_last=pp_last,
                     embedding_as_layer=pp_embedding_as_layer, loss_as_layer=pp_loss_as_layer,
                     tp_comm_overlap=tp_comm_overlap)
    formats = _formats(to)
    if run is not None:
        fixed = [f for f, v in (("--model", model), ("--gpus", gpus), ("--gpu", gpu), ("--gpus-per-node", gpus_per_node),
                                ("--cluster", cluster), ("--seq-len", seq_len)) if v is not None]
        if fixed:
            raise InputError(f"{', '.join(fixed)} come from the run directory; drop them (or drop --run)")
        spec, clus, s, plan, source = _from_run(run, rank, plan_args)
        default_out = run / f"export-rank{rank}"
    else:
        if model is None or gpus is None:
            raise InputError("give --run DIR --rank N, or a plan with --model and --gpus (and the plan flags of "
                             "`autopar estimate`)")
        spec, clus, s, plan = _from_flags(model, gpus, gpu, gpus_per_node, cluster, seq_len, plan_args)
        source = None
        default_out = Path("autopar-export")
    if rank != 1 and run is None:
        raise InputError("--rank needs --run")
    options = ExportOptions(seq_len=s, command=shlex.join(_given(ctx)), source=source,
                            torchtitan_version=torchtitan_version, torchtitan_base=torchtitan_base, recipe=recipe,
                            trainer=trainer, master_port=master_port,
                            slurm=SlurmOptions(job_name=job_name, partition=partition, account=account,
                                               time=time_limit, container_image=container_image))
    bundles, refused = [], []
    for name in formats:
        try:
            bundles.append(get_exporter(name).render(plan, spec, clus, options))
        except ExportRefused as e:
            if to.strip() != "all":
                raise
            refused.append((name, e))
    if not bundles:
        raise InputError("no format can run this plan: " + " | ".join(str(e) for _, e in refused))
    base = out or default_out
    for b in bundles:
        d = base / b.format
        paths = b.write(d)
        print(f"{b.format}: wrote {', '.join(str(p) for p in paths)}")
        print(f"  run: cd {shlex.quote(str(d))} && {b.run}")
        for n in b.notes:
            print(f"  note: {n}")
    for name, e in refused:
        print(f"{name}: skipped, {e}", file=sys.stderr)
    from autopar.cost.estimate import estimate as run_estimate

    est = run_estimate(plan, spec, clus, num_gpus=plan.num_gpus, seq_len=s)
    if not est.fits:
        print(f"autopar: warning: this plan is predicted not to fit ({est.peak_memory_bytes / 2**30:.1f} GiB of "
              f"{est.memory_capacity_bytes / 2**30:.1f} GiB per GPU)", file=sys.stderr)


def _formats(to: str) -> list[str]:
    import autopar.export  # noqa: F401
    from autopar.errors import InputError
    from autopar.export import get_exporter

    names = [x.strip() for x in to.split(",") if x.strip()]
    if not names:
        raise InputError("--to needs a format name, a comma list, or all")
    if names == ["all"]:
        return list(EXPORTERS)
    for n in names:
        get_exporter(n)  # unknown names: one line with the choices
    return names


def _from_flags(model, gpus, gpu, gpus_per_node, cluster, seq_len, a: dict):
    from autopar.spec.presets import resolve_model
    from autopar.spec.resolve import resolve_cluster, resolve_plan

    spec = resolve_model(model)
    clus = resolve_cluster(gpu or "h100-sxm", gpus_per_node, cluster)
    s = spec.seq_len if seq_len is None else seq_len
    plan = resolve_plan(spec, gpus, s, tp=a["tp"] or 1, pp=a["pp"] or 1, cp=a["cp"] or 1, dp=a["dp"], ep=a["ep"] or 1,
                        etp=a["etp"], vpp=a["vpp"] or 1, zero=1 if a["zero"] is None else a["zero"], sp=a["sp"],
                        mbs=a["mbs"] or 1, gbs=a["gbs"], pp_schedule=a["pp_schedule"],
                        recompute=a["recompute"] or "none", recompute_layers=a["recompute_layers"],
                        dtype=a["dtype"] or "bf16", grads=a["grads"] or "fp32", pp_layout=a["pp_layout"],
                        pp_first=a["pp_first"], pp_last=a["pp_last"], embedding_as_layer=a["embedding_as_layer"],
                        loss_as_layer=a["loss_as_layer"], tp_comm_overlap=bool(a["tp_comm_overlap"]))
    return spec, clus, s, plan


def _from_run(run: Path, rank: int, a: dict):
    """Rank N of a run directory, with any plan flags applied on top (dp, the schedule, sequence
    parallelism and the layout follow changed degrees unless given)."""
    from autopar.export.source import load_run_plan
    from autopar.spec.resolve import resolve_plan

    e = load_run_plan(run, rank)
    b = e.plan
    changed = sorted(k for k, v in a.items() if v not in (None, False))
    if not changed:
        return e.model, e.cluster, e.seq_len, b, f"rank {rank} of {e.of} in {run}/top.json ({e.entry.get('plan_name')})"

    def pick(k, default):
        return default if a[k] is None else a[k]

    tp, pp, cp, vpp = pick("tp", b.tp), pick("pp", b.pp), pick("cp", b.cp), pick("vpp", b.vpp)
    same_model_split = (tp, pp, cp) == (b.tp, b.pp, b.cp)
    dp = a["dp"] if a["dp"] is not None else (b.dp if same_model_split else None)
    etp = a["etp"] if a["etp"] is not None else (None if b.etp == b.tp else b.etp)
    sp = a["sp"] if a["sp"] is not None else (b.sequence_parallel if tp == b.tp else None)
    sched = a["pp_schedule"] if a["pp_schedule"] is not None else (b.pp_schedule if vpp == b.vpp else None)
    recompute = pick("recompute", b.recompute)
    rl = a["recompute_layers"] if a["recompute_layers"] is not None else (
        b.recompute_layers if recompute == b.recompute else None)
    layout_given = any(a[k] not in (None, False) for k in ("pp_layout", "pp_first", "pp_last", "embedding_as_layer",
                                                           "loss_as_layer"))
    pp_layout = a["pp_layout"]
    if not layout_given and b.layout is not None and (pp, vpp) == (b.pp, b.vpp):
        pp_layout = ",".join(str(x) for x in b.layout.stages)
    plan = resolve_plan(e.model, e.num_gpus, e.seq_len, tp=tp, pp=pp, cp=cp, dp=dp, ep=pick("ep", b.ep), etp=etp,
                        vpp=vpp, zero=pick("zero", b.zero_stage), sp=sp, mbs=pick("mbs", b.micro_batch_size),
                        gbs=pick("gbs", b.global_batch_size), pp_schedule=sched, recompute=recompute,
                        recompute_layers=rl, dtype=pick("dtype", b.dtype),
                        grads=a["grads"] or ("fp32" if b.main_grads_fp32 else "bf16"), pp_layout=pp_layout,
                        pp_first=a["pp_first"], pp_last=a["pp_last"], embedding_as_layer=a["embedding_as_layer"],
                        loss_as_layer=a["loss_as_layer"],
                        tp_comm_overlap=b.tp_comm_overlap if a["tp_comm_overlap"] is None else a["tp_comm_overlap"])
    flags = ", ".join("--" + k.replace("_", "-") for k in changed)
    return (e.model, e.cluster, e.seq_len, plan,
            f"rank {rank} of {e.of} in {run}/top.json ({e.entry.get('plan_name')}), changed by {flags} and re-estimated")
