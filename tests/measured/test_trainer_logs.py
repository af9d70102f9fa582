"""The trainers' log parsers (autopar/measured/trainer_logs.py) against the trainers' own source.

1. Every `Cite` is checked on its line in the installed release: torchtitan 0.3.0 and DeepSpeed
   0.19.8 in site-packages (located with importlib.util.find_spec, not imported), Megatron-Bridge 0.3.1
   and NeMo 2.7.3 in .venv/trainer-refs (`make setup-test`). A package that is not installed skips
   its cites. Megatron-LM's megatron/training/ is in no wheel: its iteration-line fragments are checked
   by printing them next to Megatron-Bridge 0.3.1's copy of the same line.
2. The log lines fed to the parsers are printed by evaluating those very fragments (the f-strings and
   str.format calls as the source writes them) on known values, so a parser test reads what the cited
   source prints.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import random
import sys
from pathlib import Path
from string import Template
from types import SimpleNamespace as NS

import pytest

from autopar.measured.trainer_logs import CITES, TRAINERS, Cite, LogContext, TrainerLog, parse_log, step_summary

REPO = Path(__file__).resolve().parents[2]
REFS = (REPO / ".venv" / "trainer-refs", Path(sys.prefix) / "trainer-refs")
TOP_LEVEL_MODULE = {"torchtitan": "torchtitan", "deepspeed": "deepspeed"}  # site-packages distributions
PARSER = "autopar/measured/trainer_logs.py"
ALL_CITES = [(trainer, cite) for trainer in TRAINERS for cite in CITES[trainer]]


# ---- the cites against the installed sources ----------------------------------------------------


def installed(package: str) -> tuple[Path, str] | None:
    """(the directory a cite's path is relative to, the installed version), None when not installed."""
    if package in TOP_LEVEL_MODULE:
        spec = importlib.util.find_spec(TOP_LEVEL_MODULE[package])  # finds, does not import
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(list(spec.submodule_search_locations)[0]).parent, importlib.metadata.version(package)
    for refs in REFS:
        for dist in importlib.metadata.distributions(name=package, path=[str(refs)]):
            return refs, dist.version
    return None


def stale(trainer: str, cite: Cite, what: str) -> str:
    return (
        f"{cite.package} {cite.version} {cite.path} L{cite.line} {what} {cite.fragment!r} ({cite.figure}): "
        f"the {trainer} log parser ({PARSER}) must follow the new format"
    )


@pytest.mark.parametrize(
    ("trainer", "cite"), ALL_CITES, ids=[f"{t}-{c.path.split('/')[-1]}-L{c.line}" for t, c in ALL_CITES]
)
def test_cite_is_on_its_line_in_the_installed_release(trainer: str, cite: Cite) -> None:
    if cite.package == "megatron-lm":
        pytest.skip(
            "Megatron-LM is not installable (the megatron-core wheel ships only megatron/core); its iteration "
            "line is checked through Megatron-Bridge's copy (test_megatron_lm_prints_what_bridge_copies)"
        )
    found = installed(cite.package)
    if found is None:
        pytest.skip(f"{cite.package} is not installed (site-packages or .venv/trainer-refs)")
    root, version = found
    assert version == cite.version, (
        f"installed {cite.package} is {version}, the {trainer} log parser cites {cite.version}: re-read "
        f"{cite.path} of {version} and update CITES in {PARSER}"
    )
    path = root / cite.path
    assert path.is_file(), stale(trainer, cite, "is gone, so is")
    lines = path.read_text().splitlines()
    line = lines[cite.line - 1] if 0 < cite.line <= len(lines) else ""
    assert cite.fragment in line, stale(trainer, cite, "no longer prints")


def test_every_trainer_cites_its_step_time() -> None:
    assert set(CITES) == set(TRAINERS)
    for trainer in TRAINERS:
        assert any("step time" in c.figure for c in CITES[trainer]), trainer
        assert any(c.figure.startswith("peak memory") for c in CITES[trainer]), trainer


def cite(trainer: str, line: int, file: str = "") -> Cite:
    found = [c for c in CITES[trainer] if c.line == line and c.path.endswith(file)]
    assert len(found) == 1, f"the tests print the {trainer} line of {file or 'the'} L{line}; CITES has {found}"
    return found[0]


def render(c: Cite, **names: object) -> str:
    """What the cited expression prints for these values (the source's f-string / str.format)."""
    value = eval(c.fragment, {}, dict(names))  # the fragment is the source expression, quotes included
    assert isinstance(value, str)
    return value


def literal(c: Cite) -> str:
    """The string a cited assignment (`NAME = 'x'`) or literal (`"x"`) holds."""
    value = ast.literal_eval(c.fragment.split(" = ", 1)[-1])
    assert isinstance(value, str)
    return value


# Megatron-LM core_v0.16.0 training.py line -> (Bridge 0.3.1 train_utils.py line, values by the
# names each source uses): the same printed text is the fragment Megatron-LM shares with Bridge.
MEGATRON_TWINS = {
    2034: (686, {"iteration": 3, "args": NS(train_iters=5)}, {"iteration": 3, "train_config": NS(train_iters=5)}),
    2040: (690, {"elapsed_time_per_iteration": 1.23456}, {"elapsed_time_per_iteration": 1.23456}),
    2044: (693, {"throughput": 401.26}, {"per_gpu_tf": 401.26}),
}


@pytest.mark.parametrize("megatron_line", sorted(MEGATRON_TWINS))
def test_megatron_lm_prints_what_bridge_copies(megatron_line: int) -> None:
    bridge_line, megatron_names, bridge_names = MEGATRON_TWINS[megatron_line]
    megatron, bridge = cite("megatron", megatron_line), cite("bridge", bridge_line)
    assert render(megatron, **megatron_names) == render(bridge, **bridge_names), (
        f"Megatron-LM {megatron.version} training.py L{megatron_line} {megatron.fragment!r} no longer prints what "
        f"Megatron-Bridge {bridge.version} train_utils.py L{bridge_line} prints: one of the two cites is wrong"
    )


# ---- log lines printed from the cited fragments -------------------------------------------------

CONTEXT = LogContext(global_batch_size=8, seq_len=2048, num_gpus=4)


def megatron_iteration_line(iteration: int, seconds: float, tflops: float, prefix: str = "") -> str:
    """training.py L2033-2083 (core_v0.16.0): the fragments the parser reads come from the cites."""
    return (
        prefix
        + " [2026-01-02 03:04:05.678901]"
        + render(cite("megatron", 2034), iteration=iteration, args=NS(train_iters=10))
        + " consumed samples: {:12d} |".format(iteration * 8)
        + render(cite("megatron", 2040), elapsed_time_per_iteration=seconds)
        + render(cite("megatron", 2044), throughput=tflops)
        + f" learning rate: {3e-4:.6E} | global batch size: {8:5d} | lm loss: {7.5:.6E} | loss scale: {1.0:.1f} |"
        + " number of skipped iterations: {:3d} | number of nan iterations: {:3d} |".format(0, 0)
    )


def megatron_memory_line(rank: int, max_allocated_bytes: float) -> str:
    """utils.py report_memory (core_v0.16.0 L279): "[Rank r] (after N iterations) memory (MB) | ..."."""
    torch = NS(cuda=NS(max_memory_allocated=lambda: max_allocated_bytes))
    string = "(after 2 iterations) memory (MB)" + f" | allocated: {1000.0:.2f}"
    string += render(cite("megatron", 279), torch=torch, mega_bytes=1024.0 * 1024.0)
    string += f" | reserved: {50000.0:.2f} | max reserved: {60000.0:.2f}"
    return "[Rank {}] {}".format(rank, string)


def test_megatron_iteration_and_memory_lines() -> None:
    text = "\n".join(
        [
            megatron_iteration_line(1, 9.87654, 40.04),  # v0.16+ logs the first iteration too
            megatron_memory_line(0, 30000.5 * 2**20),
            megatron_memory_line(3, 40960.25 * 2**20),  # the larger of two model-parallel ranks
            megatron_iteration_line(2, 1.23456, 320.44, prefix="[default7]:"),  # torchrun's rank prefix
            megatron_iteration_line(3, 1.2, 330.0),
        ]
    )
    log = parse_log("megatron", text, CONTEXT)
    assert log.steps == [(1, pytest.approx(9.8765)), (2, pytest.approx(1.2346)), (3, pytest.approx(1.2))]
    assert log.tflops_per_gpu == [40.0, 320.4, 330.0]
    assert log.peak_memory_bytes == 42_949_935_104  # 40960.25 MiB printed "40960.25", x 1024 x 1024
    assert log.memory_method == "max allocated (Megatron report_memory, MiB)"
    assert (log.tokens_per_s_per_gpu, log.failure, log.error_line) == ([], None, None)


def test_megatron_v015_memory_line_prints_unformatted_floats() -> None:
    # core_v0.14/0.15 utils.py: ' | max allocated: {}'.format(torch.cuda.max_memory_allocated() / mega_bytes)
    line = "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1.0 | max allocated: {} | reserved: 2.0 | "
    line += "max reserved: 3.0"
    log = parse_log("megatron", line.format(1234.5678901234567), CONTEXT)
    assert log.peak_memory_bytes == pytest.approx(1234.5678901234567 * 2**20)


def bridge_iteration_line(iteration: int, seconds: float, tflops: float | None) -> str:
    line = " [2026-01-02 03:04:05]" + render(cite("bridge", 686), iteration=iteration, train_config=NS(train_iters=10))
    line += " consumed samples: {:12d} |".format(iteration * 8)
    line += render(cite("bridge", 690), elapsed_time_per_iteration=seconds)
    if tflops is not None:  # only with logger.log_throughput
        line += render(cite("bridge", 693), per_gpu_tf=tflops)
    return line + f" learning rate: {3e-4:.6E} | global batch size: {8:5d} |"


def bridge_step_time_line(seconds: float, tflops: float) -> str:
    return render(cite("bridge", 657), elapsed_time_per_iteration=seconds, per_gpu_tf=tflops)


def bridge_memory_line(rank: int, max_allocated_gb: float) -> str:
    """train_utils.py L741-745, the metric names of MEMORY_KEYS (L70) renamed as L801 does."""
    max_allocated = render(cite("bridge", 801), name=literal(cite("bridge", 70)))
    memory_string = render(cite("bridge", 741), iteration=2)
    for metric, value in (("mem-allocated-gigabytes", 1.2345), (max_allocated, max_allocated_gb)):
        memory_string += render(cite("bridge", 743), metric=metric, value=value)
    get_rank = NS(get_rank=lambda: rank)
    return render(cite("bridge", 745), torch=NS(distributed=get_rank), memory_string=memory_string)


def test_bridge_prefers_the_iteration_line_and_counts_each_step_once() -> None:
    text = "\n".join(
        [
            bridge_step_time_line(2.34567, 101.27),  # the same figure in both lines; told apart here
            bridge_iteration_line(10, 2.34567, 101.23),
            bridge_memory_line(0, 12.346),
            bridge_memory_line(1, 9.8765),
            bridge_step_time_line(1.23456, 190.0),
            bridge_iteration_line(20, 1.23456, 190.0),
        ]
    )
    log = parse_log("bridge", text, CONTEXT)
    assert log.steps == [(10, pytest.approx(2.3457)), (20, pytest.approx(1.2346))]  # ms printed with one decimal
    assert log.tflops_per_gpu == [101.2, 190.0]
    assert log.peak_memory_bytes == pytest.approx(12_346_000_000)  # decimal GB (train_utils.py L796)
    assert log.memory_method == "max allocated (Megatron-Bridge report_memory, GB)"
    assert log.failure is None


def test_bridge_without_iteration_line_reads_step_time_and_its_tflops() -> None:
    text = "\n".join([bridge_step_time_line(2.34567, 101.23), bridge_step_time_line(1.2, 190.04)])
    log = parse_log("bridge", text, CONTEXT)
    assert log.steps == [(1, 2.35), (2, 1.2)]
    assert log.tflops_per_gpu == [101.2, 190.0]
    # iteration lines without log_throughput: the TFLOP/s come from the Step Time lines
    text = "\n".join([bridge_step_time_line(1.5, 150.0), bridge_iteration_line(5, 1.5, None)])
    assert parse_log("bridge", text, CONTEXT).tflops_per_gpu == [150.0]


def nemo_line(n: int, metrics: dict[str, float]) -> str:
    """progress_printer.py L150-152 with format_string (L65-73) reproduced on the cited fragments."""
    line = literal(cite("nemo", 52)) + render(cite("nemo", 150), trainer=NS(current_epoch=0), n=n, self=NS(total=10))
    for metric, val in metrics.items():
        if isinstance(val, float) and val.is_integer():
            line += render(cite("nemo", 70), metric=metric, val=int(val))
        else:
            line += render(cite("nemo", 72), metric=metric, val=val)
    return line


def test_nemo_fields_are_read_by_name_in_any_order() -> None:
    step_time = render(cite("nemo", 341), name=literal(cite("nemo", 358)))
    memory, tflops, tokens = (literal(cite("nemo", 837)), literal(cite("nemo", 163)), literal(cite("nemo", 380)))
    first = {"reduced_train_loss": 7.123456, "global_step": 1.0, step_time: 3.0, memory: 12345678901.0}
    second = {memory: 12345678901.5, tokens: 9876.54, step_time: 1.23456, tflops: 412.3456, "lr": 0.0003}
    text = "\n".join([nemo_line(1, first), "[NeMo I 2026-01-02 nemo_logging:1] noise", nemo_line(2, second)])
    assert "iteration 0/9 | reduced_train_loss: 7.123 | global_step: 1 | train_step_timing in s: 3 |" in text
    log = parse_log("nemo", text, CONTEXT)
    assert log.steps == [(0, 3.0), (1, 1.235)]
    assert log.tflops_per_gpu == [412.3]
    assert log.tokens_per_s_per_gpu == [9877.0]  # printed 9.877e+03
    assert log.peak_memory_bytes == 12_350_000_000  # printed 1.235e+10 (the int 12345678901 is smaller)
    assert log.memory_method == "max allocated (NeMo max_memory_allocated, bytes)"
    assert log.failure is None


# torchtitan/tools/utils.py L262-289 (0.3.0): Color's ANSI escapes, or NoColor's empty strings
COLOR = NS(
    red="\033[31m",
    green="\033[32m",
    yellow="\033[33m",
    blue="\033[34m",
    magenta="\033[35m",
    cyan="\033[36m",
    reset="\033[39m",
    orange="\033[38;2;180;60;0m",
    turquoise="\033[38;2;54;234;195m",
)
NO_COLOR = NS(**{name: "" for name in vars(COLOR)})
TITAN_LOGGER = "[titan] 2026-01-02 03:04:05,678 - root - INFO - "  # torchtitan/tools/logging.py L20-22


def titan_line(step: int, memory_gib: float, tps: float, tflops: float, color: NS = COLOR, mfu: str = "12.48%") -> str:
    """metrics.py L524-531: the step line, fragment by fragment."""
    names = {
        "color": color,
        "step": step,
        "global_avg_loss": 8.123456,
        "grad_norm": 1.23456,
        "device_mem_stats": NS(max_reserved_gib=memory_gib, max_reserved_pct=100 * memory_gib / 79.1),
        "tps": tps,
        "tflops": tflops,
        "mfu_str": mfu,
    }
    return TITAN_LOGGER + "".join(render(cite("torchtitan", line, "metrics.py"), **names) for line in range(524, 532))


def test_torchtitan_derives_step_time_from_tps() -> None:
    validate = f"{COLOR.yellow}validate step: {4:2}  {COLOR.green}loss: {7.0:7.4f}  "  # metrics.py L567-572
    validate += f"{COLOR.turquoise}memory: {70.0:5.2f}GiB({88.5:.2f}%)  {COLOR.blue}tps: {round(999.0):,}{COLOR.reset}"
    text = "\n".join(
        [
            titan_line(1, 12.34, 1024.4, 50.0),
            "[rank0]:" + titan_line(2, 15.5, 2048.0, 1234.5),
            "[rank1]:" + titan_line(2, 15.75, 2050.0, 1235.0),  # every rank logs: the first line of a step counts
            TITAN_LOGGER + validate,
            titan_line(3, 14.0, 12345.0, 2000.0, color=NO_COLOR, mfu="N/A"),
        ]
    )
    assert "\033[34mtps: 1,024" in text and "tps: 12,345  tflops: 2,000.00  mfu: N/A" in text
    log = parse_log("torchtitan", text, CONTEXT)
    # global_batch_size x seq_len / (tps x num_gpus) = 8 x 2048 / (tps x 4)
    assert log.steps == [(1, 16384 / (1024 * 4)), (2, 2.0), (3, pytest.approx(16384 / (12345 * 4)))]
    assert log.tokens_per_s_per_gpu == [1024.0, 2048.0, 12345.0]
    assert log.tflops_per_gpu == [50.0, 1234.5, 2000.0]
    assert log.peak_memory_bytes == 16_911_433_728  # 15.75 GiB (rank 1), x 2**30; not the validation line
    assert log.memory_method == "max reserved (torchtitan, GiB)"
    assert log.failure is None


def deepspeed_timer_line(timers: dict[str, float], rank: int = 0) -> str:
    """timer.py L141-151 (SynchronizedWallClockTimer.log) through print_dist's prefix (logging.py L108)."""
    message = literal(cite("deepspeed", 144))
    for name, elapsed_time in timers.items():
        message += render(cite("deepspeed", 148, "timer.py"), name=name, elapsed_time=elapsed_time)
    return render(cite("deepspeed", 108), my_rank=rank, message=message)


def global_timers(fwd: float, bwd: float, step: float) -> dict[str, float]:
    """engine.py L219-221's order; bwd_inner / bwd_allreduce (timer.py L16, L18) are parts of bwd."""
    fwd_name, bwd_name, step_name = (literal(cite("deepspeed", n, "timer.py")) for n in (12, 14, 20))
    return {fwd_name: fwd, bwd_name: bwd, "bwd_inner": bwd * 0.7, "bwd_allreduce": bwd * 0.2, step_name: step}


MICRO_TIMERS = {"fwd_microstep": 1.0, "bwd_microstep": 2.0, "bwd_inner_microstep": 1.0, "step_microstep": 3.0}


def deepspeed_throughput_line(global_step: int, samples_per_s: float, max_gib: float) -> str:
    template = literal(cite("deepspeed", 265)) + literal(cite("deepspeed", 266))
    message = template.format(0, global_step * 2, global_step, samples_per_s * 0.9, samples_per_s, 1.5, max_gib)
    return "[2026-01-02 03:04:05,678] [INFO] [timer.py:264:stop] " + message  # logging.py L39-40 format


def test_deepspeed_breakdown_lines_give_the_steps() -> None:
    text = "\n".join(
        [
            deepspeed_timer_line(MICRO_TIMERS),  # per micro-step: not a step
            deepspeed_timer_line(global_timers(100.0, 200.0, 50.0)),
            deepspeed_timer_line(global_timers(90.0, 180.0, 30.0)),
            deepspeed_throughput_line(3, 100.0, 2.25),  # printed just before step 3's breakdown
            deepspeed_timer_line(global_timers(80.0, 160.0, 20.0)),
            deepspeed_timer_line(global_timers(80.0, 170.0, 20.0)),
        ]
    )
    assert (
        "[Rank 0] time (ms) | fwd: 100.00 | bwd: 200.00 | bwd_inner: 140.00 | bwd_allreduce: 40.00 | step: 50.00"
        in text
    )
    log = parse_log("deepspeed", text, CONTEXT)
    assert log.steps == [(1, 0.35), (2, 0.3), (3, 0.26), (4, 0.27)]
    assert log.tokens_per_s_per_gpu == [100.0 * 2048 / 4]  # global samples/s x seq_len / num_gpus
    assert log.peak_memory_bytes == 2_415_919_104  # 2.25 GiB
    assert log.memory_method == "max allocated (DeepSpeed MaxMemAllocated, GiB)"
    assert log.tflops_per_gpu == [] and log.failure is None
    # a log that starts later is numbered from the ThroughputTimer line's global_step
    text = "\n".join([deepspeed_throughput_line(7, 50.0, 1.0), deepspeed_timer_line(global_timers(1.0, 2.0, 1.0))])
    assert parse_log("deepspeed", text + "\n" + text.splitlines()[1], CONTEXT).steps == [(7, 0.004), (8, 0.004)]


def test_deepspeed_without_breakdown_reads_samples_per_second() -> None:
    text = "\n".join([deepspeed_throughput_line(3, 100.0, 2.0), deepspeed_throughput_line(4, 80.0, 2.5)])
    log = parse_log("deepspeed", text, LogContext(global_batch_size=16, seq_len=2048, num_gpus=4))
    assert log.steps == [(3, 0.16), (4, 0.2)]  # train_batch_size / CurrSamplesPerSec
    assert log.tokens_per_s_per_gpu == [51200.0, 40960.0]
    assert log.peak_memory_bytes == 2.5 * 2**30


# ---- failures -----------------------------------------------------------------------------------

# PyTorch c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc), message fragments in order
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.06 GiB "
    "is free. Including non-PyTorch memory, this process has 78.03 GiB memory in use. Of the allocated memory "
    "75.12 GiB is allocated by PyTorch, and 1.40 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
# torch/distributed/elastic/multiprocessing/errors/__init__.py: _MSG_FORMAT_TEMPLATE, _FAILURE_FORMAT_TEMPLATE
MSG_FORMAT_TEMPLATE = """
${boarder}
${title}
${section}
Failures:
${other_failures}
${section}
Root Cause (first observed failure):
${root_failure}
${boarder}"""
FAILURE_FORMAT_TEMPLATE = """[${idx}]:
  time      : ${time}
  host      : ${hostname}
  rank      : ${rank} (local_rank: ${local_rank})
  exitcode  : ${exitcode} (pid: ${pid}) ${signal_name}
  error_file: ${error_file}
  traceback : ${message}"""
TORCHRUN_TRACEBACK = """Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 270, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: """


def child_failed(exitcode: int = 1, signal_name: str = "") -> str:
    """torchrun's summary as ChildFailedError.format_msg builds it (no @record: no worker traceback)."""
    failure = Template(FAILURE_FORMAT_TEMPLATE).substitute(
        idx=0,
        time="2026-01-02_03:04:05",
        hostname="node1",
        rank=0,
        local_rank=0,
        exitcode=exitcode,
        pid=4242,
        signal_name=signal_name,
        error_file="<N/A>",
        message="To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    )
    block = Template(MSG_FORMAT_TEMPLATE).substitute(
        boarder="=" * 60,
        title="pretrain_gpt.py FAILED",
        section="-" * 60,
        root_failure=failure,
        other_failures="  <NO_OTHER_FAILURES>",
    )
    return TORCHRUN_TRACEBACK + block


def test_torchrun_templates_are_the_installed_torch_ones() -> None:
    spec = importlib.util.find_spec("torch")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "distributed/elastic/multiprocessing/errors/__init__.py"
    found = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.endswith("TEMPLATE")
    }
    assert found == {"_FAILURE_FORMAT_TEMPLATE": FAILURE_FORMAT_TEMPLATE, "_MSG_FORMAT_TEMPLATE": MSG_FORMAT_TEMPLATE}


def traceback(exception_line: str, prefix: str = "[rank0]: ") -> str:
    lines = [
        "Traceback (most recent call last):",
        '  File "/workspace/pretrain_gpt.py", line 300, in <module>',
        "    pretrain(train_valid_test_datasets_provider, model_provider)",
        exception_line,
    ]
    return "\n".join(prefix + line for line in lines)


@pytest.mark.parametrize("trainer", TRAINERS)
@pytest.mark.parametrize("exception_type", ["torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"])
def test_out_of_memory(trainer: str, exception_type: str) -> None:
    oom_line = f"{exception_type}: {OOM_MESSAGE}"
    text = "\n".join([megatron_iteration_line(1, 2.0, 300.0), traceback(oom_line), child_failed()])
    log = parse_log(trainer, text, CONTEXT)
    assert (log.failure, log.error_line) == ("oom", "[rank0]: " + oom_line)


def test_out_of_memory_text_without_exception_type() -> None:
    log = parse_log("torchtitan", TITAN_LOGGER + "step 3 failed: " + OOM_MESSAGE, CONTEXT)
    assert (log.failure, log.error_line) == ("oom", TITAN_LOGGER + "step 3 failed: " + OOM_MESSAGE)


def test_out_of_memory_prefers_the_exception_line() -> None:
    oom_line = "torch.OutOfMemoryError: " + OOM_MESSAGE
    earlier = TITAN_LOGGER + "retrying the step after: CUDA out of memory"
    log = parse_log("torchtitan", "\n".join([earlier, traceback(oom_line), traceback(oom_line, "[rank1]: ")]), CONTEXT)
    assert (log.failure, log.error_line) == ("oom", "[rank0]: " + oom_line)


@pytest.mark.parametrize(
    "exception_line",
    [
        "RuntimeError: Rank 0, node node1, device 0, iteration 3: Unexpected result nan "
        "(message='found NaN in local forward loss calculation')",
        "AssertionError",
        "ValueError: num_layers (30) must be divisible by the pipeline size (4)",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
    ],
)
@pytest.mark.parametrize("trainer", TRAINERS)
def test_crash_names_the_exception_not_the_launcher(trainer: str, exception_line: str) -> None:
    text = "\n".join([megatron_iteration_line(1, 2.0, 300.0), traceback(exception_line), child_failed()])
    log = parse_log(trainer, text, CONTEXT)
    assert (log.failure, log.error_line) == ("crash", "[rank0]: " + exception_line)


def test_crash_without_a_worker_traceback_names_the_exit_code() -> None:
    log = parse_log("deepspeed", "[Rank 0] time (ms) | fwd: 1.00\n" + child_failed(), CONTEXT)
    assert (log.failure, log.error_line) == ("crash", "exitcode  : 1 (pid: 4242)")
    log = parse_log("megatron", child_failed(-9, " (SIGKILL)"), CONTEXT)
    assert (log.failure, log.error_line) == ("crash", "exitcode  : -9 (pid: 4242)  (SIGKILL)")


@pytest.mark.parametrize("trainer", TRAINERS)
def test_no_failure_in_a_clean_or_empty_log(trainer: str) -> None:
    clean = "\n".join([megatron_iteration_line(1, 2.0, 300.0), titan_line(1, 1.0, 100.0, 1.0), nemo_line(1, {})])
    clean += "\nValueError: printed as a message, not after a traceback\n[after training is done] datetime: 2026"
    assert parse_log(trainer, clean, CONTEXT).failure is None
    assert parse_log(trainer, "", CONTEXT) == TrainerLog([], None, None, [], [], None, None)


NASTY = [
    "iteration " + "9" * 5000 + "/1 | elapsed time per iteration (ms): 1.0 |",
    "step: " + "9" * 5000 + "  loss: 1.0  tps: 10",
    "[Rank 0] time (ms) | fwd: 1e999 | bwd: 1.00 | step: 1.00",
    "epoch=0/micro_step=1/global_step=" + "9" * 5000 + ", CurrSamplesPerSec=0, MaxMemAllocated=1.0GB",
    "Training epoch 0, iteration " + "9" * 5000 + "/9 | train_step_timing in s: 1.0",
    " iteration        1/       5 | elapsed time per iteration (ms): nan | throughput per GPU (TFLOP/s/GPU): inf |",
    "Step Time : -1.00s GPU utilization: 1e400MODEL_TFLOP/s/GPU",
    "step:  1  loss: x  memory: GiB  tps: 0  tflops: ,  mfu: N/A",
    "[Rank 0] time (ms) | fwd: nan | bwd: 1.00 | step: -5.00",
    "epoch=0/micro_step=1/global_step=1, CurrSamplesPerSec=0, MaxMemAllocated=1e309GB",
    "Training epoch 0, iteration 1/9 | train_step_timing in s: -0 | max_memory_allocated: nan",
    "Traceback (most recent call last):\n\x00\x1b[31m\ud800" + "[" * 3000 + "Error",
    "\x1b[" * 1000 + "\r\n\x0b\x0c\x1c\x85\u2028",
]


@pytest.mark.parametrize("trainer", TRAINERS)
def test_garbage_never_raises(trainer: str) -> None:
    rng = random.Random(1234)
    alphabet = "0123456789.,-+e |:=/()[]%\n\r\t\x00\x1b\ufffdGiBMBGBnaifs" + "".join(c.fragment for c in CITES[trainer])
    texts = NASTY + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400))) for _ in range(300)]
    for context in (CONTEXT, LogContext(0, 0, 0)):
        for text in texts:
            log = parse_log(trainer, text, context)
            assert isinstance(log, TrainerLog)
            assert all(seconds > 0 and seconds < float("inf") for _, seconds in log.steps), text
    for text in NASTY[:11]:
        assert parse_log(trainer, text, CONTEXT).steps == [], text


