"""Peak memory of this process over a window: CUDA allocator peak on GPU, VmHWM on CPU.

Sources: torch.cuda.max_memory_allocated; Linux /proc/self/status VmHWM, reset by writing 5 to
/proc/self/clear_refs (proc(5)), as the project reference (cpu-distributed.md section 6) measured.
On CPU the figure is the whole process's resident peak (torch runtime included); `delta` is the
growth over the resident size at the window's start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


@dataclass
class PeakMemory:
    """Start with `reset()`, read with `peak()` -> (peak bytes, growth over the start, method)."""

    device: torch.device
    _start: int = 0

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass  # not Linux or not allowed: the peak is then the lifetime peak
        self._start = (_status_kib("VmRSS") or 0) * 1024

    def peak(self) -> tuple[int, int, str]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            return peak, peak - self._start, "cuda.max_memory_allocated"
        hwm = (_status_kib("VmHWM") or 0) * 1024
        return hwm, max(0, hwm - self._start), "VmHWM"
