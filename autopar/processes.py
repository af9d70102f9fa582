"""One rule for naming a process across pid reuse: its pid and its start time (the kernel hands a
freed pid to the next process, and pid_max is often 32768, so a busy host reuses pids in minutes)."""

from __future__ import annotations

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