def two_second_step(trainer: str) -> str:
    """A log line of step 1 taking 2 s."""
    return {
        "megatron": lambda: megatron_iteration_line(1, 2.0, 300.0),
        "bridge": lambda: bridge_iteration_line(1, 2.0, 300.0),
        "nemo": lambda: nemo_line(2, {"train_step_timing in s": 2.0}),
        "torchtitan": lambda: titan_line(1, 1.0, 2048.0, 1.0),  # 8 x 2048 / (2048 x 4)
        "deepspeed": lambda: deepspeed_timer_line(global_timers(500.0, 1000.0, 500.0)),
    }[trainer]()


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_bad_line_does_not_lose_the_good_ones(trainer: str) -> None:
    text = "\n".join([two_second_step(trainer), *NASTY[:11]])
    assert parse_log(trainer, text, CONTEXT).steps == [(1, 2.0)]


def test_unknown_trainer_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown trainer 'megatron-lm'"):
        parse_log("megatron-lm", "", CONTEXT)


# ---- step_summary --------------------------------------------------------------------------------


def test_step_summary_drops_warmup_and_takes_the_median() -> None:
    log = TrainerLog(steps=[(1, 9.0), (2, 1.0), (3, 3.0), (4, 2.0)])
    assert step_summary(log, 1) == {
        "step_time_s": 2.0,  # median of 1, 3, 2
        "step_times_s": [1.0, 3.0, 2.0],
        "mean_step_time_s": 2.0,
        "step_time_spread": 1.0,  # (3 - 1) / 2
        "warmup_dropped": 1,
    }
    summary = step_summary(log, 0)
    assert summary is not None
    assert (summary["step_time_s"], summary["mean_step_time_s"], summary["warmup_dropped"]) == (2.5, 3.75, 0)
    assert summary["step_time_spread"] == pytest.approx((9.0 - 1.0) / 2.5)
    assert step_summary(log, 3) == {
        "step_time_s": 2.0,
        "step_times_s": [2.0],
        "mean_step_time_s": 2.0,
        "step_time_spread": 0.0,
        "warmup_dropped": 3,
    }
    assert step_summary(log, -1) == step_summary(log, 0)
    assert step_summary(log, 4) is None and step_summary(log, 10) is None and step_summary(TrainerLog(), 0) is None


def test_step_summary_of_a_parsed_log() -> None:
    text = "\n".join(megatron_iteration_line(i, s, 300.0) for i, s in enumerate([30.0, 1.5, 1.1, 1.3, 1.2], 1))
    summary = step_summary(parse_log("megatron", text, CONTEXT), warmup=1)
    assert summary is not None
    assert summary["step_time_s"] == pytest.approx(1.25) and summary["warmup_dropped"] == 1
