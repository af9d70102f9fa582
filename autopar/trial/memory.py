"""Peak memory of this process over a window: CUDA allocator peak on GPU, VmHWM on CPU.

Sources: torch.cuda.max_memory_allocated; Linux /proc/self/status VmHWM, reset by writing 5 to
/proc/self/clear_refs (proc(5), Linux >= 4.0).
On CPU the figure is the whole process's resident peak (torch runtime included); `delta` is the
growth over the resident size at the window's start. With AUTOPAR_TENSOR_MEMORY=1 (worker
--tensor-memory) the CPU figure is instead the peak of live tensor bytes, from
a dispatch-mode storage tracker like torch.distributed._tools.MemTracker's (a TorchDispatchMode
that follows tensor storages; MemTracker itself refuses modules called more than once per window, i.e. microbatches),
counting every tensor storage alive at the window's start (found through the garbage collector,
after a collection: an earlier trial's model left in reference cycles is not this trial's) and
every one an op creates after, each at its current size (storages resized in place are followed)
and freed when its storage dies (weakref.finalize).
"""

from __future__ import annotations

import gc
import os
import re
import weakref
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary


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
    _tracker: TensorPeak | None = None

    def _tensor_mode(self) -> bool:
        return self.device.type == "cpu" and os.environ.get("AUTOPAR_TENSOR_MEMORY") == "1"

    def reset(self) -> None:
        # garbage in reference cycles (a previous trial's model, optimizer, DTensors) is still
        # found by gc.get_objects and still held by the CUDA allocator until collected
        gc.collect()
        if self._tensor_mode():
            if self._tracker is not None:
                self._tracker.__exit__(None, None, None)
            self._tracker = TensorPeak([o for o in gc.get_objects() if _is_tensor(o)])
            self._tracker.__enter__()
            return
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
        if self._tracker is not None:
            mt, self._tracker = self._tracker, None
            mt.__exit__(None, None, None)
            return mt.peak, mt.peak - mt.start, "tensor-peak"
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            return peak, peak - self._start, "cuda.max_memory_allocated"
        hwm = (_status_kib("VmHWM") or 0) * 1024
        return hwm, max(0, hwm - self._start), "VmHWM"


class TensorPeak(TorchDispatchMode):
    """Live tensor-storage bytes and their peak while active (storages counted once, views free).

    A storage's size is followed through `UntypedStorage.resize_`, which no dispatched op sees:
    FSDP2 frees and re-allocates its unsharded parameters that way (`free_storage` /
    `alloc_storage` in torch/distributed/fsdp/_fully_shard/_fsdp_param.py), and MemTracker
    patches it for the same reason (torch/distributed/_tools/mem_tracker.py `_track_resize`)."""

    def __init__(self, existing: list[torch.Tensor]) -> None:
        super().__init__()
        self.live = WeakIdKeyDictionary()  # storage -> [its current bytes]
        self.current = self.peak = 0
        self.limit = int(os.environ.get("AUTOPAR_MEMORY_LIMIT_BYTES") or 0)  # worker --memory-limit-mib
        for t in existing:
            self._add(t)
        self.start = self.current
        self._resize = None

    def __enter__(self):
        self._resize = orig = torch.UntypedStorage.resize_
        tracker = self

        def resize_(st, size):
            out = orig(st, size)
            tracker._resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        if self._resize is not None:
            torch.UntypedStorage.resize_ = self._resize
            self._resize = None
        return super().__exit__(*exc)

    @staticmethod
    def _free(cell: list) -> None:
        cell[1].current -= cell[0]

    def _grow(self, delta: int) -> None:
        self.current += delta
        self.peak = max(self.peak, self.current)
        if self.limit and self.current > self.limit:
            raise torch.OutOfMemoryError(
                f"CPU out of memory: {self.current} tensor bytes live, over the emulated "
                f"capacity of {self.limit} bytes (--memory-limit-mib)"
            )

    def _track(self, st) -> None:
        cell = [st.nbytes(), self]
        self.live[st] = cell
        weakref.finalize(st, self._free, cell)
        self._grow(cell[0])

    def _resized(self, st) -> None:
        cell = self.live.get(st)
        if cell is None:
            self._track(st)
            return
        delta, cell[0] = st.nbytes() - cell[0], st.nbytes()
        self._grow(delta)

    def _add(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        t = getattr(t, "_local_tensor", t)  # DTensor: this rank's shard
        if t.device.type == "meta" or t.is_sparse:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st not in self.live:
            self._track(st)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            self._add(t)
        return out


def _is_tensor(o) -> bool:
    return issubclass(type(o), torch.Tensor)  # type(): lazy module proxies warn or raise on isinstance
