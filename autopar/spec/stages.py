"""Per-rank stage profiles of a pipeline layout, vectorised over a PlanTable.

The cost model evaluates three candidate pipeline ranks per plan: rank 0 (embedding, most
microbatches in flight), rank pp-1 (LM head and loss) and the busiest middle rank (most layers;
the earliest such rank, which has the most microbatches in flight). Memory and time are monotone
in layers and in-flight microbatches, so the most loaded rank and the slowest stage are among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.spec.layout import PipelineLayout, auto_layout
from autopar.spec.model import ModelSpec
from autopar.spec.table import PlanTable

CANDIDATES = ("first", "last", "middle")


@dataclass
class StageProfiles:
    """Arrays of shape (3, n): one row per candidate rank (CANDIDATES order)."""

    rank: np.ndarray
    dense_layers: np.ndarray
    moe_layers: np.ndarray
    has_embedding: np.ndarray
    has_head: np.ndarray
    layout_problem: np.ndarray  # (n,) object: "" or why the layout cannot run
    layout_text: np.ndarray  # (n,) object: the layout assumed, for display
    max_rank_layers: np.ndarray  # (n,) most layers on one rank
    imbalance: np.ndarray  # (n,) max rank layers / mean rank layers


def _profile(layout: PipelineLayout, pp: int, model: ModelSpec) -> tuple:
    mask = model.moe_layer_mask
    per_rank_dense = [0] * pp
    per_rank_moe = [0] * pp
    for vstage, layers in enumerate(layout.layer_ranges()):
        r = vstage % pp
        for i in layers:
            if mask[i]:
                per_rank_moe[r] += 1
            else:
                per_rank_dense[r] += 1
    totals = [d + m for d, m in zip(per_rank_dense, per_rank_moe)]
    if pp > 2:
        mid = max(range(1, pp - 1), key=lambda r: (totals[r], per_rank_moe[r], -r))
    else:
        mid = 0
    ranks = (0, pp - 1, mid)
    mean = model.num_layers / pp
    return (ranks, [per_rank_dense[r] for r in ranks], [per_rank_moe[r] for r in ranks],
            max(totals), max(totals) / mean)


def stage_profiles(table: PlanTable, model: ModelSpec) -> StageProfiles:
    n = len(table)
    out = {k: np.zeros((3, n), dtype=np.int64) for k in ("rank", "dense", "moe")}
    problem = np.full(n, "", dtype=object)
    text = np.full(n, "", dtype=object)
    max_layers = np.zeros(n)
    imbalance = np.ones(n)
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
        ranks, dense, moe, mx, imb = _profile(layout, pp, model)
        for c in range(3):
            out["rank"][c, rows] = ranks[c]
            out["dense"][c, rows] = dense[c]
            out["moe"][c, rows] = moe[c]
        max_layers[rows] = mx
        imbalance[rows] = imb
    last = table.pp - 1
    rank = out["rank"]
    return StageProfiles(rank=rank, dense_layers=out["dense"], moe_layers=out["moe"],
                         has_embedding=rank == 0, has_head=rank == last[None, :],
                         layout_problem=problem, layout_text=text, max_rank_layers=max_layers,
                         imbalance=imbalance)
