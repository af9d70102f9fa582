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
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.spec.plan import EXPERT_MESH_ORDER, MESH_ORDER, ParallelPlan


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
        kwargs: dict[str, Any] = {"device_id": runtime.device} if runtime.backend == "nccl" else {}
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


def dp_cp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The dense-gradient reduction mesh: dp x cp flattened (cp ranks hold different tokens of the
    same sequences, so their gradients add up like data-parallel ones; the cost model's `d * c`)."""
    try:
        return mesh["dp_cp"]
    except (KeyError, RuntimeError, ValueError):  # not flattened yet
        return mesh["dp", "cp"]._flatten("dp_cp")


def new_axes_group(mesh: DeviceMesh, axes: tuple[str, ...]):
    """A fresh process group over this rank's group of the `axes` flattened (in mesh order; every
    rank creates every one, in the same order, as new_group requires); its name is unique, so the
    byte counter can attribute it by name."""
    assert mesh.mesh_dim_names is not None  # the plan's meshes all have named axes
    names = list(mesh.mesh_dim_names)
    dims = sorted(names.index(a) for a in axes)
    size = 1
    for d in dims:
        size *= mesh.mesh.shape[d]
    rest = [d for d in range(mesh.mesh.ndim) if d not in dims]
    table = mesh.mesh.permute(*rest, *dims).reshape(-1, size)
    mine = None
    for row in table.tolist():
        group = dist.new_group(row)
        if dist.get_rank() in row:
            mine = group
    return mine


def fresh_axis_mesh(mesh: DeviceMesh, axis: str) -> DeviceMesh:
    """A 1-D mesh over this rank's `axis` group on a process group of its own (`new_axes_group`):
    a mesh dimension spanning every rank runs on the default group, which other axes share, so
    its collectives could not be told apart by group."""
    group = new_axes_group(mesh, (axis,))
    return DeviceMesh.from_group(group, mesh.device_type, mesh_dim_names=(axis,))


def build_expert_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh:
    """The expert view of the same ranks, `EXPERT_MESH_ORDER = (pp, edp, ep, etp)`: inside a stage
    the tp*cp*dp consecutive ranks re-viewed with etp innermost, then ep, then expert-dp (so an EP
    group takes ep ranks at stride etp, as autopar.spec.plan and the cost model say)."""
    world = dist.get_world_size()
    assert plan.etp is not None  # ParallelPlan.__post_init__ resolves None to tp
    shape = (plan.pp, plan.expert_dp, plan.ep, plan.etp)
    if plan.pp * plan.expert_dp * plan.ep * plan.etp != world:
        raise ValueError(f"expert mesh {shape} does not cover the {world} ranks")
    return DeviceMesh(device_type, torch.arange(world).view(shape), mesh_dim_names=EXPERT_MESH_ORDER)


def axis_ranks(mesh: DeviceMesh, expert_mesh: DeviceMesh | None = None) -> dict:
    """Global ranks of this process's group on each axis of size > 1 -> the axis name. Collectives
    are attributed by rank set, not group name: DTensor caches sharding decisions by mesh value,
    so a later, equal mesh may run its collectives on an earlier mesh's groups of the same ranks.

    One rank set can serve several axes (dp = 1: the dp x cp gradient group is the cp group; an EP
    group over dp ranks is the dp group), so entries keyed `(kind, ranks)` come first for P2P
    ("p2p": cp ring, pp) and all-to-all ("all_to_all": ep) calls; a plain `ranks` key serves the
    other collectives, where gradient reductions (dp x cp, expert-dp) count as "dp". Collectives
    that belong to an axis whose rank set another axis also claims (the MoE aux-loss statistics
    over cp when dp = 1) run on a group of their own (`new_axes_group`), keyed `("name", name)`:
    torch hands out one process group per rank set, so the mesh's cp group is the dp x cp one."""
    out: dict = {}

    def ranks(group) -> frozenset[int] | None:
        return frozenset(dist.get_process_group_ranks(group)) if group.size() > 1 else None

    for axis in MESH_ORDER:
        key = ranks(mesh.get_group(axis))
        if key is not None:
            out.setdefault(key, axis)
            if axis in ("cp", "pp"):
                out[("p2p", key)] = axis
    if mesh["dp"].size() * mesh["cp"].size() > 1:
        key = ranks(dp_cp_mesh(mesh).get_group())
        if key is not None:
            out[key] = "dp"
    if expert_mesh is not None:
        key = ranks(expert_mesh.get_group("ep"))
        if key is not None:
            out[("all_to_all", key)] = "ep"
        edp = expert_mesh.get_group("edp")
        key = ranks(edp)
        if key is not None:
            out.setdefault(key, "dp")
    return out
