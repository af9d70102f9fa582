"""Process group and device mesh: one DeviceMesh with named axes in `MESH_ORDER`, built from the plan.

Axis order is `autopar.spec.plan.MESH_ORDER = ("pp", "dp", "cp", "tp")`, outermost first: global
rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank, so tp groups are consecutive
ranks (inside a node), as the cost model's link placement assumes (autopar.cost.collectives.place).

Every axis is kept, size 1 included, so code can always name `mesh["tp"]`; the apply_* steps skip
size-1 axes, so a one-rank group never issues a collective (as the cost model counts). The backend
follows the device: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.spec.plan import MESH_ORDER, ParallelPlan


@dataclass(frozen=True)
class Runtime:
    """Where this process runs: its device and the process-group backend for it."""

    device: torch.device
    backend: str

    @property
    def device_type(self) -> str:
        return self.device.type


def detect_runtime(prefer: str = "auto") -> Runtime:
    """CUDA (one GPU per local rank, NCCL) when available and not refused, else CPU with gloo."""
    if prefer not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {prefer!r}")
    if prefer == "cuda" or (prefer == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return Runtime(torch.device("cuda", local), "nccl")
    return Runtime(torch.device("cpu"), "gloo")


def init_distributed(runtime: Runtime, timeout_s: float = 300.0) -> None:
    """Join the torchrun process group (env:// rendezvous) once; a bounded timeout so a broken peer
    ends the run instead of hanging it."""
    if not dist.is_initialized():
        kwargs = {"device_id": runtime.device} if runtime.backend == "nccl" else {}
        dist.init_process_group(runtime.backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)


def mesh_shape(plan: ParallelPlan) -> tuple[int, ...]:
    """Sizes of the mesh axes, in MESH_ORDER."""
    return tuple(getattr(plan, axis) for axis in MESH_ORDER)


def build_mesh(plan: ParallelPlan, runtime: Runtime) -> DeviceMesh:
    """The plan's mesh over all ranks; the world size must equal tp * pp * dp * cp."""
    world = dist.get_world_size()
    if plan.num_gpus != world:
        raise ValueError(f"plan {plan.describe()} needs {plan.num_gpus} processes, the world has {world}")
    return init_device_mesh(runtime.device_type, mesh_shape(plan), mesh_dim_names=MESH_ORDER)


def axis_ranks(mesh: DeviceMesh) -> dict[frozenset[int], str]:
    """Global ranks of this process's group on each axis of size > 1 -> the axis name. Collectives
    are attributed by rank set, not group name: DTensor caches sharding decisions by mesh value,
    so a later, equal mesh may run its collectives on an earlier mesh's groups of the same ranks."""
    out = {}
    for axis in MESH_ORDER:
        group = mesh.get_group(axis)
        if group.size() > 1:
            out[frozenset(dist.get_process_group_ranks(group))] = axis
    return out
