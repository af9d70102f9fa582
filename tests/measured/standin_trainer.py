"""A stand-in for a real trainer under torchrun: it prints the per-step lines the trainer's own
logging code prints (the format strings below are copied from the releases named), and raises the
errors a real run raises, so the measured stage's whole own-trainer path (export, launch script,
torchrun, log parsing, calibration) runs end to end on a machine without the trainer or a GPU.

Which trainer: `main(trainer)`, called by the small wrappers the tests put where the trainer would
live ($MEGATRON_LM/pretrain_gpt.py, $MEGATRON_BRIDGE/scripts/training/run_recipe.py, a `torchtitan`
package whose `train` module this is, NeMo's `nemo_run.run`). What each run does: STANDIN_PLAN, a
comma list of ok | oom | crash for the 1st, 2nd, ... distinct launch (a launch is its working
directory), counted in STANDIN_STATE. Step times come from the plan's words (micro-batch size,
TP size), so plans differ; a step sleeps STANDIN_SLEEP seconds (default none).
"""

from __future__ import annotations

import datetime
import os
import re
import sys
import time
from pathlib import Path


class OutOfMemoryError(RuntimeError):
    """Named as torch's (torch.OutOfMemoryError): its traceback line is what a real OOM prints."""


#: PyTorch's allocator message (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc)
OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
    "1.02 GiB is free. Including non-PyTorch memory, this process has 78.07 GiB memory in use. Of the "
    "allocated memory 75.50 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def _launch_index() -> int:
    """The index of this launch among the distinct working directories seen (rank 0 counts)."""
    state = Path(os.environ["STANDIN_STATE"])
    state.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    for i in range(1000):
        path = state / str(i)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if path.read_text() == here:
                return i
            continue
        with os.fdopen(fd, "w") as f:
            f.write(here)
        return i
    raise RuntimeError("too many launches")


def _behaviour() -> str:
    """What this launch does (rank 0 decides and counts the launch; the other ranks run plainly)."""
    if int(os.environ.get("RANK", "0")) != 0 or "STANDIN_STATE" not in os.environ:
        return "ok"
    i = _launch_index()
    items = os.environ.get("STANDIN_PLAN", "").split(",")
    return items[i] if i < len(items) and items[i] else "ok"


def _haystack() -> str:
    """argv and the export's files: where the plan's settings are."""
    text = " ".join(sys.argv)
    for p in Path.cwd().glob("*"):
        if p.is_file() and p.suffix in (".py", ".txt", ".sh", ".json"):
            text += "\n" + p.read_text(errors="replace")
    return text


def _number(pattern: str, text: str, default: int = 1) -> int:
    m = re.search(pattern, text)
    return int(next(g for g in m.groups() if g)) if m else default


def _step_seconds(text: str) -> float:
    """A step time from the plan: more micro-batches per step cost more, TP and CP a little, and
    recompute (tests/measured/test_own_trainer.py derives the same from the plan)."""
    m = _number(r"micro[-_]batch[-_]size['\"]?[ :=]+(\d+)|local_batch_size': (\d+)", text)
    t = _number(r"tensor[-_]model[-_]parallel[-_]size['\"]?[ :=]+(\d+)|tensor_parallel_degree': (\d+)", text)
    c = _number(r"context[-_]parallel[-_](?:size|degree)['\"]?[ :=]+(\d+)", text)
    recompute = re.search(
        r"recompute[-_]granularity['\"]?[ :=]+'?(?:selective|full)|ACTIVATION_CHECKPOINT = '[sf]", text
    )
    return 0.2 + 0.05 / m + 0.03 * t + 0.01 * c + (0.02 if recompute else 0.0)


def _steps(text: str) -> int:
    for pattern in (r"--train-iters (\d+)", r"train\.train_iters=(\d+)", r"--training\.steps (\d+)"):
        m = re.search(pattern, text)
        if m:
            return int(m.group(1))
    m = re.search(r"'trainer\.max_steps': (\d+)", text)
    return int(m.group(1)) if m else 3


def _gbs(text: str) -> int:
    m = re.search(r"global[-_]batch[-_]size['\"]?[ :=]+(\d+)", text)
    return int(m.group(1)) if m else 8


def _fail(behaviour: str, step: int) -> None:
    if behaviour == "oom" and step == 2:
        raise OutOfMemoryError(OOM_TEXT)
    if behaviour == "crash" and step == 2:
        raise RuntimeError("stand-in trainer: an assertion in the trainer's own code failed")


