"""torchrun entry: `python -m autopar.trial.worker --spec run.json --out result.json
[--tensor-memory] [--memory-limit-mib N] [--fault raise|hang|raise-rank1|slow|slow-exit] [--progress FILE]`.

A watchdog thread (autopar.measured.hygiene.start_watchdog), started before torch is imported, ends
the worker when torchrun or the launching autopar process is gone, so a SIGKILLed search leaves no
worker behind.

Runs every trial of the run file in order on all ranks (autopar.measured.config for the schema) and
has rank 0 write the result JSON after each trial (atomically: write, then rename), so a crash
keeps what was done. The document: {"env": ..., "trials": [...], "complete": bool}; a trial that
raised is recorded with status "error" and ends the run (the other ranks may be inside a
collective with it, so the run cannot go on safely).

With --progress, rank 0 also appends one JSON line per step as it ends (the slowest rank's time,
as the result reports it) and flushes it, so the launcher can show or prune a trial mid-run:
{"trial": index in the run file, "name", "step", "time_s", "timed": counted in the statistics}.

Ending: gloo sometimes aborts at process exit after the work is done ("terminate called without
an active exception", libstdc++'s std::terminate message, while the gloo process group is
destroyed at interpreter shutdown). So the worker writes its result first, then waits at a
barrier, flushes and leaves with os._exit, skipping the interpreter and process-group teardown
where the abort happens. The launcher still treats "result complete, then a non-zero exit" as
success-with-teardown-abort.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autopar.atomic import write_atomic
from autopar.figures import PEAK_MEMORY_BYTES, TOKENS_PER_S
from autopar.json_out import dumps

if __name__ == "__main__":  # before torch's import (seconds): a worker whose launcher dies meanwhile ends too
    from autopar.measured.hygiene import start_watchdog

    start_watchdog()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from autopar.measured.config import TrialConfig, load_run  # noqa: E402
from autopar.trial.mesh import Runtime, detect_runtime, init_distributed  # noqa: E402
from autopar.trial.runner import run_trial  # noqa: E402


def environment(runtime: Runtime) -> dict:
    """Versions and hardware of this run."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(runtime.device),
        "backend": runtime.backend,
        "world_size": dist.get_world_size(),
        "hostname": platform.node(),
        "cpu_threads": torch.get_num_threads(),
    }
    if runtime.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(runtime.device)
        env["cuda"] = torch.version.cuda
    return env


def summary_line(result: dict) -> str:
    """One line per trial on stdout: step time, throughput, loss, peak memory, bytes per axis."""
    peak = max(r[PEAK_MEMORY_BYTES] for r in result["ranks"]) / 2**20
    comm: dict[str, float] = {}
    for r in result["ranks"]:
        for axis, n in ((r.get("comm") or {}).get("bytes_by_axis") or {}).items():
            comm[axis] = max(comm.get(axis, 0), n)
    axes = " ".join(f"{a}={n / 2**20:.2f}MiB" for a, n in sorted(comm.items())) or "-"
    line = (
        f"[autopar.trial] {result['name']}: {result['mean_step_time_s']:.3f} s/step, "
        f"{result[TOKENS_PER_S]:.0f} tokens/s, loss {result['final_loss']:.4f}, "
        f"peak {peak:.0f} MiB/rank, bytes/step/rank {axes}"
    )
    if "parity" in result:
        p = result["parity"]
        line += f", parity loss {p['loss_max_rel']:.1e} params {p['param_max_rel']:.1e}"
    return line


def write_json(path: Path, doc: dict) -> None:
    write_atomic(path, dumps(doc, indent=1))


def limit_memory(mib: float) -> None:
    """Emulate a device-memory capacity on CPU: live tensor bytes of a rank beyond `mib` MiB raise
    torch.OutOfMemoryError, as the CUDA caching allocator does past HBM (autopar.trial.memory's
    tensor tracker, on for every trial). A process limit (RLIMIT_DATA) was tried first: it also
    fails thread-stack allocations, which abort the process instead of raising."""
    os.environ["AUTOPAR_MEMORY_LIMIT_BYTES"] = str(int(mib * 2**20))
    os.environ["AUTOPAR_TENSOR_MEMORY_ALL"] = "1"


def inject_fault(fault: str | None) -> None:
    """Test hooks for the failure paths: `raise` (a trial raises on every rank), `hang` (every rank
    sleeps past any timeout), `raise-rank1` (only rank 1 raises; its peers block); `slow` is a
    plan SLOW_STEP_S slower per step (run_trial's step delay), for the pruner's tests; `slow-exit`
    waits SLOW_EXIT_S after the complete result is written, before the teardown (the process-hygiene
    tests signal autopar then)."""
    if not fault or fault in ("slow", "slow-exit"):
        return
    if fault == "hang":
        time.sleep(10**6)
    if fault == "raise" or (fault == "raise-rank1" and dist.get_rank() == 1):
        raise RuntimeError(f"injected fault '{fault}'")


