"""Parse the per-step stdout of five training stacks: step times, throughput, peak memory, failure.

`parse_log(trainer, text, context)` reads the text a run of Megatron-LM ("megatron"), Megatron-Bridge
("bridge"), NeMo 2 ("nemo"), torchtitan or DeepSpeed printed and returns a `TrainerLog`;
`step_summary(log, warmup)` drops the warm-up steps and gives the median step time. Standard library
only (no torch).

Every format comes from the trainer's own source; `CITES` names the file, version and line of each
fragment the parsers rely on, and tests/measured/test_trainer_logs.py checks them against the
installed releases (torchtitan 0.3.0, DeepSpeed 0.19.8, Megatron-Bridge 0.3.1, NeMo 2.7.3).
Megatron-LM's megatron/training/ is on no package index (the megatron-core wheel ships only
megatron/core): its iteration-line fragments are the ones Megatron-Bridge 0.3.1 copies, and the
tests check them through Bridge's copy.

Patterns match by field name anywhere in a line, never at its start: torchrun may prefix each line
with the rank (`[rank0]:`), DeepSpeed with `[Rank 0] `, torchtitan's logger with `[titan] <time> -`.
ANSI colour escapes (torchtitan) are removed first. Nothing in a text makes the parser raise: what
does not read as a figure is skipped.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from autopar.figures import STEP_TIME_S

TRAINERS = ("megatron", "bridge", "nemo", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Cite:
    """Where a figure's log line is printed: package, version, file, first line, the exact source fragment."""

    package: str  # e.g. "torchtitan"
    version: str  # e.g. "0.3.0"
    path: str  # file inside the package, e.g. "torchtitan/components/metrics.py"
    line: int  # the line number (1-based) in that version where `fragment` appears
    fragment: str  # an exact substring of that source line
    figure: str  # what it gives: "step time", "throughput", "peak memory", ...


def _source(package: str, version: str, path: str) -> Callable[[int, str, str], Cite]:
    """Cites of one file: (line, fragment, figure) -> Cite."""
    return lambda line, fragment, figure: Cite(package, version, path, line, fragment, figure)


# Megatron-LM is cited at its git tag: megatron/training/ is in no wheel (megatron-core ships megatron/core)
_mlm_training = _source("megatron-lm", "core_v0.16.0", "megatron/training/training.py")
_mlm_utils = _source("megatron-lm", "core_v0.16.0", "megatron/training/utils.py")
_bridge = _source("megatron-bridge", "0.3.1", "megatron/bridge/training/utils/train_utils.py")
_nemo_printer = _source("nemo-toolkit", "2.7.3", "nemo/lightning/pytorch/callbacks/progress_printer.py")
_nemo_timing = _source("nemo-toolkit", "2.7.3", "nemo/utils/exp_manager.py")
_nemo_flops = _source("nemo-toolkit", "2.7.3", "nemo/lightning/pytorch/callbacks/flops_callback.py")
_nemo_strategy = _source("nemo-toolkit", "2.7.3", "nemo/lightning/pytorch/strategies/megatron_strategy.py")
_titan_metrics = _source("torchtitan", "0.3.0", "torchtitan/components/metrics.py")
_titan_dims = _source("torchtitan", "0.3.0", "torchtitan/distributed/parallel_dims.py")
_ds_timer = _source("deepspeed", "0.19.8", "deepspeed/utils/timer.py")
_ds_engine = _source("deepspeed", "0.19.8", "deepspeed/runtime/engine.py")
_ds_logging = _source("deepspeed", "0.19.8", "deepspeed/utils/logging.py")

