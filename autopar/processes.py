"""One rule for naming a process across pid reuse: its pid and its start time (the kernel hands a
freed pid to the next process, and pid_max is often 32768, so a busy host reuses pids in minutes);
and what this process may use of the machine: its cores and RAM (the measured stage's resource
checks, a what-if's workers)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def start_time(pid: int | str) -> str | None:
    """The process's start time in clock ticks since boot (proc(5): /proc/<pid>/stat field 22), or
    None where the process or /proc is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the fields from the third on follow the command's ')'
    return fields[19] if len(fields) > 19 else None


def ram_bytes() -> tuple[float, float]:
    """(total, available) RAM in bytes: /proc/meminfo, lowered by a cgroup v2 memory limit (8 GiB
    total, half of it free, where neither can be read)."""
    info: dict[str, float] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = float(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = info.get("MemTotal", 8.0 * 2**30)
    avail = info.get("MemAvailable", total / 2)
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = float(Path("/sys/fs/cgroup/memory.current").read_text())
            total, avail = min(total, float(limit)), min(avail, max(0.0, float(limit) - used))
    except (OSError, ValueError):
        pass
    return total, avail


def usable_cores() -> int:
    """Cores this process may use: the affinity mask, lowered by a cgroup v2 CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)
