"""Every figure autopar answers with, declared once: its name (the estimate's column, the key in
top.json, search.json and the parquet files), unit, format, header, meaning and the module that
computes it.

A `Figure` is a `str` (its name), so it keys numpy column dicts, pandas frames and JSON as the
plain name does; the tables, the report and the JSON writers take the header and the format kind
from it. Nothing else in autopar spells a figure's name (tests/test_figures.py holds it).

The estimate's named terms are declared here too: the parallel axes, the time terms a step is the
sum of and the memory terms a rank's peak is the sum of (autopar.cost.columns prices them as
`time_<term>`, `mem_<term>` and `comm_bytes_<axis>`), with how each reads in the terminal, the
report and the why line.
"""

from __future__ import annotations

from typing import Any


class Figure(str):
    """An output figure: its name, with unit ("s", "bytes", "1" for a ratio, "" for text or a
    flag), format kind (autopar.report.format.KINDS), header, meaning and source (the module that
    computes it). Pickled and copied as its plain name; PyYAML's safe dumper refuses a str subclass,
    so a YAML writer passes str(figure)."""

    unit: str
    kind: str
    header: str
    meaning: str
    source: str

    def __new__(cls, name: str, unit: str, kind: str, header: str, meaning: str, source: str) -> Figure:
        self = super().__new__(cls, name)
        self.unit, self.kind, self.header, self.meaning, self.source = unit, kind, header, meaning, source
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (str(self),))


#: the module that computes each figure (a Figure's source)
COLUMNS = "autopar.cost.columns"
PRICE = "autopar.cost.price"
ESTIMATE = "autopar.calibration.estimate"
RESULTS = "autopar.search.results"
RUN = "autopar.search.run"
UNCERTAINTY = "autopar.calibration.uncertainty"
TOP_TABLES = "autopar.report.top_tables"
GOODPUT_MODULE = "autopar.cost.goodput"
STAGES = "autopar.spec.stages"
PLAN_FIELDS = "autopar.spec.plan_fields"

#: the parallel axes, and the terms the step time and a rank's memory are the sums of
AXES = ("tp", "cp", "ep", "pp", "dp")
TIME_TERMS = ("compute", "tp", "cp", "ep", "pp", "act_offload", "dp", "bubble", "optimizer", "offload")
MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "other")
#: how the terms read in the terminal, the report and the why line (communication terms are what
#: overlap leaves exposed)
TIME_LABELS = {
    "compute": "compute",
    "tp": "TP comm (exposed)",
    "cp": "CP comm (exposed)",
    "ep": "EP all-to-all (exposed)",
    "pp": "PP send/recv (exposed)",
    "dp": "DP comm (exposed)",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "offload": "optimizer offload (host)",
    "act_offload": "activation offload (host)",
}
MEMORY_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "other": "other (runtime, buffers)",
}