# Each fragment is the source text as written (quotes included), so that a test can evaluate it.
CITES: dict[str, tuple[Cite, ...]] = {
    "megatron": (
        _mlm_training(2034, "' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)", "iteration"),
        _mlm_training(
            2040,
            "' elapsed time per iteration (ms): {:.1f} |'.format(elapsed_time_per_iteration * 1000.0)",
            "step time (ms, mean over the log interval)",
        ),
        _mlm_training(2044, "f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'", "tflops"),
        _mlm_utils(
            279,
            'f" | max allocated: {torch.cuda.max_memory_allocated() / mega_bytes:.2f}"',
            "peak memory (MiB: mega_bytes = 1024.0 * 1024.0)",
        ),
    ),
    "bridge": (
        _bridge(
            657,
            'f"Step Time : {elapsed_time_per_iteration:.2f}s GPU utilization: {per_gpu_tf:.1f}MODEL_TFLOP/s/GPU"',
            "step time (s, rank 0) and tflops",
        ),
        _bridge(686, '" iteration {:8d}/{:8d} |".format(iteration, train_config.train_iters)', "iteration"),
        _bridge(
            690,
            '" elapsed time per iteration (ms): {:.1f} |".format(elapsed_time_per_iteration * 1000.0)',
            "step time (ms, last rank)",
        ),
        _bridge(693, 'f" throughput per GPU (TFLOP/s/GPU): {per_gpu_tf:.1f} |"', "tflops"),
        _bridge(741, 'f"(after {iteration} iterations) memory (GB)"', "peak memory"),
        _bridge(743, 'f" | {metric}: {value}"', "peak memory"),
        _bridge(745, '"[Rank {}] {}".format(torch.distributed.get_rank(), memory_string)', "peak memory"),
        _bridge(70, '"mem-max-allocated-bytes"', "peak memory (allocated)"),
        _bridge(796, "memory_stats[torch_name] / 1.0e9", "peak memory unit (GB)"),
        _bridge(801, 'name.replace("bytes", "gigabytes")', "peak memory name"),
    ),
    "nemo": (
        _nemo_printer(52, 'self._train_description = "Training"', "line prefix"),
        _nemo_printer(150, 'f" epoch {trainer.current_epoch}, iteration {n-1}/{self.total-1}"', "iteration"),
        _nemo_printer(70, "f' | {metric}: {val}'", "integral metric values"),
        _nemo_printer(72, "f' | {metric}: {val:.4}'", "metric values (4 significant digits)"),
        _nemo_timing(358, '"train_step_timing"', "step time (s)"),
        _nemo_timing(341, "name + ' in s'", "step time (s)"),
        _nemo_timing(380, '"tokens_per_sec_per_gpu"', "tokens/s per GPU"),
        _nemo_flops(163, '"TFLOPS_per_GPU"', "tflops"),
        _nemo_strategy(356, '"NEMO_LOG_MEMORY_USAGE"', "peak memory switch"),
        _nemo_strategy(824, "torch.cuda.max_memory_allocated()", "peak memory (bytes)"),
        _nemo_strategy(837, '"max_memory_allocated"', "peak memory (bytes)"),
    ),
    "torchtitan": (
        _titan_metrics(524, 'f"{color.red}step: {step:2}  "', "step"),
        _titan_metrics(525, 'f"{color.green}loss: {global_avg_loss:8.5f}  "', "loss (layout)"),
        _titan_metrics(526, 'f"{color.orange}grad_norm: {grad_norm:7.4f}  "', "grad norm (layout)"),
        _titan_metrics(
            527,
            'f"{color.turquoise}memory: {device_mem_stats.max_reserved_gib:5.2f}GiB"',
            "peak memory (max reserved since the previous line, GiB)",
        ),
        _titan_metrics(528, 'f"({device_mem_stats.max_reserved_pct:.2f}%)  "', "memory % (layout)"),
        _titan_metrics(529, 'f"{color.blue}tps: {round(tps):,}  "', "tokens/s per device (gives the step time)"),
        _titan_metrics(530, 'f"{color.cyan}tflops: {tflops:,.2f}  "', "tflops"),
        _titan_metrics(531, 'f"{color.magenta}mfu: {mfu_str}{color.reset}"', "mfu (layout)"),
        _titan_metrics(477, "tps = self.ntokens_since_last_log / (", "tps definition"),
        _titan_metrics(478, "time_delta * self.parallel_dims.non_data_parallel_size", "tps definition (per device)"),
        _titan_dims(709, "self.cp * self.tp * self.pp", "tps divisor (non-data-parallel size)"),
    ),
    "deepspeed": (
        _ds_timer(144, 'string = "time (ms)"', "step time (wall_clock_breakdown)"),
        _ds_timer(148, '" | {}: {:.2f}".format(name, elapsed_time)', "step time (ms per timer)"),
        _ds_timer(12, "FORWARD_GLOBAL_TIMER = 'fwd'", "step time (forward)"),
        _ds_timer(14, "BACKWARD_GLOBAL_TIMER = 'bwd'", "step time (backward)"),
        _ds_timer(20, "STEP_GLOBAL_TIMER = 'step'", "step time (optimizer step)"),
        _ds_engine(3677, "self.timers.log(self.engine_timers.global_timers)", "step time (per accumulation boundary)"),
        _ds_timer(
            265,
            '"epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, "',
            "throughput (global samples/s)",
        ),
        _ds_timer(266, '"MemAllocated={}GB, MaxMemAllocated={}GB"', "peak memory"),
        _ds_timer(273, "round(get_accelerator().max_memory_allocated() / 1024**3, 2)", "peak memory unit (GiB)"),
        _ds_engine(638, "batch_size=self.train_batch_size()", "samples/s are global"),
        _ds_logging(108, '"[Rank {}] {}".format(my_rank, message)', "line prefix"),
    ),
}


