"""Per-rank stage profiles of a pipeline layout, vectorised over a table of plans (a PlanTable).

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
from functools import lru_cache

import numpy as np

from autopar.spec.layout import PipelineLayout, auto_layout
from autopar.spec.model import ModelSpec
from autopar.spec.plan_fields import SCHED, PlanColumns

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
class _Groups:
    """The distinct (pp, vpp, layout) of a table, resolved once each: `of_row` maps every row to its
    group; per-group arrays are padded to the largest pp (`dense`, `moe`: layers per rank) and to
    the most run ends (`ends`: the ranks `_run_ends` costs, the last repeated)."""

    of_row: np.ndarray  # (n,)
    pp: np.ndarray  # (G,)
    dense: np.ndarray  # (G, max pp)
    moe: np.ndarray  # (G, max pp)
    ends: np.ndarray  # (G, W)
    starts: np.ndarray  # (G, W'): the first rank of every run (`_run_starts`), the last repeated


def stage_profiles(
    table: PlanColumns, model: ModelSpec, every_rank: bool = False, run_starts: bool = False, ranks: bool = True
) -> StageProfiles:
    """The stage profiles of every rank (`every_rank`), of the ranks whose time or memory can differ
    (the default), or of the first rank of each run of equal ranks (`run_starts`): a rank's time
    depends only on its layers and on holding the embedding or the head, so those ranks give the
    same slowest stage, and the same lowest rank of it, as every rank. `ranks=False`: the per-plan
    fields only (no rank is costed: what the validity rules read)."""
    resolved = _groups(table, model)
    g = resolved[0]
    if not ranks:
        rank = np.zeros((0, len(table)), dtype=np.int64)
    elif every_rank:
        rank = _all_ranks(table)
    elif run_starts:
        rank = _starts(table, g)
    else:
        rank = _costed_ranks(table, g)
    return _on(table, resolved, rank)


def costed_and_run_starts(table: PlanColumns, model: ModelSpec) -> tuple[StageProfiles, StageProfiles]:
    """`stage_profiles` of the costed ranks and of the run starts, the layouts resolved once."""
    resolved = _groups(table, model)
    return _on(table, resolved, _costed_ranks(table, resolved[0])), _on(table, resolved, _starts(table, resolved[0]))


def _starts(table: PlanColumns, g: "_Groups") -> np.ndarray:
    return g.starts[g.of_row].T if len(table) else np.zeros((1, 0), dtype=np.int64)


def _on(table: PlanColumns, resolved, rank: np.ndarray) -> StageProfiles:
    """The profiles of the given (C, n) ranks of resolved layouts."""
    g, problem, text, max_layers, imbalance, uneven = resolved
    row = np.broadcast_to(g.of_row[None, :], rank.shape)
    at = np.minimum(rank, np.maximum(table.pp - 1, 0)[None, :])
    active = rank < table.pp[None, :]
    dense = np.where(active, g.dense[row, at], 0)
    moe = np.where(active, g.moe[row, at], 0)
    return StageProfiles(
        rank=rank,
        active=active,
        dense_layers=dense,
        moe_layers=moe,
        has_embedding=rank == 0,
        has_head=rank == (table.pp - 1)[None, :],
        layout_problem=problem,
        layout_text=text,
        max_rank_layers=max_layers,
        imbalance=imbalance,
        uneven=uneven,
    )


def _groups(table: PlanColumns, model: ModelSpec):
    """Resolve each distinct (pp, vpp, layout) once: its layers per rank, run ends, text, problems
    and balance, each gathered to the rows by their group."""
    mask = np.asarray(model.moe_layer_mask, dtype=bool)
    n = len(table)
    if not n:
        empty = np.zeros((0, 1), dtype=np.int64)
        return (
            _Groups(np.zeros(0, np.int64), np.zeros(0, np.int64), empty, empty, empty, empty),
            np.zeros(0, object),
            np.zeros(0, object),
            np.zeros(0),
            np.ones(0),
            np.zeros(0, bool),
        )
    # one integer per (pp, vpp, layout id >= -2): a 1-D unique, no row comparisons
    pp_span, vpp_span = int(table.pp.max()) + 1, int(table.vpp.max()) + 1
    keys = table.pp + pp_span * (table.vpp + vpp_span * (table.layout_id + 2))
    uniq, first, of_row = np.unique(keys, return_index=True, return_inverse=True)
    width = int(table.pp.max())
    G = len(uniq)
    dense, moe = np.zeros((G, width), dtype=np.int64), np.zeros((G, width), dtype=np.int64)
    problem, text = np.full(G, "", dtype=object), np.full(G, "", dtype=object)
    max_layers, imbalance, uneven = np.zeros(G), np.ones(G), np.zeros(G, dtype=bool)
    ends, starts = [], []
    mask_key = tuple(bool(b) for b in mask)
    for k, i in enumerate(first):
        pp, vpp, lid = int(table.pp[i]), int(table.vpp[i]), int(table.layout_id[i])
        layout = None if lid < 0 else table.layouts[lid]
        r = _resolve(model.num_layers, mask_key, pp, vpp, layout)
        problem[k], text[k], uneven[k], max_layers[k], imbalance[k] = (
            r.problem,
            r.text,
            r.uneven,
            r.max_layers,
            r.imbalance,
        )
        dense[k, :pp], moe[k, :pp] = r.dense, r.moe
        ends.append(r.ends)
        starts.append(r.starts)
    groups = _Groups(of_row.reshape(-1), uniq % pp_span, dense, moe, _padded(ends), _padded(starts))
    rows = groups.of_row
    return groups, problem[rows], text[rows], max_layers[rows], imbalance[rows], uneven[rows]


@dataclass(frozen=True)
class _Resolved:
    """One (pp, vpp, layout) of a model, resolved (`_resolve`)."""

    problem: str
    text: str
    uneven: bool
    max_layers: float
    imbalance: float
    dense: np.ndarray  # (pp,) dense layers per rank
    moe: np.ndarray  # (pp,)
    ends: np.ndarray
    starts: np.ndarray


@lru_cache(maxsize=4096)
def _resolve(num_layers: int, moe_mask: tuple, pp: int, vpp: int, layout: PipelineLayout | None) -> _Resolved:
    """A layout's layers per rank, run ends and starts, text, problems and balance (None: the auto
    layout); cached, as a search meets the same few hundred layouts in every chunk."""
    mask = np.asarray(moe_mask, dtype=bool)
    auto = layout is None
    layout = auto_layout(num_layers, pp, vpp) if layout is None else layout
    probs = layout.problems(num_layers, pp, vpp)
    if auto and num_layers < pp * vpp - 2:
        probs = [f"{num_layers} layers cannot fill pp*vpp = {pp * vpp} stages"]
    dense, moe = np.zeros(pp, dtype=np.int64), np.zeros(pp, dtype=np.int64)
    max_layers, imbalance = 0.0, 1.0
    if not probs:
        for vstage, layers in enumerate(layout.layer_ranges()):
            n_moe = int(mask[layers.start : layers.stop].sum())
            moe[vstage % pp] += n_moe
            dense[vstage % pp] += len(layers) - n_moe
        per_rank = layout.rank_layers(pp)
        max_layers, imbalance = float(max(per_rank)), max(per_rank) / (num_layers / pp)
    return _Resolved(
        "; ".join(probs),
        layout.describe(),
        len(set(layout.stages)) > 1,
        max_layers,
        imbalance,
        dense,
        moe,
        _run_ends(pp, dense, moe),
        _run_starts(pp, dense, moe),
    )


def _all_ranks(table: PlanColumns) -> np.ndarray:
    R = int(table.pp.max()) if len(table) else 1
    return np.broadcast_to(np.arange(R)[:, None], (R, len(table)))


def _padded(rows: list[np.ndarray]) -> np.ndarray:
    """Ragged rank lists as one (G, W) array, each padded with its last rank."""
    w = max(len(r) for r in rows)
    return np.array([np.concatenate([r, np.full(w - len(r), r[-1])]) for r in rows], dtype=np.int64)


def _run_changes(pp: int, dense: np.ndarray, moe: np.ndarray) -> np.ndarray:
    """The ranks r whose layers (or embedding / head) differ from rank r + 1's."""
    r = np.arange(pp)
    key = np.stack([dense, moe, r == 0, r == pp - 1], axis=1)
    return np.flatnonzero(np.any(key[1:] != key[:-1], axis=1))


