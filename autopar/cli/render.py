"""Rich tables for the terminal (presentation only; the numbers come from the library)."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.padding import Padding
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from autopar.calibration.estimate import Estimate
from autopar.figures import (
    COST,
    ENERGY_KWH_PER_STEP,
    GOODPUT,
    HOST_MEMORY_BYTES_PER_GPU,
    HOST_MEMORY_BYTES_PER_NODE,
    INTERVAL,
    INTERVAL_LEVEL,
    MEMORY_RANK,
    MEMORY_TERMS,
    PEAK_MEMORY_BYTES,
    POWER_W_PER_GPU,
    STEP_TIME_S,
    SUPPORT,
    SUPPORT_REASON,
    TIME_LABELS,
    TIME_TERMS,
    TOKENS_PER_S_PER_GPU,
)
from autopar.report.format import human_count
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.terminal import SGR, SafeStream, printable

#: the width of piped output when COLUMNS does not say: the common wide terminal, which every table
#: is laid out for (tables wider than this drop their least important columns, `fitted_table`)
PIPED_WIDTH = 120


#: blanks at the end of a line, before the style resets a terminal line may end with
_TRAILING = re.compile(rf" +((?:{SGR.pattern})*)$", re.M)


class SafeConsole(Console):
    """A rich console that lays out only printable text (autopar.terminal.printable): every piece
    of text is cleaned before the console adds its own styles, so a name that holds an escape
    sequence prints escaped, in a table cell as anywhere else. Rich markup is off: a name holding
    "[link=URL]" or "[conceal]" would otherwise have the console itself write the hyperlink or hide
    the text on a terminal; autopar styles its own lines with Text and style= only."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("markup", False)
        super().__init__(*args, **kwargs)

    @property
    def file(self):
        """The stream beneath autopar's SafeStream (autopar.terminal): this console cleans its own
        text, and its cursor controls (a progress bar's) must reach the terminal as they are."""
        file = Console.file.fget(self)
        return file.raw if isinstance(file, SafeStream) else file

    @file.setter
    def file(self, new_file) -> None:
        Console.file.fset(self, new_file)  # type: ignore[attr-defined]

    def render_str(self, text: str, **kwargs) -> Text:
        """A string cleaned before rich reads it: rich drops some controls itself (BEL, backspace,
        carriage return: rich.control.strip_control_codes), which would show a name that holds one
        without it, a path that does not exist."""
        return super().render_str(printable(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        text = super()._render_buffer(
            segment if segment.control else Segment(printable(segment.text), segment.style) for segment in buffer
        )
        # no line padded with trailing blanks (a table's cells are padded to the console's width)
        return _TRAILING.sub(r"\1", text)


def console() -> Console:
    """The terminal's width; when piped, COLUMNS if set, else PIPED_WIDTH."""
    if sys.stdout.isatty():
        return SafeConsole()
    columns = os.environ.get("COLUMNS", "")
    return SafeConsole(width=int(columns) if columns.isdigit() and 20 <= int(columns) <= 1000 else PIPED_WIDTH)


#: schedule names as the tables print them (a 120-column terminal has no room for the long ones;
#: schedule_legend spells them out)
SCHEDULE_SHORT = {"interleaved-1f1b": "i-1f1b", "zero-bubble": "zb"}
#: trainers as the tables abbreviate them (a legend under the table spells them out)
TRAINER_LETTERS = {"megatron": "M", "nemo": "N", "bridge": "B", "torchtitan": "T", "deepspeed": "D", "autopar": "A"}


def trainer_legend(used: set[str]) -> str:
    """'runs on: M Megatron-LM, N NeMo 2, ...' for the trainers `used` (their keys)."""
    from autopar.spec.trainers import get_trainer

    return "runs on: " + legend_line(TRAINER_LETTERS, used, lambda k: get_trainer(k).title)


def schedule_legend(used: set[str] | None = None) -> str | None:
    """'schedules: i-1f1b interleaved-1f1b, zb zero-bubble' for the abbreviated schedules `used`
    (their full names; None: all), or None when none is."""
    named = [f"{short} {name}" for name, short in SCHEDULE_SHORT.items() if used is None or name in used]
    return "schedules: " + ", ".join(named) if named else None


@dataclass(frozen=True)
class Col:
    """A column of a `fitted_table`: its header, alignment and when it goes if the table is too
    wide (0: never; of the others, 1 goes first, then 2, ...)."""

    header: str
    left: bool = False
    drop: int = 0
    #: a long text column (notes, sources) wraps at word boundaries instead of setting the width
    wraps: bool = False


def fitted_table(title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> tuple[Table, list[str]]:
    """A compact table of `rows` that fits `width` columns: while it is wider, the droppable column
    with the lowest `drop` goes. Returns the table and the headers dropped (for a line that says so).
    The columns that stay are never cut: a cell is whole or, in a `wraps` column, wrapped at spaces
    (the column is never narrower than its longest word)."""

    def natural(i: int) -> int:
        return max([len(cols[i].header)] + [len(str(r[i])) for r in rows])

    def narrowest(i: int) -> int:
        if not cols[i].wraps:
            return natural(i)
        return max([len(w) for w in cols[i].header.split()] + [len(w) for r in rows for w in str(r[i]).split()])

    def constant(i: int) -> bool:
        return len(rows) > 1 and len({str(r[i]) for r in rows}) == 1

    shown = list(range(len(cols)))
    # compact_table: two spaces between columns (one of padding, the box's blank rule), one blank
    # edge on either side. A droppable column that reads the same on every row goes first (the
    # line under the table keeps its value), then by `drop`
    while sum(narrowest(i) for i in shown) + 2 * len(shown) > width and any(cols[i].drop for i in shown):
        shown.remove(min((i for i in shown if cols[i].drop), key=lambda i: (not constant(i), cols[i].drop)))
    fixed = sum(natural(i) for i in shown if not cols[i].wraps) + 2 * len(shown)
    wrapping = [i for i in shown if cols[i].wraps]
    room = max(width - fixed - sum(narrowest(i) for i in wrapping), 0)  # spread over the wrapping columns
    t = compact_table(title)
    for i in shown:
        c = cols[i]
        w = None
        if c.wraps:
            w = min(natural(i), narrowest(i) + room)
            room -= w - narrowest(i)
        t.add_column(c.header, justify="left" if c.left else "right", no_wrap=not c.wraps, width=w)
    for r in rows:
        t.add_row(*(Text(str(r[i])) for i in shown))
    return t, [
        f"{cols[i].header} ({rows[0][i]} on every row)" if constant(i) else cols[i].header
        for i in range(len(cols))
        if i not in shown
    ]


def note(text: str, style: str = "", indent: int = 2) -> Padding:
    """An indented note whose wrapped lines keep the indent (a hanging indent, so that a long note
    reads as one item under the table it belongs to)."""
    return Padding(Text(text, style=style), (0, 0, 0, indent), expand=False)


def dropped_line(dropped: list[str]) -> str | None:
    """'not shown at this width: tokens/s, 80% range (a wider terminal or --json has them)'."""
    return f"not shown at this width: {', '.join(dropped)} (a wider terminal or --json has them)" if dropped else None


def legend_line(letters: dict[str, str], used: set[str], title) -> str:
    """'M Megatron-LM, N NeMo 2, ...': the abbreviations `letters` (key -> letter) used, spelled out
    by `title(key)`, in the order of `letters`."""
    return ", ".join(f"{letter} {title(k)}" for k, letter in letters.items() if k in used)


def compact_table(title: str) -> Table:
    """A table with one space between columns and a rule under the header, so that wide listings
    fit a 120-column terminal."""
    from rich import box

    return Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", padding=(0, 1, 0, 0), pad_edge=False)


def plan_line(est: Estimate) -> str:
    p = est.plan
    parts = [
        p.describe(),
        f"zero{p.zero_stage}",
        f"sp={'on' if p.sequence_parallel else 'off'}",
        f"mbs={p.micro_batch_size}",
        f"gbs={p.global_batch_size}",
        f"m={est.num_microbatches}",
        f"schedule={p.pp_schedule}" if p.pp > 1 else "",
        f"recompute={p.recompute}"
        + (f"({p.recompute_layers} layers)" if p.recompute_layers is not None else "")
        + (f"({','.join(p.recompute_modules)})" if p.recompute_modules is not None else ""),
        f"dtype={p.dtype}" + (f"({p.fp8_recipe_used})" if p.fp8_recipe_used else ""),
        f"layout={est.layout}" if p.pp > 1 else "",
        f"moe-dispatch=capacity x{p.capacity_factor:g}" if p.moe_dispatch == "capacity" else "",
        f"moe-dispatcher={p.moe_dispatcher}" if p.moe_dispatcher != "alltoall" else "",
        "ep-comm-overlap" if p.ep_comm_overlap else "",
        f"optimizer-offload={p.optimizer_offload:g}" if p.optimizer_offload > 0 else "",
        f"offload-modules={','.join(p.offload_modules)}" if p.offload_modules else "",
    ]
    return "  ".join(x for x in parts if x)


def breakdown_table(title: str, columns: tuple[str, ...], rows: list[tuple], total: tuple) -> Table:
    """A titled table: a label column, right-aligned figures, and a bold total row."""
    t = Table(title=title, title_justify="left")
    t.add_column(columns[0])
    for c in columns[1:]:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*r)
    t.add_row(*total, style="bold")
    return t


def trainer_line(est: Estimate, cluster: ClusterSpec) -> tuple[str, str]:
    """(trainer, performance profile) of an estimate: the plan's trainer, and the profile the cost
    model priced it with (autopar.cost.profiles), naming the constants the cluster file pins."""
    from autopar.cost.profiles import profile_of

    profile = profile_of(est.plan.trainer).name
    if cluster.pinned:
        profile += f" (the cluster pins {', '.join(sorted(cluster.pinned))})"
    return est.plan.trainer, profile


def estimate_tables(
    est: Estimate, model: ModelSpec, cluster: ClusterSpec, num_gpus: int, seq_len: int, fits_with: dict | None = None
) -> list:
    from autopar.spec.trainers import get_trainer

    cap = est.memory_capacity_bytes
    trainer, profile = trainer_line(est, cluster)
    verdict = Text("FITS", style="bold green") if est.fits else Text("DOES NOT FIT", style="bold red")
    head = Text.assemble(
        (f"{model.name}", "bold"),
        f" ({human_count(est.params_total)} params) on {num_gpus} x {cluster.gpu.key} "
        f"({cluster.gpus_per_node}/node), seq {seq_len}\n",
        f"trainer {get_trainer(trainer).title} ({trainer}), performance profile {profile}\n",
        plan_line(est),
        "\n",
        verdict,
        f"  peak {est.peak_memory_bytes / GIB:.1f} / {cap / GIB:.1f} GiB on pipeline rank "
        f"{est.extra.get(MEMORY_RANK, 0)}",
    )
    out: list = [head]
    for r in est.reasons:
        out.append(note(f"- {r}", style="red"))
    if fits_with:  # the flag that fits it (autopar.cli.estimate.fit_flags)
        gib = fits_with[PEAK_MEMORY_BYTES] / GIB
        out.append(note(f"Fits with {fits_with['flags']}: peak {gib:.1f} / {cap / GIB:.1f} GiB.", style="green"))

    mem = breakdown_table(
        "Memory per GPU (most loaded rank)",
        ("term", "GiB", "% of HBM"),
        [(n, f"{est.memory_bytes[n] / GIB:.2f}", f"{100 * est.memory_bytes[n] / cap:.1f}") for n in MEMORY_TERMS],
        ("total", f"{est.peak_memory_bytes / GIB:.2f}", f"{100 * est.peak_memory_bytes / cap:.1f}"),
    )
    tim = breakdown_table(
        "Step time",
        ("term", "seconds", "%"),
        [
            (TIME_LABELS[n], f"{est.time_s[n]:.4f}", f"{100 * est.time_s[n] / est.step_time_s:.1f}")
            for n in TIME_TERMS
            if est.time_s[n] != 0 or n == "compute"  # a term the plan does not have (no CP, no offload): no row
        ],
        ("step", f"{est.step_time_s:.4f}", "100.0"),
    )

    com = Table(title="Communication per GPU per step", title_justify="left", min_width=34)
    com.add_column("axis")
    com.add_column("GB", justify="right")
    for axis, v in est.comm_bytes_per_gpu.items():
        if v:  # an axis of size 1 moves nothing: no row
            com.add_row(axis, f"{v / 1e9:.3f}")

    thr = Table(title="Throughput", title_justify="left")
    thr.add_column("metric")
    thr.add_column("value", justify="right")
    thr.add_row("tokens/s", f"{est.tokens_per_s:,.0f}")
    thr.add_row("tokens/s/GPU", f"{est.tokens_per_s_per_gpu:,.1f}")
    thr.add_row("model TFLOP/s/GPU", f"{est.model_tflops_per_gpu:.1f}")
    thr.add_row("MFU (vs BF16 dense peak)", f"{100 * est.mfu:.1f}%")
    thr.add_row("HFU (incl. recompute)", f"{100 * est.hfu:.1f}%")
    thr.add_row("bubble fraction", f"{100 * est.bubble_fraction:.1f}%")
    thr.add_row("params per GPU", human_count(est.params_per_gpu))
    if ENERGY_KWH_PER_STEP in est.extra:
        watts = est.extra[POWER_W_PER_GPU]
        thr.add_row(f"GPU energy per step (at {watts:g} W)", f"{est.extra[ENERGY_KWH_PER_STEP]:,.2f} kWh")
    out += [mem]
    if HOST_MEMORY_BYTES_PER_GPU in est.extra:
        out.append(host_memory_line(est, cluster))
    out += [tim, com, thr, sureness_table(est), sureness_line(est)]
    return out


def host_memory_line(est: Estimate, cluster: ClusterSpec) -> Text:
    """Host memory the offloaded optimizer share and activations take; no host capacity is known to check
    it against."""
    per_gpu, per_node = est.extra[HOST_MEMORY_BYTES_PER_GPU], est.extra[HOST_MEMORY_BYTES_PER_NODE]
    p = est.plan
    what = " and ".join(
        w for w, on in (("optimizer", p.optimizer_offload > 0), ("activations", p.offload_modules)) if on
    )
    return Text(
        f"Host memory for the offloaded {what}: {per_gpu / GIB:.1f} GiB per GPU, {per_node / GIB:.1f} GiB per "
        f"node of {cluster.gpus_per_node} (not checked: no host memory capacity is stated)"
    )


def sureness_table(est: Estimate) -> Table:
    """The 80 % intervals and the support of the estimate (autopar.calibration.uncertainty)."""
    x = est.extra
    level = round(100 * x[INTERVAL_LEVEL])
    t = Table(title=f"How sure: {level} % intervals, {x[SUPPORT]}", title_justify="left")
    t.add_column("figure")
    t.add_column("estimate", justify="right")
    t.add_column(f"{level} % interval", justify="right")
    rows = (
        ("step time s", est.step_time_s, INTERVAL[STEP_TIME_S], "{:.3f}"),
        ("tokens/s/GPU", est.tokens_per_s_per_gpu, INTERVAL[TOKENS_PER_S_PER_GPU], "{:,.0f}"),
        ("peak memory GiB", est.peak_memory_bytes / GIB, INTERVAL[PEAK_MEMORY_BYTES], "{:.1f}"),
    )
    for name, value, key, fmt in rows:
        lo, hi = x[key]
        if key == INTERVAL[PEAK_MEMORY_BYTES]:
            lo, hi = lo / GIB, hi / GIB
        band = f"{fmt.format(lo)} - {fmt.format(hi)}" if math.isfinite(lo) and math.isfinite(hi) else "unknown"
        t.add_row(name, fmt.format(value), band)
    return t


def sureness_line(est: Estimate) -> Text:
    """What the support is, and whether the memory interval reaches past the GPU's memory."""
    x = est.extra
    line = f"support: {x[SUPPORT]}: {x[SUPPORT_REASON]}."
    low, high = x[INTERVAL[PEAK_MEMORY_BYTES]]
    if est.fits and high > est.memory_capacity_bytes:
        line += (
            f" Memory: the interval's high end ({high / GIB:.1f} GiB) is above the GPU's "
            f"{est.memory_capacity_bytes / GIB:.1f} GiB, so it may not fit."
        )
    elif not est.fits and low <= est.memory_capacity_bytes:
        # at the edge the estimate alone cannot rule a layout out: published runs ran near it
        line += (
            f" Memory: tight, not ruled out: the interval's low end ({low / GIB:.1f} GiB) is within the GPU's "
            f"{est.memory_capacity_bytes / GIB:.1f} GiB, so it may fit; measure it (autopar trial) before dropping it."
        )
    return Text(line)


def ep_table(details: list, plan, routing_imbalance: float) -> list:
    """The EP all-to-all under each dispatcher: seconds before overlap, the rates it runs at and
    their sources (autopar.cost.ep_detail); empty without EP."""
    if not details:
        return []
    t = Table(title="EP all-to-all per step under each dispatcher (before overlap)", title_justify="left")
    for col in ("dispatcher", "seconds", "GB", "GB/s", "NVLink GB/s", "network GB/s", "crosses network"):
        t.add_column(col, justify="left" if col == "dispatcher" else "right")
    names = {"alltoall": "NCCL all-to-all", "deepep": "DeepEP / HybridEP"}
    for d in details:
        label = names[d.dispatcher] + (" (this plan)" if d.dispatcher == plan.moe_dispatcher else "")
        t.add_row(
            label,
            f"{d.seconds:.3f}",
            f"{d.bytes / 1e9:.1f}",
            f"{d.effective_gbps:.1f}",
            f"{d.nvlink_gbps:.0f}",
            f"{d.network_gbps:.0f}" if d.network_gbps else "-",
            f"{100 * d.network_share:.0f}%",
        )
    routing = (
        "forced-balanced"
        if routing_imbalance == 1
        else f"a real router, the busiest expert rank x{routing_imbalance:g} the mean"
    )
    notes = [note(f"routing: {routing} (--routing-imbalance)", style="dim")]
    for d in details:
        for src in d.sources:
            notes.append(note(f"{names[d.dispatcher]}: {src}", style="dim"))
    return [t, *notes]


def run_table(r, run) -> Table:
    """The whole run of one plan (autopar.cost.goodput.RunTime): days, goodput and its terms,
    checkpoints, GPU-hours, cost."""
    from autopar.spec.training_run import money_text, never_text, tokens_text

    t = Table(title=f"Whole run: {tokens_text(run.tokens)} tokens", title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("days to train", never_text(float(r.days), "{:,.1f}")),
        ("  days of steps (no failures)", f"{float(r.train_s) / 86_400:,.1f}"),
        (GOODPUT.header, f"{100 * float(r.goodput):.2f}%"),
        ("  lost to checkpoint writes", f"{100 * float(r.lost_to_checkpoints):.2f}%"),
        ("  lost to rework after failures", f"{100 * float(r.lost_to_rework):.2f}%"),
        ("  lost to restarts and reads", f"{100 * float(r.lost_to_restarts):.2f}%"),
        ("checkpoint (all ranks)", f"{float(r.checkpoint_bytes) / GIB:,.0f} GiB"),
        ("checkpoint write", f"{float(r.write_s):,.1f} s"),
        ("checkpoint every (Young/Daly)", never_text(float(r.interval_s) / 60, "{:,.1f} min")),
        ("mean time between failures", never_text(float(r.mtbf_s) / 3600, "{:,.2f} h")),
        ("GPU-hours", never_text(float(r.gpu_hours), "{:,.0f}")),
    ]
    if r.cost is not None:
        cost = float(r.cost)
        rows.append((COST.header, money_text(cost) if math.isfinite(cost) else "never (the run never finishes)"))
    if r.energy_mwh is not None:
        rows.append(("GPU energy (at their power limit)", never_text(float(r.energy_mwh), "{:,.0f} MWh")))
    for row in rows:
        t.add_row(*row)
    return t