@dataclass(frozen=True)
class LogContext:
    """What a parser needs beyond the text to turn throughput into step time."""

    global_batch_size: int  # samples per optimizer step
    seq_len: int
    num_gpus: int

    def tokens_per_step(self) -> int | None:
        ok = self.global_batch_size > 0 and self.seq_len > 0 and self.num_gpus > 0
        return self.global_batch_size * self.seq_len if ok else None


@dataclass
class TrainerLog:
    # (iteration number as the trainer counts it, step time in seconds), log order, one per logged step
    steps: list[tuple[int, float]] = field(default_factory=list)
    peak_memory_bytes: float | None = None  # the largest per-rank peak seen (bytes)
    memory_method: str | None = None  # e.g. "max allocated (Megatron report_memory, MiB)"
    tflops_per_gpu: list[float] = field(default_factory=list)  # as printed, per logged step (may be empty)
    # as printed (torchtitan, NeMo) or converted from printed samples/s (DeepSpeed); empty for Megatron-LM
    # and Bridge, which print none
    tokens_per_s_per_gpu: list[float] = field(default_factory=list)
    failure: str | None = None  # None, "oom" or "crash"
    error_line: str | None = None  # the trainer's/PyTorch's error line (one line, stripped), for oom/crash


# A printed number: Python's repr/format of a float or int (exponent, nan and inf included; the
# caller drops the non-finite ones). Integers longer than 18 digits are no step number (and int()
# refuses over 4300 digits).
_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf))"
_INT = r"(\d{1,18})(?!\d)"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _to_float(printed: str) -> float | None:
    """A printed number as a finite float (thousands separators allowed), else None."""
    try:
        value = float(printed.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _number(pattern: re.Pattern[str], line: str) -> float | None:
    """The finite number `pattern`'s first group captures in `line`, else None."""
    match = pattern.search(line)
    return None if match is None else _to_float(match.group(1))


def _after(marker: str, pattern: re.Pattern[str], lines: list[str]) -> list[float]:
    """The numbers `pattern` finds after `marker` in the lines that have it."""
    found = [_number(pattern, line[line.index(marker) :]) for line in lines if marker in line]
    return [value for value in found if value is not None]


def _peak(values: list[float], scale: float) -> float | None:
    return max(values) * scale if values else None


# ---- Megatron-LM and Megatron-Bridge: the iteration line ----------------------------------------
# Megatron-LM core_v0.16.0 training.py L2034/L2040/L2044 = Bridge 0.3.1 train_utils.py L686/L690/L693.
_ITERATION = re.compile(r"\biteration\s+" + _INT + r"/\s*\d+\s*\|")
_ELAPSED_MS = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_THROUGHPUT_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM)
# Megatron-LM utils.py report_memory (L279 in core_v0.16.0): "[Rank r] (after N iterations) memory (MB)
# | allocated: a | max allocated: m | reserved: r | max reserved: R", values / (1024 * 1024)
_MEGATRON_MAX_ALLOCATED = re.compile(r"\|\s*max allocated:\s*" + _NUM)
# Bridge train_utils.py L741-745: "[Rank r] (after N iterations) memory (GB) | mem-max-allocated-gigabytes: x"
_BRIDGE_MAX_ALLOCATED = re.compile(r"\|\s*mem-max-allocated-gigabytes:\s*" + _NUM)
# Bridge train_utils.py L657 (rank 0): "Step Time : 1.23s GPU utilization: 456.7MODEL_TFLOP/s/GPU"
_BRIDGE_STEP_TIME = re.compile(r"Step Time :\s*" + _NUM + r"s GPU utilization:\s*" + _NUM + r"MODEL_TFLOP/s/GPU")


