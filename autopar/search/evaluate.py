"""Pricing a (small) table of plans for a search question: Optuna's structures, the top plans
priced on every trainer, a measured stage's re-rank."""

from __future__ import annotations

import pandas as pd

from autopar.cost.estimate import estimate_table
from autopar.search.enumerate import Question
from autopar.search.results import frame
from autopar.search.streaming import apply_headroom, set_rank_time
from autopar.spec.table import PlanTable


def estimate_fitting(table: PlanTable, q: Question, headroom_gib: float) -> dict:
    """Every estimate column of a (small) table, the space's memory headroom applied."""
    est = estimate_table(table, q.model, q.cluster, num_gpus=q.num_gpus, seq_len=q.seq_len)
    apply_headroom(est, headroom_gib)
    set_rank_time(est, q.rank_by)
    return est


def evaluate(table: PlanTable, q: Question, headroom_gib: float) -> pd.DataFrame:
    """Every plan of a (small) table as a frame: Optuna's structures, a measured stage's re-rank."""
    return frame(table, estimate_fitting(table, q, headroom_gib))
