"""Every parallel group's ranks, as the cost model places them (autopar.spec.ranks.group_stride:
size and stride), are the ranks the built-in model's device mesh puts in that group: the mesh is
torch.arange(world).view(sizes in MESH_ORDER) (autopar.trial.mesh), here numpy's reshape of the same
order, and its expert view (pp, edp, ep, etp) likewise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autopar.spec.ranks import EXPERT_MESH_ORDER, MESH_ORDER, group_stride

PLANS = [
    dict(pp=2, dp=2, cp=2, tp=2),
    dict(pp=1, dp=4, cp=1, tp=8),
    dict(pp=4, dp=1, cp=4, tp=1),
    dict(pp=3, dp=2, cp=1, tp=4),
]


def _groups(sizes: dict, order, axes) -> list[set[int]]:
    """The rank sets of the groups over `axes` of a mesh arange(world).reshape(sizes in order)."""
    grid = np.arange(int(np.prod([sizes[a] for a in order]))).reshape([sizes[a] for a in order])
    keep = [order.index(a) for a in axes]
    rest = [i for i in range(len(order)) if i not in keep]
    moved = np.moveaxis(grid, rest + keep, list(range(len(order))))
    return [
        set(moved[idx].reshape(-1).tolist()) for idx in itertools.product(*[range(s) for s in moved.shape[: len(rest)]])
    ]


@pytest.mark.parametrize("sizes", PLANS, ids=lambda s: ".".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("axes", [("tp",), ("cp",), ("dp",), ("pp",), ("dp", "cp"), ("cp", "tp")])
def test_group_stride_gives_the_meshs_groups(sizes, axes):
    stride = group_stride(sizes, axes)
    size = int(np.prod([sizes[a] for a in axes]))
    for group in _groups(sizes, MESH_ORDER, axes):
        first = min(group)
        assert group == {first + k * stride for k in range(size)}, (axes, sorted(group), stride)


@pytest.mark.parametrize("ep,etp", [(4, 1), (2, 2), (8, 1), (1, 4)])
def test_expert_groups_follow_the_expert_view(ep, etp):
    dense = dict(pp=2, dp=4, cp=1, tp=2)
    edp = dense["dp"] * dense["cp"] * dense["tp"] // (ep * etp)
    sizes = dict(pp=2, edp=edp, ep=ep, etp=etp)
    for axes in (("ep",), ("edp",), ("etp",)):
        stride = group_stride(sizes, axes, EXPERT_MESH_ORDER)
        size = sizes[axes[0]]
        for group in _groups(sizes, EXPERT_MESH_ORDER, axes):
            assert group == {min(group) + k * stride for k in range(size)}


def test_a_group_of_axes_that_are_not_adjacent_is_refused():
    with pytest.raises(ValueError):
        group_stride(dict(pp=2, dp=2, cp=2, tp=2), ("dp", "tp"))