def _iteration_lines(lines: list[str]) -> tuple[list[tuple[int, float]], list[float]]:
    """Steps and TFLOP/s of the Megatron-style iteration lines. The time is the mean over the log
    interval: with --log-interval 1 each line is one iteration. Megatron-LM core_v0.16+ also logs the
    first iteration without resetting the interval timer, so its next line averages iterations 1..N
    too: a warm-up of 2 logged steps drops both."""
    steps: list[tuple[int, float]] = []
    tflops: list[float] = []
    for line in lines:
        iteration = _ITERATION.search(line)
        ms = _number(_ELAPSED_MS, line)
        if iteration is None or ms is None or ms <= 0:
            continue
        steps.append((int(iteration.group(1)), ms / 1000.0))
        tf = _number(_THROUGHPUT_TFLOPS, line)
        if tf is not None:
            tflops.append(tf)
    return steps, tflops


def _parse_megatron(lines: list[str], context: LogContext) -> TrainerLog:
    steps, tflops = _iteration_lines(lines)
    # Megatron-LM prints one memory line per model-parallel rank: the largest is the peak rank
    peaks = _after("memory (MB)", _MEGATRON_MAX_ALLOCATED, lines)
    return TrainerLog(
        steps=steps,
        peak_memory_bytes=_peak(peaks, 1024.0 * 1024.0),  # labelled MB, divided by 1024 * 1024
        memory_method="max allocated (Megatron report_memory, MiB)" if peaks else None,
        tflops_per_gpu=tflops,
    )


def _parse_bridge(lines: list[str], context: LogContext) -> TrainerLog:
    """The iteration line (last rank) when there is one; else the "Step Time" line (rank 0), which has
    no iteration number (numbered 1, 2, ... in log order) and only 10 ms resolution. Both print the
    same interval, so one source is used, never both."""
    steps, tflops = _iteration_lines(lines)
    step_time_lines = [m for m in (_BRIDGE_STEP_TIME.search(line) for line in lines) if m is not None]
    fallback_tflops = [v for v in (_to_float(m.group(2)) for m in step_time_lines) if v is not None]
    if not steps:
        seconds = [v for v in (_to_float(m.group(1)) for m in step_time_lines) if v is not None and v > 0]
        steps = list(enumerate(seconds, 1))
    peaks = _after("memory (GB)", _BRIDGE_MAX_ALLOCATED, lines)
    return TrainerLog(
        steps=steps,
        peak_memory_bytes=_peak(peaks, 1.0e9),  # train_utils.py L796: decimal GB
        memory_method="max allocated (Megatron-Bridge report_memory, GB)" if peaks else None,
        tflops_per_gpu=tflops or fallback_tflops,
    )


# ---- NeMo 2: ProgressPrinter ---------------------------------------------------------------------
# progress_printer.py L150: "Training epoch E, iteration i/T" then L70/L72 " | name: value" per
# progress-bar metric, in the order the metrics were logged (parse by name). Values are averages over
# the printer's interval, printed as ints or with 4 significant digits (1.234, 1.234e+10).
_NEMO_PREFIX = re.compile(r"\bTraining epoch\s+\d+,\s*iteration\s+(-?\d{1,18})(?!\d)/-?\d+")