def megatron(text: str, behaviour: str, bridge: bool = False) -> None:
    """Megatron-LM core_v0.16.0 training.py training_log (L2033-2083) and utils.py report_memory
    (L279); Megatron-Bridge 0.3.1 train_utils.py training_log (L656-746)."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    k, gbs, step = _steps(text), _gbs(text), _step_seconds(text)
    for it in range(1, k + 1):
        _fail(behaviour, it)
        time.sleep(float(os.environ.get("STANDIN_SLEEP", "0")))  # a step that takes wall time, when asked
        ms = (step * (3 if it == 1 else 1)) * 1000.0
        if bridge and rank == 0:  # print_rank_0
            print(f"Step Time : {ms / 1000:.2f}s GPU utilization: {123.4:.1f}MODEL_TFLOP/s/GPU", flush=True)
        if rank == world - 1:  # print_rank_last
            fmt = "%Y-%m-%d %H:%M:%S" if bridge else "%Y-%m-%d %H:%M:%S.%f"
            s = f" [{datetime.datetime.now().strftime(fmt)}]"
            s += " iteration {:8d}/{:8d} |".format(it, k)
            s += " consumed samples: {:12d} |".format(it * gbs)
            s += " elapsed time per iteration (ms): {:.1f} |".format(ms)
            s += f" throughput per GPU (TFLOP/s/GPU): {123.4:.1f} |"
            s += f" learning rate: {3e-4:.6E} |"
            s += f" global batch size: {gbs:5d} |"
            s += " {}: {:.6E} |".format("lm loss", 10.5)
            s += f" loss scale: {1.0:.1f} |"
            s += f" grad norm: {1.234:.3f} |"
            s += " number of skipped iterations: {:3d} |".format(0)
            s += " number of nan iterations: {:3d} |".format(0)
            print(s, flush=True)
        if it == 1 and rank in (0, world - 1):
            if bridge:
                mem = f"(after {it} iterations) memory (GB)" + f" | mem-max-allocated-gigabytes: {1.2345}"
                mem += f" | mem-max-reserved-gigabytes: {1.5}"
            else:
                mem = f"(after {it} iterations) memory (MB)" + f" | allocated: {800.0:.2f}"
                mem += f" | max allocated: {1177.34:.2f} | reserved: {1400.0:.2f} | max reserved: {1500.0:.2f}"
            print("[Rank {}] {}".format(rank, mem), flush=True)


def nemo(recipe, behaviour: str) -> None:
    """NeMo 2.7.3 ProgressPrinter (progress_printer.py L56-73, L150-152), TimingCallback's
    'train_step_timing in s', NEMO_LOG_MEMORY_USAGE's max_memory_allocated (bytes)."""
    k = recipe.trainer.max_steps
    tp = recipe.trainer.strategy.tensor_model_parallel_size
    mbs = recipe.data.micro_batch_size
    cp = recipe.trainer.strategy.context_parallel_size
    granularity = recipe.model.config.recompute_granularity
    step = _step_seconds(
        f"micro_batch_size: {mbs} tensor_model_parallel_size: {tp} context_parallel_size: {cp}"
        + (f" recompute_granularity: {granularity}" if isinstance(granularity, str) else "")
    )
    if int(os.environ.get("RANK", "0")) != 0:
        return
    for n in range(1, k + 1):
        _fail(behaviour, n)
        metrics = {"reduced_train_loss": 10.5, "train_step_timing in s": step * (3 if n == 1 else 1)}
        if os.environ.get("NEMO_LOG_MEMORY_USAGE") == "1":
            metrics |= {"max_memory_reserved": 1.5e9, "max_memory_allocated": 1234500000.0}
        s = "Training" + f" epoch 0, iteration {n - 1}/{k - 1}"
        for metric, val in metrics.items():
            s += f" | {metric}: {val}" if isinstance(val, float) and val.is_integer() else f" | {metric}: {val:.4}"
        print(s)


def torchtitan(text: str, behaviour: str) -> None:
    """torchtitan 0.3.0 components/metrics.py L527-536 (colours off), the logger format of
    tools/logging.py."""
    k, gbs, step = _steps(text), _gbs(text), _step_seconds(text)
    n = int(os.environ.get("WORLD_SIZE", "1"))
    seq = int(re.search(r"'seq_len': (\d+)", text).group(1))
    for it in range(1, k + 1):
        _fail(behaviour, it)
        t = step * (3 if it == 1 else 1)
        tps = gbs * seq / (n * t)
        now = time.strftime("%Y-%m-%d %H:%M:%S")
        print(
            f"[titan] {now},000 - root - INFO - "
            f"step: {it:2}  loss: {10.5:8.5f}  grad_norm: {1.2:7.4f}  memory: {1.25:5.2f}GiB({1.58:.2f}%)  "
            f"tps: {round(tps):,}  tflops: {1.5:,.2f}  mfu: {0.15:.2f}%",
            flush=True,
        )


def main(trainer: str, recipe=None) -> None:
    behaviour = _behaviour()
    text = _haystack()
    if trainer in ("megatron", "bridge"):
        megatron(text, behaviour, bridge=trainer == "bridge")
    elif trainer == "torchtitan":
        torchtitan(text, behaviour)
    elif trainer == "nemo":
        nemo(recipe, behaviour)
    else:
        raise SystemExit(f"unknown stand-in trainer {trainer}")
