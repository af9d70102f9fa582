"""What this machine can run trials on: GPUs (count, memory) or CPU cores and RAM; imports no torch.

`detect()` reads `nvidia-smi` (GPUs) and /proc, cgroups and the CPU affinity mask (cores, RAM), so
the search process can check a trial before anything starts. `local_limits()` turns that into the
limits a local trial must respect:

- **GPUs**: ranks at most the GPU count (or fewer, `--max-local-ranks`); memory per rank: the GPU's
  memory less `GPU_MARGIN`.
- **CPU**: ranks at most the cores (`--max-local-ranks`, which may oversubscribe them); memory in
  all: `CPU_MEMORY_SHARE` of the available RAM, at most `CPU_MEMORY_CAP_BYTES`; each rank also
  pays `CPU_RANK_RUNTIME_BYTES` for the torch runtime.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from autopar.errors import InputError
from autopar.processes import ram_bytes, usable_cores
from autopar.spec.hardware import GIB

#: fraction of a GPU's memory left to the CUDA context and the allocator's fragmentation
GPU_MARGIN = 0.08
#: share of the available RAM all CPU ranks of a trial may use together (the rest: the search
#: process, the OS, other work)
CPU_MEMORY_SHARE = 1 / 3
#: most RAM all CPU ranks of a trial may use together, whatever the machine
CPU_MEMORY_CAP_BYTES = 8 * GIB
#: resident memory of one CPU rank before its model: Python, torch, gloo (measured: 0.35-0.45 GiB)
CPU_RANK_RUNTIME_BYTES = 0.5 * GIB


@dataclass(frozen=True)
class Machine:
    """The hardware a local trial would run on."""

    cpu_cores: int
    ram_total_bytes: float
    ram_available_bytes: float
    gpus: int = 0
    gpu_memory_bytes: float = 0.0  # per GPU (the smallest, if they differ)
    gpu_name: str = ""

    @property
    def kind(self) -> str:
        return "cuda" if self.gpus else "cpu"

    def describe(self) -> str:
        ram = f"{self.ram_available_bytes / GIB:.1f} GiB RAM free"
        if self.gpus:
            return f"{self.gpus} x {self.gpu_name or 'GPU'} ({self.gpu_memory_bytes / GIB:.0f} GiB), {ram}"
        return f"{self.cpu_cores} CPU core{'s' * (self.cpu_cores != 1)}, {ram}"


@dataclass(frozen=True)
class LocalLimits:
    """What one local trial may use: ranks, memory, and the device its ranks run on."""

    device: str  # "cpu" | "cuda"
    max_ranks: int
    memory_bytes_per_device: float  # GPU: per rank; CPU: all ranks together (before the runtime)
    machine: Machine
    why: str  # where max_ranks comes from, for messages

    def memory_fits(self, ranks: int, peak_bytes_per_rank: float) -> bool:
        """Whether `ranks` ranks of a trial whose busiest rank needs `peak_bytes_per_rank` fit."""
        if self.device == "cuda":
            return peak_bytes_per_rank <= self.memory_bytes_per_device
        return ranks * (peak_bytes_per_rank + CPU_RANK_RUNTIME_BYTES) <= self.memory_bytes_per_device

    def memory_text(self, ranks: int) -> str:
        """The memory one rank may use, in words."""
        if self.device == "cuda":
            return f"{self.memory_bytes_per_device / GIB:.1f} GiB per GPU"
        per = max(0.0, self.memory_bytes_per_device / max(1, ranks) - CPU_RANK_RUNTIME_BYTES)
        return (
            f"{per / GIB:.2f} GiB per rank ({self.memory_bytes_per_device / GIB:.1f} GiB for {ranks} rank"
            f"{'s' * (ranks != 1)}, {CPU_RANK_RUNTIME_BYTES / GIB:.1f} GiB of runtime each)"
        )


def detect(use_gpus: bool = True) -> Machine:
    """This machine's cores, RAM and (when `use_gpus` and nvidia-smi answers) GPUs."""
    total, avail = ram_bytes()
    gpus, mem, name = _gpus() if use_gpus else (0, 0.0, "")
    return Machine(
        cpu_cores=usable_cores(),
        ram_total_bytes=total,
        ram_available_bytes=avail,
        gpus=gpus,
        gpu_memory_bytes=mem,
        gpu_name=name,
    )


def local_limits(machine: Machine, device: str, max_local_ranks: int | None = None) -> LocalLimits:
    """The limits of a local trial on `device` ("cpu" or "cuda"); `max_local_ranks` lowers the
    rank count on GPUs and sets it on the CPU (default: the cores). Bad values are InputErrors."""
    if max_local_ranks is not None and max_local_ranks < 1:
        raise InputError(
            f"--max-local-ranks {max_local_ranks} must be at least 1; give the most ranks a local trial "
            f"may start, e.g. 2"
        )
    if device == "cuda":
        if not machine.gpus:
            raise InputError(
                "GPU trials need a GPU on this machine and none answered nvidia-smi; run them on the "
                "cluster with --launcher slurm, or trial the CPU profile with --gpu local"
            )
        if max_local_ranks is not None and max_local_ranks > machine.gpus:
            raise InputError(
                f"--max-local-ranks {max_local_ranks} exceeds the {machine.gpus} GPU(s) of this machine; "
                f"use at most {machine.gpus}, or --launcher slurm for more"
            )
        ranks = max_local_ranks or machine.gpus
        why = f"{machine.gpus} GPU{'s' * (machine.gpus != 1)}" + (
            f", --max-local-ranks {max_local_ranks}" if max_local_ranks else ""
        )
        return LocalLimits(
            device="cuda",
            max_ranks=ranks,
            memory_bytes_per_device=machine.gpu_memory_bytes * (1 - GPU_MARGIN),
            machine=machine,
            why=why,
        )
    ranks = max_local_ranks or machine.cpu_cores
    why = (
        f"--max-local-ranks {max_local_ranks}"
        if max_local_ranks
        else f"{machine.cpu_cores} CPU core{'s' * (machine.cpu_cores != 1)}; --max-local-ranks"
    )
    budget = min(CPU_MEMORY_SHARE * machine.ram_available_bytes, CPU_MEMORY_CAP_BYTES)
    return LocalLimits(device="cpu", max_ranks=ranks, memory_bytes_per_device=budget, machine=machine, why=why)


def _gpus() -> tuple[int, float, str]:
    """(count, smallest memory in bytes, name) of the GPUs nvidia-smi lists; (0, 0, "") without."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0, 0.0, ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,memory.total,name", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0, 0.0, ""
    if out.returncode != 0:
        return 0, 0.0, ""
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3 and parts[1].replace(".", "", 1).isdigit():
            rows.append((parts[0], float(parts[1]) * 2**20, parts[2]))
    if visible is not None:
        keep = {v.strip() for v in visible.split(",") if v.strip()}
        rows = [r for r in rows if r[0] in keep] if all(k.isdigit() for k in keep) else rows[: len(keep)]
    if not rows:
        return 0, 0.0, ""
    return len(rows), min(r[1] for r in rows), rows[0][2]