def _nemo_field(name: str) -> re.Pattern[str]:
    return re.compile(r"\|\s*" + re.escape(name) + r":\s*" + _NUM)


_NEMO_STEP_TIME = _nemo_field("train_step_timing in s")  # exp_manager.py L341, L358
_NEMO_MAX_ALLOCATED = _nemo_field("max_memory_allocated")  # megatron_strategy.py L837 (bytes)
_NEMO_TFLOPS = _nemo_field("TFLOPS_per_GPU")  # flops_callback.py L163
_NEMO_TOKENS = _nemo_field("tokens_per_sec_per_gpu")  # exp_manager.py L380


def _parse_nemo(lines: list[str], context: LogContext) -> TrainerLog:
    log = TrainerLog()
    peaks: list[float] = []
    for line in lines:
        prefix = _NEMO_PREFIX.search(line)
        if prefix is None:
            continue
        seconds = _number(_NEMO_STEP_TIME, line)
        if seconds is not None and seconds > 0:
            log.steps.append((int(prefix.group(1)), seconds))
        for pattern, values in ((_NEMO_TFLOPS, log.tflops_per_gpu), (_NEMO_TOKENS, log.tokens_per_s_per_gpu)):
            value = _number(pattern, line)
            if value is not None:
                values.append(value)
        memory = _number(_NEMO_MAX_ALLOCATED, line)
        if memory is not None:
            peaks.append(memory)
    # only rank 0 prints (strategies/utils.py fix_progress_bar): its peak stands for the run
    log.peak_memory_bytes = _peak(peaks, 1.0)
    log.memory_method = "max allocated (NeMo max_memory_allocated, bytes)" if peaks else None
    return log


# ---- torchtitan: MetricsProcessor.log -----------------------------------------------------------
# metrics.py L524-531: "step: 2  loss:  8.12345  grad_norm:  1.2345  memory: 12.34GiB(15.59%)
# tps: 12,345  tflops: 123.45  mfu: 12.48%" (mfu may be N/A; 0.2.x prints loss:7.4f). L568-572 print
# "validate step:" lines, which are skipped.
_TITAN_STEP = re.compile(r"\bstep:\s*" + _INT + r"\s")
_TITAN_MEMORY_GIB = re.compile(r"\bmemory:\s*" + _NUM + r"GiB")
_TITAN_TPS = re.compile(r"\btps:\s*(\d[\d,]*)")
_TITAN_TFLOPS = re.compile(r"\btflops:\s*(\d[\d,]*(?:\.\d*)?)")


def _parse_torchtitan(lines: list[str], context: LogContext) -> TrainerLog:
    """Step time is not printed; it follows from tps. metrics.py L477-478: tps = local tokens /
    (seconds * non_data_parallel_size), local tokens being the labels of this rank's data-parallel
    shard (global_batch_size * seq_len / dp per step) and non_data_parallel_size = cp * tp * pp
    (parallel_dims.py L709). So tps = global_batch_size * seq_len / (seconds * num_gpus), and
    seconds = global_batch_size * seq_len / (tps * num_gpus): the mean over the log_freq steps."""
    log = TrainerLog()
    peaks: list[float] = []
    seen: set[int] = set()
    tokens_per_step = context.tokens_per_step()
    for line in lines:
        step = _TITAN_STEP.search(line)
        tps = _number(_TITAN_TPS, line)
        if step is None or tps is None or "validate step:" in line or "loss:" not in line:
            continue
        memory = _number(_TITAN_MEMORY_GIB, line)
        if memory is not None:  # the peak since the previous line: the run's peak is the largest
            peaks.append(memory)
        number = int(step.group(1))
        if number in seen:  # every rank logs its own line: keep the first of each step
            continue
        seen.add(number)
        log.tokens_per_s_per_gpu.append(tps)
        tflops = _number(_TITAN_TFLOPS, line)
        if tflops is not None:
            log.tflops_per_gpu.append(tflops)
        if tokens_per_step is not None and tps > 0:
            log.steps.append((number, tokens_per_step / (tps * context.num_gpus)))
    log.peak_memory_bytes = _peak(peaks, float(2**30))
    log.memory_method = "max reserved (torchtitan, GiB)" if peaks else None
    return log


