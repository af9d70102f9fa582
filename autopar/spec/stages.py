"""Per-rank stage profiles of a pipeline layout, vectorised over a PlanTable.

Arrays are shaped (C, n): C costed pipeline ranks per plan, `rank` says which. With `every_rank`
every rank is costed (C = the largest pp; `active` marks rank < pp), for the per-stage breakdown of
one plan. Otherwise only the ranks that can differ are costed, which gives the same peak memory
and the same slowest stage with far fewer rows:
- a rank's costs depend on its layers (dense and MoE), on whether it holds the embedding (rank 0)
  or the head (rank pp-1), and, for memory only, on the microbatches in flight, which fall linearly
  with the rank until they reach the step's microbatches (autopar.cost.pipeline);
- so along a run of ranks with the same layers, memory is piecewise linear in the rank, with its
  kinks where the in-flight count meets the microbatch count (and, on the torch stack, where held
  sends start: half or one rank later), and its maximum lies at an end of the run or at a kink;
- the costed ranks are the ends of every run (rank 0 and pp-1 are runs of their own) and the ranks
  around the kinks. Sorted ascending, ties resolve to the lowest rank, as over every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.spec.layout import auto_layout
from autopar.spec.model import ModelSpec
from autopar.spec.table import SCHED, PlanTable

#: ranks costed around a kink of the in-flight count: floor(r*) - 1 .. floor(r*) + 2
KINK_OFFSETS = np.array([-1, 0, 1, 2])


@dataclass
class StageProfiles:
    """(C, n) arrays, one row per costed pipeline rank; with `every_rank`, ranks >= pp hold zeros."""

    rank: np.ndarray
    active: np.ndarray
    dense_layers: np.ndarray
    moe_layers: np.ndarray
    has_embedding: np.ndarray
    has_head: np.ndarray
    layout_problem: np.ndarray  # (n,) object: "" or why the layout cannot run
    layout_text: np.ndarray  # (n,) object: the layout assumed, for display
    max_rank_layers: np.ndarray  # (n,) most layers on one rank
    imbalance: np.ndarray  # (n,) max rank layers / mean rank layers
    uneven: np.ndarray  # (n,) bool: the virtual stages do not all hold the same layer count


@dataclass
class _Group:
    """Plans sharing (pp, vpp, layout): their rows and the layers of each pipeline rank."""

    rows: np.ndarray
    pp: int
    dense: np.ndarray  # (pp,)
    moe: np.ndarray  # (pp,)


def stage_profiles(table: PlanTable, model: ModelSpec, every_rank: bool = False) -> StageProfiles:
    n = len(table)
    problem = np.full(n, "", dtype=object)
    text = np.full(n, "", dtype=object)
    max_layers = np.zeros(n)
    imbalance = np.ones(n)
    uneven = np.zeros(n, dtype=bool)
    groups = _groups(table, model, problem, text, max_layers, imbalance, uneven)
    rank = _all_ranks(table) if every_rank else _costed_ranks(table, groups)
    dense = np.zeros(rank.shape, dtype=np.int64)
    moe = np.zeros(rank.shape, dtype=np.int64)
    for g in groups:
        r = np.minimum(rank[:, g.rows], g.pp - 1)
        dense[:, g.rows] = g.dense[r]
        moe[:, g.rows] = g.moe[r]
    active = rank < table.pp[None, :]
    dense, moe = np.where(active, dense, 0), np.where(active, moe, 0)
    return StageProfiles(rank=rank, active=active, dense_layers=dense, moe_layers=moe,
                         has_embedding=rank == 0, has_head=rank == (table.pp - 1)[None, :],
                         layout_problem=problem, layout_text=text, max_rank_layers=max_layers, imbalance=imbalance,
                         uneven=uneven)


def _groups(table: PlanTable, model: ModelSpec, problem, text, max_layers, imbalance, uneven) -> list[_Group]:
    """Resolve each (pp, vpp, layout) once; record its text, problems and balance per row."""
    mask = np.asarray(model.moe_layer_mask, dtype=bool)
    if not len(table):
        return []
    keys = np.stack([table.pp, table.vpp, table.layout_id], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    out = []
    for k, (pp, vpp, lid) in enumerate(uniq):
        rows = np.flatnonzero(inverse == k)
        pp, vpp, lid = int(pp), int(vpp), int(lid)
        layout = auto_layout(model.num_layers, pp, vpp) if lid < 0 else table.layouts[lid]
        probs = layout.problems(model.num_layers, pp, vpp)
        if lid < 0 and model.num_layers < pp * vpp - 2:
            probs = [f"{model.num_layers} layers cannot fill pp*vpp = {pp * vpp} stages"]
        text[rows] = layout.describe()
        uneven[rows] = len(set(layout.stages)) > 1
        dense, moe = np.zeros(pp, dtype=np.int64), np.zeros(pp, dtype=np.int64)
        if probs:
            problem[rows] = "; ".join(probs)
        else:
            for vstage, layers in enumerate(layout.layer_ranges()):
                n_moe = int(mask[layers.start:layers.stop].sum())
                moe[vstage % pp] += n_moe
                dense[vstage % pp] += len(layers) - n_moe
            per_rank = layout.rank_layers(pp)
            max_layers[rows] = max(per_rank)
            imbalance[rows] = max(per_rank) / (model.num_layers / pp)
        out.append(_Group(rows, pp, dense, moe))
    return out


def _all_ranks(table: PlanTable) -> np.ndarray:
    R = int(table.pp.max()) if len(table) else 1
    return np.broadcast_to(np.arange(R)[:, None], (R, len(table)))


def _run_ends(g: _Group) -> np.ndarray:
    """The first and last rank of every run of ranks with the same layers (rank 0 and pp-1 apart)."""
    r = np.arange(g.pp)
    key = np.stack([g.dense, g.moe, r == 0, r == g.pp - 1], axis=1)
    changes = np.flatnonzero(np.any(key[1:] != key[:-1], axis=1))
    return np.unique(np.concatenate([[0, g.pp - 1], changes, changes + 1]))


def _costed_ranks(table: PlanTable, groups: list[_Group]) -> np.ndarray:
    """(C, n) ranks to cost, ascending per plan: run ends, then the ranks around the in-flight kink."""
    n = len(table)
    ends = [_run_ends(g) for g in groups]
    width = max((len(e) for e in ends), default=1)
    static = np.zeros((width, n), dtype=np.int64)
    for g, e in zip(groups, ends):
        static[:, g.rows] = np.concatenate([e, np.full(width - len(e), e[-1])])[:, None]
    kinks = np.floor(_in_flight_kink(table))[None, :].astype(np.int64) + KINK_OFFSETS[:, None]
    ranks = np.concatenate([static, np.clip(kinks, 0, np.maximum(table.pp - 1, 0)[None, :])])
    return np.sort(ranks, axis=0)


def _in_flight_kink(table: PlanTable) -> np.ndarray:
    """The rank r* where the in-flight count of autopar.cost.pipeline.microbatches_in_flight meets
    the step's microbatches m: 1F1B p - r* = m; interleaved 2(p - r* - 1) + (v - 1)p + 1 = m v."""
    p, v = table.pp.astype(float), table.vpp.astype(float)
    m = np.maximum(table.num_microbatches, 1).astype(float)
    interleaved = (2 * (p - 1) + (v - 1) * p + 1 - m * v) / 2
    return np.where(table.schedule == SCHED["interleaved-1f1b"], interleaved, p - m)
