"""The `trainers` of the top plans and their variants (autopar.search.run.runs_on: one pricing per
performance profile for every trainer, estimate_per_trainer) name exactly the trainers for which the
full estimate of that plan on that trainer fits (autopar.calibration.estimate.estimate_table, one plan and
one trainer at a time, the space's memory headroom applied): the answer the search gave before it
priced the plans shown in one pass."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autopar.calibration.estimate import estimate_table
from autopar.search.options import SearchOptions
from autopar.search.results import row_plan
from autopar.search.run import run_search
from autopar.spec.table import PlanTable


def _fits_alone(plan, q, headroom: float) -> bool:
    est = estimate_table(
        PlanTable.from_plans([plan]), q.model, q.cluster, num_gpus=q.num_gpus, seq_len=q.seq_len, headroom_gib=headroom
    )
    return bool(np.asarray(est["fits"])[0])


def test_trainers_shown_are_those_a_full_estimate_fits(sh, tmp_path):
    q, space = sh.question("llama3-70b", 64, "default")
    r = run_search(q, SearchOptions(space=space, run_dir=tmp_path / "run", top_k=6))
    headroom = float(space.constraints.get("memory_headroom_gib", 0.0))
    shown = pd.concat([r.top, r.variants], ignore_index=True)
    assert len(r.top) == 6 and len(r.variants) > 0  # both parts of the one pricing are exercised
    some_trainer_cannot = False
    for _, row in shown.iterrows():
        plan = row_plan(row, r.layouts)
        expect = [t for t in q.trainers if _fits_alone(plan.with_(trainer=t), q, headroom)]
        assert str(row["trainers"]) == ", ".join(expect), row["plan_name"]
        some_trainer_cannot |= len(expect) < len(q.trainers)
    assert some_trainer_cannot  # the list is not every trainer by construction
