"""Where a parallel group's ranks sit: the stride between them, from the one rank order
(autopar.spec.plan.MESH_ORDER and EXPERT_MESH_ORDER, outermost first) that the built-in model's
device mesh is built from (autopar.trial.mesh: torch.arange(world).view(sizes in that order)) and the
cost model places its groups by (autopar.cost.collectives.place)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autopar.spec.plan import EXPERT_MESH_ORDER, MESH_ORDER

__all__ = ["EXPERT_MESH_ORDER", "MESH_ORDER", "group_stride"]


def group_stride(sizes: Mapping[str, object], axes: Sequence[str], order: Sequence[str] = MESH_ORDER):
    """The rank stride of the group over `axes` (adjacent in `order`): the product of the sizes of
    the axes inside the innermost of them (scalars or numpy arrays). E.g. in (pp, dp, cp, tp): tp 1,
    cp tp, dp and cp together tp, pp dp*cp*tp."""
    where = sorted(order.index(a) for a in axes)
    if where != list(range(where[0], where[-1] + 1)):
        raise ValueError(f"a group spans adjacent axes of {order}, not {tuple(axes)}")
    stride: object = 1
    for a in order[where[-1] + 1 :]:
        stride = stride * sizes[a]  # type: ignore[operator]
    return stride