def _run_ends(pp: int, dense: np.ndarray, moe: np.ndarray) -> np.ndarray:
    """The first and last rank of every run of ranks with the same layers (rank 0 and pp-1 apart)."""
    changes = _run_changes(pp, dense, moe)
    return np.unique(np.concatenate([[0, pp - 1], changes, changes + 1]))


def _run_starts(pp: int, dense: np.ndarray, moe: np.ndarray) -> np.ndarray:
    """The first rank of every run of ranks with the same layers (rank 0 and pp-1 apart)."""
    return np.unique(np.concatenate([[0, pp - 1], _run_changes(pp, dense, moe) + 1]))


def _costed_ranks(table: PlanColumns, groups: _Groups) -> np.ndarray:
    """(C, n) ranks to cost, ascending per plan: run ends, then the ranks around the in-flight kink."""
    static = groups.ends[groups.of_row].T if len(table) else np.zeros((1, 0), dtype=np.int64)
    kinks = np.floor(_in_flight_kink(table))[None, :].astype(np.int64) + KINK_OFFSETS[:, None]
    ranks = np.concatenate([static, np.clip(kinks, 0, np.maximum(table.pp - 1, 0)[None, :])])
    return _distinct(np.sort(ranks, axis=0))


def _distinct(ranks: np.ndarray) -> np.ndarray:
    """Sorted (C, n) ranks with each plan's repeats dropped, padded with its last rank as `_padded`
    pads, and cut to the most distinct ranks of one plan (a rank costed twice costs the same)."""
    if not ranks.size:
        return ranks
    first = np.ones(ranks.shape, dtype=bool)
    first[1:] = ranks[1:] != ranks[:-1]
    place = np.cumsum(first, axis=0) - 1  # where each plan's distinct rank goes, in order
    out = np.broadcast_to(ranks[-1], ranks.shape).copy()
    out[place[first], np.broadcast_to(np.arange(ranks.shape[1]), ranks.shape)[first]] = ranks[first]
    return out[: int(place[-1].max()) + 1]


def _in_flight_kink(table: PlanColumns) -> np.ndarray:
    """The rank r* where the in-flight count of autopar.cost.pipeline.microbatches_in_flight meets
    the step's microbatches m: 1F1B p - r* = m; interleaved 2(p - r* - 1) + (v - 1)p + 1 = m v."""
    p, v = table.pp.astype(float), table.vpp.astype(float)
    m = np.maximum(table.num_microbatches, 1).astype(float)
    interleaved = (2 * (p - 1) + (v - 1) * p + 1 - m * v) / 2
    return np.where(table.pp_schedule == SCHED["interleaved-1f1b"], interleaved, p - m)