# -- the estimate: one training step of one plan (autopar.cost.columns, autopar.cost.price)
STEP_TIME_S = Figure("step_time_s", "s", "s4", "step s", "wall time of one optimizer step", COLUMNS)
TOKENS_PER_S = Figure("tokens_per_s", "tokens/s", "count", "tokens/s", "tokens trained per second, all GPUs", COLUMNS)
TOKENS_PER_S_PER_GPU = Figure(
    "tokens_per_s_per_gpu", "tokens/s", "count", "tokens/s/GPU", "tokens trained per second per GPU", COLUMNS
)
MODEL_TFLOPS_PER_GPU = Figure(
    "model_tflops_per_gpu", "TFLOP/s", "tflops", "TFLOP/s/GPU", "model FLOPs per second per GPU (no recompute)", COLUMNS
)
MFU = Figure("mfu", "1", "pct", "MFU", "model FLOPs utilisation: model FLOPs / step / GPUs / dense BF16 peak", COLUMNS)
HFU = Figure("hfu", "1", "pct", "HFU", "hardware FLOPs utilisation: MFU with the recompute FLOPs counted", COLUMNS)
BUBBLE_FRACTION = Figure("bubble_fraction", "1", "pct", "bubble", "share of the step the pipeline stands idle", COLUMNS)
PEAK_MEMORY_BYTES = Figure(
    "peak_memory_bytes", "bytes", "bytes_gib", "peak GiB", "peak memory of the most loaded rank", COLUMNS
)
MEMORY_CAPACITY_BYTES = Figure(
    "memory_capacity_bytes", "bytes", "bytes_gib", "capacity GiB", "the GPU's memory", COLUMNS
)
MEMORY_GIB = Figure(
    "memory_gib", "GiB", "gib", "memory GiB", "peak memory of a rank in GiB (of a plan: its most loaded rank)", RESULTS
)
MEMORY_MISS_GIB = Figure(
    "memory_miss_gib",
    "GiB",
    "gib",
    "over by GiB",
    "how far the peak is above the usable memory (0 if it fits)",
    COLUMNS,
)
MEMORY_RANK = Figure("memory_rank", "", "int", "memory rank", "the costed rank whose memory is the peak", COLUMNS)
PACE_RANK = Figure("pace_rank", "", "int", "pace rank", "the pipeline stage that sets the step's pace", COLUMNS)
NUM_MICROBATCHES = Figure(
    "num_microbatches", "", "int", "microbatches", "micro-batches per step per pipeline (global / micro / DP)", COLUMNS
)
PARAMS_PER_GPU = Figure(
    "params_per_gpu", "parameters", "human", "params/GPU", "parameters on the busiest rank", COLUMNS
)
PARAMS_TOTAL = Figure("params_total", "parameters", "human", "params", "the model's parameters", COLUMNS)
MODEL_FLOPS_PER_STEP = Figure(
    "model_flops_per_step", "FLOP", "human", "FLOP/step", "model FLOPs of one step (the MFU convention)", COLUMNS
)
STAGE_IMBALANCE = Figure(
    "stage_imbalance",
    "1",
    "pct",
    "stage imbalance",
    "slowest pipeline stage's work over the mean stage's, less 1",
    COLUMNS,
)
TIME_TP_PER_STEP = Figure(
    "time_tp_per_step",
    "s",
    "s4",
    "TP per step",
    "exposed TP communication once per step (not per micro-batch)",
    COLUMNS,
)
VALID = Figure("valid", "", "", "valid", "the plan breaks none of the validity rules", COLUMNS)
FITS = Figure("fits", "", "", "fits", "valid, and the peak is within the usable memory", COLUMNS)
REJECTED_CODE = Figure("rejected_code", "", "int", "rejected code", "bitmask of the rules the plan breaks", COLUMNS)
REJECTED_BY = Figure("rejected_by", "", "", "rejected by", "the rules the plan breaks, in short words", PRICE)
HOST_MEMORY_BYTES = Figure(
    "host_memory_bytes", "bytes", "bytes_gib", "host GiB", "host (CPU) memory per GPU the plan's offload needs", PRICE
)
HOST_MEMORY_BYTES_PER_GPU = Figure(
    "host_memory_bytes_per_gpu",
    "bytes",
    "bytes_gib",
    "host GiB/GPU",
    "host memory per GPU the plan's offload needs",
    ESTIMATE,
)
HOST_MEMORY_BYTES_PER_NODE = Figure(
    "host_memory_bytes_per_node",
    "bytes",
    "bytes_gib",
    "host GiB/node",
    "host memory per node the plan's offload needs",
    ESTIMATE,
)
POWER_W_PER_GPU = Figure("power_w_per_gpu", "W", "", "W/GPU", "the GPU's power draw the energy is priced at", ESTIMATE)
ENERGY_KWH_PER_STEP = Figure("energy_kwh_per_step", "kWh", "", "kWh/step", "GPU energy of one step, all GPUs", ESTIMATE)
#: one column per time term (seconds per step), memory term (bytes on the peak rank) and axis
#: (payload bytes per step of the busiest rank)
TIME = {
    t: Figure(f"time_{t}", "s", "s4", TIME_LABELS[t], f"{TIME_LABELS[t]}: seconds of the step", COLUMNS)
    for t in TIME_TERMS
}
MEM = {
    t: Figure(f"mem_{t}", "bytes", "bytes_gib", MEMORY_LABELS[t], f"{MEMORY_LABELS[t]} on the peak rank", COLUMNS)
    for t in MEMORY_TERMS
}
COMM_BYTES = {
    a: Figure(f"comm_bytes_{a}", "bytes", "bytes_gb", f"{a.upper()} GB", f"{a.upper()} payload bytes per step", COLUMNS)
    for a in AXES
}
#: per costed rank (pipeline stage), for the per-stage breakdown: (ranks, plans) arrays
STAGE_RANK = Figure("stage_rank", "", "int", "rank", "the costed rank (pipeline stage) of the row", COLUMNS)
STAGE_ACTIVE = Figure("stage_active", "", "", "active", "the plan has this rank", COLUMNS)
STAGE_MEMORY_BYTES = Figure(
    "stage_memory_bytes", "bytes", "bytes_gib", "memory GiB", "peak memory of the rank", COLUMNS
)
STAGE_TIME_PER_MB = Figure(
    "stage_time_per_mb",
    "s",
    "s4",
    "s per micro-batch",
    "forward and backward time of one micro-batch on the rank",
    COLUMNS,
)
STAGE_PARAMS = Figure("stage_params", "parameters", "human", "params", "parameters on the rank", COLUMNS)
STAGE_LAYERS = Figure("stage_layers", "layers", "int", "layers", "transformer layers on the rank", COLUMNS)
STAGE_COMM_BYTES = {
    a: Figure(
        f"stage_comm_bytes_{a}", "bytes", "bytes_gb", f"{a.upper()} GB", f"{a.upper()} payload bytes per step", COLUMNS
    )
    for a in AXES
}
#: the same three families in top.json, as a dict per plan keyed by term or axis
TIME_S = Figure("time_s", "s", "s4", "time s", "seconds of the step, per time term", RUN)
MEMORY_BYTES = Figure(
    "memory_bytes",
    "bytes",
    "bytes_gib",
    "memory GiB",
    "a rank's memory: per term on a plan's peak rank, or a stage's total",
    RUN,
)
COMM_BYTES_PER_GPU = Figure(
    "comm_bytes_per_gpu", "bytes", "bytes_gb", "comm GB", "payload bytes per step of the busiest rank, per axis", RUN
)

