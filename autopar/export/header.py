"""The header every export carries: model, cluster, trainer, the plan, the predicted memory, step
time and MFU, and the command that produced it (text files as comments, JSON under "_autopar")."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from autopar.figures import FITS
from autopar.quoting import comment_text
from autopar.spec.hardware import GIB
from autopar.spec.plan import ParallelPlan

if TYPE_CHECKING:
    from autopar.export.base import Context


def tp_overlap(plan: ParallelPlan) -> bool:
    """TP communication overlap as a run has it: only with TP (at tp = 1 there is nothing to overlap)."""
    return bool(plan.tp_comm_overlap) and plan.tp > 1


def ep_overlap(plan: ParallelPlan) -> bool:
    """EP all-to-all overlap as a run has it: only with EP (at ep = 1 there is no all-to-all)."""
    return bool(plan.ep_comm_overlap) and plan.ep > 1


def plan_flags(ctx: Context) -> str:
    """The `autopar estimate` command that reproduces the plan (same flags as `autopar export`)."""
    p, m = ctx.plan, ctx.model
    args = [
        "--model",
        m.name,
        "--gpus",
        str(ctx.num_gpus),
        "--gpu",
        ctx.cluster.gpu.key,
        "--gpus-per-node",
        str(ctx.cluster.gpus_per_node),
        "--seq-len",
        str(ctx.seq_len),
        "--tp",
        str(p.tp),
        "--pp",
        str(p.pp),
    ]
    if p.vpp > 1:
        args += ["--vpp", str(p.vpp)]
    args += ["--cp", str(p.cp), "--dp", str(p.dp)]
    if m.moe is not None:
        args += ["--ep", str(p.ep), "--etp", str(p.etp)]
    args += [
        "--zero",
        str(p.zero_stage),
        "--sp" if p.sequence_parallel else "--no-sp",
        "--mbs",
        str(p.micro_batch_size),
        "--gbs",
        str(p.global_batch_size),
        "--pp-schedule",
        str(p.pp_schedule),
        "--recompute",
        p.recompute,
    ]
    if p.recompute_layers is not None:
        args += ["--recompute-layers", str(p.recompute_layers)]
    if p.recompute_modules is not None:
        args += ["--recompute-modules", ",".join(p.recompute_modules)]
    args += ["--dtype", p.dtype]
    if not p.main_grads_fp32:
        args += ["--grads", "bf16"]
    if p.layout is not None:
        args += ["--pp-layout", ",".join(str(x) for x in p.layout.stages)]
    if tp_overlap(p):
        args += ["--tp-comm-overlap"]
    if m.moe is not None and p.moe_dispatch == "capacity":
        args += ["--moe-dispatch", "capacity", "--capacity-factor", f"{p.capacity_factor:g}"]
    if m.moe is not None and p.moe_dispatcher != "alltoall":
        args += ["--moe-dispatcher", p.moe_dispatcher]
    if m.moe is not None and ep_overlap(p):
        args += ["--ep-comm-overlap"]
    args += ["--trainer", p.trainer]
    return shlex.join(["autopar", "estimate", *args])


def header_lines(ctx: Context) -> list[str]:
    """The header every export carries (without comment markers)."""
    p, m, c, e = ctx.plan, ctx.model, ctx.cluster, ctx.estimate
    fit = "fits" if e.fits else "DOES NOT FIT (predicted out of memory)"
    sched = p.pp_schedule if p.pp > 1 else "no pipeline"
    lines = [
        f"autopar export: {ctx.trainer}",
        f"model:      {m.name} ({m.num_layers} layers, hidden {m.hidden_size}, {m.params_total / 1e9:.1f}B params"
        + (f", {m.params_active / 1e9:.1f}B active" if m.moe else "")
        + f"), sequence {ctx.seq_len}",
        f"cluster:    {ctx.num_gpus} x {c.gpu.key} = {ctx.nodes} node(s) x {ctx.gpus_per_node} GPUs "
        f"({c.gpu.hbm_gib:g} GiB HBM each)",
        f"plan:       {p.describe()} | {sched} | recompute {p.recompute}"
        + (f" ({p.recompute_layers} layers/stage)" if p.recompute_layers is not None else "")
        + (f" ({','.join(p.recompute_modules)})" if p.recompute_modules is not None else "")
        + f" | ZeRO-{p.zero_stage} | mbs {p.micro_batch_size} | gbs {p.global_batch_size} "
        f"({p.num_microbatches} microbatches) | {p.dtype}"
        + (" | tp-comm-overlap" if tp_overlap(p) else "")
        + (f" | MoE capacity x{p.capacity_factor:g}" if m.moe is not None and p.moe_dispatch == "capacity" else "")
        + (f" | {p.moe_dispatcher} dispatcher" if m.moe is not None and p.moe_dispatcher != "alltoall" else "")
        + (" | ep-comm-overlap" if m.moe is not None and ep_overlap(p) else ""),
        _trainer_line(ctx),
    ]
    if ctx.options.short_run_steps is not None:
        from autopar.export.short_run import NOTE

        lines.append("run:        " + NOTE.format(steps=ctx.options.short_run_steps))
    if p.pp > 1:
        lines.append(f"layout:     {p.resolved_layout(m.num_layers).describe()} layers per virtual stage")
    lines += [
        f"predicted:  {e.peak_memory_bytes / GIB:.1f} GiB peak memory per GPU of {e.memory_capacity_bytes / GIB:.1f} "
        f"({fit}), step {e.step_time_s:.3f} s, MFU {100 * e.mfu:.1f}%, {e.tokens_per_s:,.0f} tokens/s",
        f"produced by: {ctx.options.command or plan_flags(ctx)}",
    ]
    if ctx.options.source:
        lines.append(f"source:     {ctx.options.source}")
    if ctx.options.command:
        lines.append(f"plan flags: {plan_flags(ctx)}")
    lines += [
        "rank order: tp innermost (consecutive ranks, one node), then cp, dp; pp outermost "
        "(autopar MESH_ORDER = Megatron-Core's tp-cp-ep-dp-pp)"
    ]
    return lines


def _trainer_line(ctx: Context) -> str:
    from autopar.spec.trainers import get_trainer

    t = get_trainer(ctx.plan.trainer)
    pinned = f" (the cluster pins {', '.join(sorted(ctx.cluster.pinned))})" if ctx.cluster.pinned else ""
    return f"trainer:    {t.title} ({t.key}), performance profile {t.profile}{pinned}"


def comment_header(ctx: Context, prefix: str = "#") -> str:
    """The header as comment lines; a line break in a value (a path in the command, say) is escaped,
    so no value can end its comment and start a line of code."""
    return "\n".join(f"{prefix} {comment_text(line)}" for line in header_lines(ctx)) + "\n"


def header_dict(ctx: Context) -> dict:
    e = ctx.estimate
    return {
        "header": header_lines(ctx),
        "model": ctx.model.name,
        "gpu": ctx.cluster.gpu.key,
        "num_gpus": ctx.num_gpus,
        "nodes": ctx.nodes,
        "gpus_per_node": ctx.gpus_per_node,
        "seq_len": ctx.seq_len,
        "predicted_peak_memory_gib": round(e.peak_memory_bytes / GIB, 2),
        "predicted_step_time_s": round(e.step_time_s, 4),
        "predicted_mfu": round(e.mfu, 4),
        FITS: bool(e.fits),
        "command": ctx.options.command or plan_flags(ctx),
    }
