"""Bytes every collective hands over, per mesh axis: a TorchDispatchMode over the c10d ops.

Source: a TorchDispatchMode over the c10d ops (torch.utils._python_dispatch, the CommBytesMode pattern),
which sees DTensor/funcol collectives, FSDP2's and DDP's c10d calls, and P2P send/recv, unlike
CommDebugMode. The count follows the cost model's convention (autopar/cost/comm.py): the payload of
a call is this process's input buffer (an all-gather's 1/n shard, a reduce-scatter's full buffer),
and for P2P only sends count (a receive is the peer's send). Each call is attributed to the mesh
axis whose ranks its process group spans, looked up first by ("name", group name), then by (kind,
ranks) with kind "p2p" (send), "all_to_all" or "collective", then by ranks alone (one rank set can
serve several axes: with dp = 1 the dp x cp gradient group is the cp ring's group; an EP group can
be the dp group; autopar.trial.mesh.axis_ranks); a group of no axis lands in "other".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_NAMESPACES = {"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"}
#: ops whose input buffer is argument 1 (argument 0 is the output)
_INPUT_IS_ARG1 = {
    "_allgather_base_",
    "_reduce_scatter_base_",
    "alltoall_base_",
    "allgather_",
    "reduce_scatter_",
    "alltoall_",
    "allgather_into_tensor_coalesced_",
    "reduce_scatter_tensor_coalesced_",
    "gather_",
    "scatter_",
}
_P2P = {"send", "send_"}
_ALL_TO_ALL = {"alltoall_base_", "alltoall_", "all_to_all_single"}
#: not a data movement, or the receiving half of a P2P pair
_IGNORED = {"barrier", "monitored_barrier", "_wrap_tensor_autograd", "recv_", "recv_any_source_", "wait_tensor"}


@dataclass
class CommCount:
    """Calls and payload bytes, keyed by axis and by op."""

    bytes_by_axis: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls_by_op: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_by_op: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def to_dict(self) -> dict:
        return {
            "bytes_by_axis": dict(self.bytes_by_axis),
            "calls_by_op": dict(self.calls_by_op),
            "bytes_by_op": dict(self.bytes_by_op),
        }


def _process_group(args, kwargs) -> ProcessGroup | None:
    """The process group of a c10d call: c10d ops carry it boxed in a ScriptObject; functional
    collectives carry its name as their last string argument (earlier strings are reduce ops)."""
    values = list(args) + list((kwargs or {}).values())
    for a in values:
        if isinstance(a, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(a)
            except RuntimeError:
                continue  # another boxed object (a reduce op, a work handle)
    names = [a for a in values if isinstance(a, str)]
    # a plain str to the checker: torch types the name as its GroupName NewType
    return _resolve_process_group(names[-1]) if names else None  # type: ignore[arg-type]


class CommBytesMode(TorchDispatchMode):
    """`with CommBytesMode(axis_ranks) as cb:` counts every collective issued inside, by axis.
    `axis_ranks` maps the rank set of each axis group to its name (autopar.trial.mesh.axis_ranks;
    also keyed (kind, rank set) and ("name", group name))."""

    def __init__(self, axis_ranks: dict[Hashable, str]) -> None:
        super().__init__()
        self.axis_ranks = axis_ranks
        self.count = CommCount()
        self._axis_of_group: dict[tuple[str, str], str] = {}

    def _axis(self, group: ProcessGroup | None, kind: str) -> str:
        """The axis of a call: by (kind, rank set) first (mesh.axis_ranks), then by rank set."""
        if group is None:
            return "other"
        key = (group.group_name, kind)
        if key not in self._axis_of_group:
            ranks = frozenset(dist.get_process_group_ranks(group))
            named = self.axis_ranks.get(("name", group.group_name))
            self._axis_of_group[key] = named or self.axis_ranks.get((kind, ranks), self.axis_ranks.get(ranks, "other"))
        return self._axis_of_group[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor lower to its local collectives, which come back here
        if func.namespace in _NAMESPACES:
            name = func._overloadpacket.__name__
            if not name.startswith("wait") and name not in _IGNORED:
                src = args[1] if name in _INPUT_IS_ARG1 and len(args) > 1 else args[0]
                nbytes = sum(t.numel() * t.element_size() for t in tree_leaves(src) if isinstance(t, torch.Tensor))
                kind = "p2p" if name in _P2P else "all_to_all" if name in _ALL_TO_ALL else "collective"
                axis = self._axis(_process_group(args, kwargs), kind)
                key = f"{func.namespace}.{name}"
                self.count.bytes_by_axis[axis] += nbytes
                self.count.calls_by_op[key] += 1
                self.count.bytes_by_op[key] += nbytes
        return func(*args, **(kwargs or {}))