# ---- DeepSpeed ----------------------------------------------------------------------------------
# timer.py L144/L148 with engine.py L3677: at each gradient-accumulation boundary, with
# wall_clock_breakdown on, "[Rank 0] time (ms) | fwd: a | bwd: b | bwd_inner: c | bwd_allreduce: d |
# step: e" (global timers, engine.py L219-221, reset after each line). The per-micro-step line names
# its timers fwd_microstep, bwd_microstep, ...: "| fwd:" never matches it.
def _timer(name: str) -> re.Pattern[str]:
    return re.compile(r"\|\s*" + name + r":\s*" + _NUM)


_DS_FWD, _DS_BWD, _DS_STEP = _timer("fwd"), _timer("bwd"), _timer("step")
# timer.py L265-266 (ThroughputTimer, INFO level): "epoch=0/micro_step=8/global_step=4,
# RunningAvgSamplesPerSec=..., CurrSamplesPerSec=..., MemAllocated=...GB, MaxMemAllocated=...GB"
_DS_GLOBAL_STEP = re.compile(r"\bglobal_step=" + _INT)
_DS_SAMPLES_PER_S = re.compile(r"\bCurrSamplesPerSec=" + _NUM)
_DS_MAX_ALLOCATED_GIB = re.compile(r"\bMaxMemAllocated=" + _NUM + "GB")


def _deepspeed_breakdown_seconds(line: str) -> float | None:
    """fwd + bwd + step of a global-timer line, in seconds; bwd already holds bwd_inner and
    bwd_allreduce (engine.py starts all three around the same backward)."""
    if "time (ms)" not in line:
        return None
    parts = [_number(pattern, line) for pattern in (_DS_FWD, _DS_BWD, _DS_STEP)]
    if any(p is None for p in parts):
        return None
    total = sum(p for p in parts if p is not None) / 1000.0
    return total if total > 0 else None


def _parse_deepspeed(lines: list[str], context: LogContext) -> TrainerLog:
    """Steps from the wall-clock breakdown lines when present, else from CurrSamplesPerSec (a global
    figure: the engine builds the timer with batch_size=train_batch_size(), engine.py L638): step time =
    global_batch_size / samples/s. A breakdown line takes the global_step of the ThroughputTimer line
    printed just before it in the same step() (timer.py prints from step 3 on), else the previous + 1."""
    log = TrainerLog()
    breakdown: list[tuple[int, float]] = []
    by_throughput: list[tuple[int, float]] = []
    peaks: list[float] = []
    pending_number: int | None = None
    for line in lines:
        seconds = _deepspeed_breakdown_seconds(line)
        if seconds is not None:
            number = pending_number if pending_number is not None else (breakdown[-1][0] + 1 if breakdown else 1)
            breakdown.append((number, seconds))
            pending_number = None
            continue
        rate = _number(_DS_SAMPLES_PER_S, line)
        if rate is None:
            continue
        step = _DS_GLOBAL_STEP.search(line)
        pending_number = int(step.group(1)) if step else len(by_throughput) + 1
        memory = _number(_DS_MAX_ALLOCATED_GIB, line)
        if memory is not None:
            peaks.append(memory)
        if rate > 0 and context.tokens_per_step() is not None:
            by_throughput.append((pending_number, context.global_batch_size / rate))
            log.tokens_per_s_per_gpu.append(rate * context.seq_len / context.num_gpus)
    log.steps = breakdown or by_throughput
    log.peak_memory_bytes = _peak(peaks, float(2**30))  # round(... / 1024**3, 2), printed "GB"
    log.memory_method = "max allocated (DeepSpeed MaxMemAllocated, GiB)" if peaks else None
    return log