# -- the search's figures of a plan (autopar.search, autopar.calibration.uncertainty)
PLAN_NAME = Figure("plan_name", "", "", "plan", "the layout's short name, e.g. tp8.pp4.v2.dp8", PLAN_FIELDS)
LAYOUT_TEXT = Figure("layout_text", "", "", "layout", "the pipeline's stage layout in words", STAGES)
DOMINANT_COST = Figure("dominant_cost", "", "", "dominant cost", "the largest time term of the step", RESULTS)
RANK_TIME_S = Figure(
    "rank_time_s", "s", "s4", "ranked by s", "the step time the search ranks by (central or pessimistic)", RESULTS
)
SUPPORT_GAPS = Figure(
    "support_gaps",
    "",
    "int",
    "support gaps",
    "how many ways the plan differs from the published runs it is fitted to",
    UNCERTAINTY,
)
SUPPORT = Figure("support", "", "", "support", "calibrated or extrapolated, against the published runs", UNCERTAINTY)
SUPPORT_REASON = Figure(
    "support_reason", "", "", "why", "the nearest published run and what differs from it", UNCERTAINTY
)
INTERVAL_LEVEL = Figure("interval_level", "1", "pct", "level", "the intervals' coverage level (0.8)", UNCERTAINTY)
VARIANT_OF = Figure("variant_of", "", "", "variant of", "the top plan this one is a variant of", RESULTS)
VS_LEADER = Figure(
    "vs_leader", "1", "pct_signed", "vs leader", "step time against the plan it is a variant of, less 1", TOP_TABLES
)
VS_BEST = Figure("vs_best", "1", "pct_signed", "vs best", "step time against the fastest shown, less 1", TOP_TABLES)
#: the figures with an 80 % interval: `<figure>_low`, `<figure>_high` columns, `<figure>_interval` in JSON
INTERVAL_FIGURES = (STEP_TIME_S, TOKENS_PER_S, TOKENS_PER_S_PER_GPU, PEAK_MEMORY_BYTES)


