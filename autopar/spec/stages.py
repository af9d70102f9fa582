"""Per-rank stage profiles of a pipeline layout, vectorised over a PlanTable.

Every pipeline rank of every plan is profiled: arrays are shaped (R, n) with R the largest pp in
the table; `active` marks the ranks a plan really has (rank < pp). The cost model evaluates memory
and time on all of them, so the most loaded rank and the slowest stage are found exactly, whatever
the layout (a middle rank with fewer layers but more microbatches in flight can be the peak).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.spec.layout import auto_layout
from autopar.spec.model import ModelSpec
from autopar.spec.table import PlanTable


@dataclass
class StageProfiles:
    """(R, n) arrays, one row per pipeline rank; inactive ranks (rank >= pp) hold zeros."""

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


def stage_profiles(table: PlanTable, model: ModelSpec) -> StageProfiles:
    n = len(table)
    R = int(table.pp.max()) if n else 1
    dense = np.zeros((R, n), dtype=np.int64)
    moe = np.zeros((R, n), dtype=np.int64)
    problem = np.full(n, "", dtype=object)
    text = np.full(n, "", dtype=object)
    max_layers = np.zeros(n)
    imbalance = np.ones(n)
    mask = np.asarray(model.moe_layer_mask, dtype=bool)
    keys = np.stack([table.pp, table.vpp, table.layout_id], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for k, (pp, vpp, lid) in enumerate(uniq):
        rows = inverse == k
        pp, vpp, lid = int(pp), int(vpp), int(lid)
        layout = auto_layout(model.num_layers, pp, vpp) if lid < 0 else table.layouts[lid]
        probs = layout.problems(model.num_layers, pp, vpp)
        if lid < 0 and model.num_layers < pp * vpp - 2:
            probs = [f"{model.num_layers} layers cannot fill pp*vpp = {pp * vpp} stages"]
        text[rows] = layout.describe()
        if probs:
            problem[rows] = "; ".join(probs)
            continue
        for vstage, layers in enumerate(layout.layer_ranges()):
            r = vstage % pp
            n_moe = int(mask[layers.start:layers.stop].sum())
            moe[r, rows] += n_moe
            dense[r, rows] += len(layers) - n_moe
        per_rank = layout.rank_layers(pp)
        max_layers[rows] = max(per_rank)
        imbalance[rows] = max(per_rank) / (model.num_layers / pp)
    rank = np.broadcast_to(np.arange(R)[:, None], (R, n))
    return StageProfiles(rank=rank, active=rank < table.pp[None, :], dense_layers=dense, moe_layers=moe,
                         has_embedding=rank == 0, has_head=rank == (table.pp - 1)[None, :],
                         layout_problem=problem, layout_text=text, max_rank_layers=max_layers, imbalance=imbalance)