# ---- failures (all trainers) --------------------------------------------------------------------
# PyTorch c10/cuda/CUDACachingAllocator.cpp raises OutOfMemoryError with "CUDA out of memory. Tried to
# allocate ..."; Python names it torch.OutOfMemoryError or torch.cuda.OutOfMemoryError.
_OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError")
_TRACEBACK_HEADER = "Traceback (most recent call last):"
# A traceback's final line "[rank0]: pkg.mod.NameError: message" (any "[...]:" or "N:" prefixes).
_EXCEPTION_LINE = re.compile(
    r"^(?:\s*(?:\[[^\]]{0,80}\]:?|\d{1,6}:))*\s*"
    r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]?\w*(?:Error|Exception|Interrupt|Exit)(?::.*)?)$"
)
# torchrun's ChildFailedError summary (torch/distributed/elastic/multiprocessing/errors/__init__.py):
# "Root Cause (first observed failure):" then "  exitcode  : 1 (pid: 123)".
_ROOT_CAUSE = "Root Cause (first observed failure):"
_EXITCODE_LINE = re.compile(r"^\s*exitcode\s*:\s*-?\d+")


def _exception_line(lines: list[str]) -> str | None:
    """The first exception line after the first traceback header: the root cause, not the launcher's
    ChildFailedError that wraps it."""
    start = next((i for i, line in enumerate(lines) if _TRACEBACK_HEADER in line), None)
    if start is None:
        return None
    for line in lines[start + 1 :]:
        if "ChildFailedError" not in line and _EXCEPTION_LINE.match(line):
            return line.strip()
    return None


def _failure(lines: list[str]) -> tuple[str | None, str | None]:
    oom = [line for line in lines if any(marker in line for marker in _OOM_MARKERS)]
    if oom:
        raised = [line for line in oom if _EXCEPTION_LINE.match(line)]
        return "oom", (raised or oom)[0].strip()
    exception = _exception_line(lines)
    if exception is not None:
        return "crash", exception
    if any(_ROOT_CAUSE in line for line in lines):
        exitcode = next((line.strip() for line in lines if _EXITCODE_LINE.match(line)), None)
        return "crash", exitcode or _ROOT_CAUSE
    return None, None


_PARSERS: dict[str, Callable[[list[str], LogContext], TrainerLog]] = {
    "megatron": _parse_megatron,
    "bridge": _parse_bridge,
    "nemo": _parse_nemo,
    "torchtitan": _parse_torchtitan,
    "deepspeed": _parse_deepspeed,
}


def parse_log(trainer: str, text: str, context: LogContext) -> TrainerLog:
    """Step times, throughput, peak memory and failure of one run's stdout (see the module doc).
    An unknown `trainer` raises ValueError; no text does: unreadable figures are skipped."""
    if trainer not in _PARSERS:
        raise ValueError(f"unknown trainer {trainer!r}; one of {', '.join(TRAINERS)}")
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return TrainerLog()
    lines = _ANSI.sub("", text).splitlines()
    try:
        log = _PARSERS[trainer](lines, context)
        log.failure, log.error_line = _failure(lines)
    except (ValueError, ArithmeticError):  # a figure no pattern foresaw: no figures rather than a crash
        return TrainerLog()
    return log


def step_summary(log: TrainerLog, warmup: int) -> dict | None:
    """Drop the first `warmup` logged steps; the median of the rest: {"step_time_s", "step_times_s",
    "mean_step_time_s", "step_time_spread" ((max-min)/median), "warmup_dropped"}; None when no step is left."""
    dropped = min(max(warmup, 0), len(log.steps))
    times = [seconds for _, seconds in log.steps[dropped:]]
    if not times:
        return None
    median = statistics.median(times)
    return {
        STEP_TIME_S: median,
        "step_times_s": times,
        "mean_step_time_s": statistics.fmean(times),
        "step_time_spread": (max(times) - min(times)) / median if median > 0 else 0.0,
        "warmup_dropped": dropped,
    }
