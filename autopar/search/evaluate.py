"""The search's one entry into the cost model: a table of plans priced for a search question, the
space's memory headroom part of "fits" (autopar.cost.columns.set_validity) and the step time it
ranks by set. The streaming walk prices its chunks per trainer (autopar.calibration.estimate
estimate_per_trainer) and its kept plans, Optuna's trials and a measured stage's re-rank here."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autopar.calibration.estimate import estimate_table
from autopar.figures import FITS, MEMORY_MISS_GIB, RANK_TIME_S, VALID
from autopar.search.results import frame, set_rank_time
from autopar.spec.question import Question
from autopar.spec.table import PlanTable


def estimate_fitting(table: PlanTable, q: Question, headroom_gib: float, search: bool = False) -> dict:
    """Every estimate column of a (small) table, the space's memory headroom applied and the rank
    time set; `search`: only the light columns a search ranks and keeps plans by
    (autopar.calibration.estimate.estimate_table)."""
    est = estimate_table(
        table,
        q.model,
        q.cluster,
        num_gpus=q.num_gpus,
        seq_len=q.seq_len,
        headroom_gib=headroom_gib,
        recipes=q.recipe_trainers,
        search=search,
        routing_imbalance=q.routing_imbalance,
    )
    set_rank_time(est, q.rank_by)
    return est


def evaluate(table: PlanTable, q: Question, headroom_gib: float) -> pd.DataFrame:
    """Every plan of a (small) table as a frame: Optuna's structures, a measured stage's re-rank."""
    return frame(table, estimate_fitting(table, q, headroom_gib))


def best_completion(table: PlanTable, q: Question, headroom_gib: float) -> tuple[pd.DataFrame, int]:
    """(one row in full, its position) of a table of completions, priced on the search's light
    columns as the streamed walk prices its chunks (`estimate_table(..., search=True)`, the same
    figures): the fastest that fits (the first of equals), else the valid one closest to fitting,
    else the first (its rejection). Only that row is priced in full (Optuna's trials)."""
    est = estimate_fitting(table, q, headroom_gib, search=True)
    fits, valid = np.asarray(est[FITS], bool), np.asarray(est[VALID], bool)
    if fits.any():
        i = int(np.flatnonzero(fits)[np.argmin(est[RANK_TIME_S][fits])])
    elif valid.any():
        i = int(np.flatnonzero(valid)[np.argmin(est[MEMORY_MISS_GIB][valid])])
    else:
        i = 0
    return evaluate(table.take(np.array([i])), q, headroom_gib), i