def _bound(figure: Figure, end: str) -> Figure:
    header = {"low": "low", "high": "high", "interval": "80 % interval"}[end]
    meaning = f"{figure.meaning}: " + ("its 80 % interval [low, high]" if end == "interval" else f"the {end} end of it")
    return Figure(f"{figure}_{end}", figure.unit, figure.kind, f"{figure.header} {header}", meaning, UNCERTAINTY)


LOW = {f: _bound(f, "low") for f in INTERVAL_FIGURES}
HIGH = {f: _bound(f, "high") for f in INTERVAL_FIGURES}
INTERVAL = {f: _bound(f, "interval") for f in INTERVAL_FIGURES}

# -- the training run: the whole token budget (autopar.cost.goodput, autopar.search.training)
DAYS = Figure(
    "days", "days", "days", "days", "wall-clock days to train the token budget, failures included", GOODPUT_MODULE
)
GOODPUT = Figure(
    "goodput", "1", "pct", "goodput", "share of the wall clock that trains (checkpoints, failures)", GOODPUT_MODULE
)
GPU_HOURS = Figure("gpu_hours", "GPU-hours", "count", "GPU-hours", "GPUs x wall-clock hours of the run", GOODPUT_MODULE)
COST = Figure("cost", "money", "money", "cost", "GPU-hours x the price per GPU-hour", GOODPUT_MODULE)
TRAIN_DAYS = Figure(
    "train_days", "days", "days", "training days", "days of training steps alone (no failures)", GOODPUT_MODULE
)
CHECKPOINT_GIB = Figure("checkpoint_gib", "GiB", "gib", "checkpoint GiB", "size of one checkpoint", GOODPUT_MODULE)
CHECKPOINT_INTERVAL_MIN = Figure(
    "checkpoint_interval_min",
    "min",
    "",
    "checkpoint every min",
    "minutes between checkpoints (Young-Daly)",
    GOODPUT_MODULE,
)
LOST_TO_CHECKPOINTS = Figure(
    "lost_to_checkpoints",
    "1",
    "pct",
    "lost to checkpoints",
    "share of the wall clock spent writing checkpoints",
    GOODPUT_MODULE,
)
LOST_TO_REWORK = Figure(
    "lost_to_rework",
    "1",
    "pct",
    "lost to rework",
    "share of the wall clock redoing work lost to an interruption",
    GOODPUT_MODULE,
)
LOST_TO_RESTARTS = Figure(
    "lost_to_restarts",
    "1",
    "pct",
    "lost to restarts",
    "share of the wall clock restarting and reading checkpoints",
    GOODPUT_MODULE,
)
MEETS_DEADLINE = Figure(
    "meets_deadline", "", "", "meets deadline", "the run finishes within the deadline given", GOODPUT_MODULE
)
WITHIN_BUDGET = Figure(
    "within_budget", "", "", "within budget", "the run's cost is within the budget given", GOODPUT_MODULE
)
ENERGY_MWH = Figure(
    "energy_mwh", "MWh", "count", "GPU MWh", "GPU energy of the whole run at the GPUs' power limit", GOODPUT_MODULE
)


def _declared() -> dict[str, Figure]:
    found: list[Figure] = []
    for value in list(globals().values()):
        if isinstance(value, Figure):
            found.append(value)
        elif isinstance(value, dict):
            found.extend(v for v in value.values() if isinstance(v, Figure))
    return {str(f): f for f in found}


#: every figure by name
FIGURES: dict[str, Figure] = _declared()


def figure(name: str) -> Figure:
    """The declared figure of a column or key name (KeyError for a name that is not one)."""
    return FIGURES[name]