#: seconds `--fault slow` adds to every step (well above a tiny CPU trial's ~0.05-0.3 s step)
SLOW_STEP_S = 1.0
#: seconds `--fault slow-exit` waits between the complete result and the teardown
SLOW_EXIT_S = 30.0
#: a fault for every launch of this environment (tests of the whole CLI): one of FAULTS
FAULT_ENV = "AUTOPAR_WORKER_FAULT"
FAULTS = ("raise", "hang", "raise-rank1", "slow", "slow-exit")


class ProgressWriter:
    """Rank 0's step records, one flushed JSON line each (the file is opened in append mode, so a
    reader polling it sees whole lines or a partial last one)."""

    def __init__(self, path: Path, trial: int, name: str) -> None:
        self.path, self.trial, self.name = path, trial, name

    def __call__(self, step: int, time_s: float, timed: bool) -> None:
        line = dumps({"trial": self.trial, "name": self.name, "step": step, "time_s": time_s, "timed": timed})
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()


def run(
    trials: list[TrialConfig],
    out: Path,
    memory_limit_mib: float | None = None,
    fault: str | None = None,
    progress: Path | None = None,
) -> int:
    """All trials on this rank; rank 0 writes `out` (and the step records to `progress`). Returns
    the exit code."""
    runtime = detect_runtime(trials[0].device if trials else "auto")
    init_distributed(runtime)
    rank = dist.get_rank()
    if memory_limit_mib is not None:
        limit_memory(memory_limit_mib)
    doc: dict[str, Any] = {"env": environment(runtime), "trials": [], "complete": False}
    code = 0
    for i, cfg in enumerate(trials):
        t0 = time.perf_counter()
        if cfg.extra.get("tensor_memory") or os.environ.get("AUTOPAR_TENSOR_MEMORY_ALL") == "1":
            os.environ["AUTOPAR_TENSOR_MEMORY"] = "1"
        else:
            os.environ.pop("AUTOPAR_TENSOR_MEMORY", None)
        try:
            inject_fault(fault)
            on_step = ProgressWriter(progress, i, cfg.label) if progress is not None else None
            result = run_trial(cfg, runtime, on_step=on_step, step_delay_s=SLOW_STEP_S if fault == "slow" else 0.0)
        except Exception as e:  # noqa: BLE001 - recorded, then the run ends
            print(f"[rank {rank}] trial {cfg.label} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            if rank == 0:
                doc["trials"].append(
                    {"name": cfg.label, "status": "error", "error": f"{type(e).__name__}: {e}", "config": cfg.to_dict()}
                )
                write_json(out, doc)
            code = 1
            break
        if rank == 0:
            assert result is not None  # run_trial returns the result dict on rank 0
            result["wall_s"] = time.perf_counter() - t0
            doc["trials"].append(result)
            write_json(out, doc)
            print(summary_line(result), flush=True)
    if code:
        sys.stderr.flush()
        os._exit(code)  # peers may be blocked in a collective: do not wait for them
    if rank == 0:
        doc["complete"] = True
        write_json(out, doc)
    if fault == "slow-exit":
        time.sleep(SLOW_EXIT_S)
    dist.barrier()
    return 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m autopar.trial.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, type=Path, help='run file (one trial or {"trials": [...]})')
    ap.add_argument("--out", required=True, type=Path, help="result JSON, written by rank 0")
    ap.add_argument(
        "--memory-limit-mib",
        type=float,
        default=None,
        help="emulated memory capacity per rank (live tensor bytes): past it, OutOfMemoryError",
    )
    ap.add_argument(
        "--fault",
        choices=FAULTS,
        default=os.environ.get(FAULT_ENV) or None,
        help=f"inject a failure (tests; default ${FAULT_ENV}); slow = {SLOW_STEP_S:g} s more per step, "
        f"slow-exit = {SLOW_EXIT_S:g} s between the complete result and the exit",
    )
    ap.add_argument(
        "--progress",
        type=Path,
        default=None,
        help="rank 0 appends one JSON line per step to this file as it ends (live pruning)",
    )
    ap.add_argument(
        "--tensor-memory",
        action="store_true",
        help="peak memory as live tensor bytes (autopar.trial.memory) instead of VmHWM on CPU, for every "
        "trial (a trial asks for it alone with extra: {tensor_memory: true})",
    )
    args = ap.parse_args(argv)
    if args.tensor_memory:
        os.environ["AUTOPAR_TENSOR_MEMORY_ALL"] = "1"
    trials = load_run(json.loads(args.spec.read_text()))
    code = run(trials, args.out, args.memory_limit_mib, args.fault, args.progress)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip process-group teardown, where gloo sometimes aborts


if __name__ == "__main__":
    main()
