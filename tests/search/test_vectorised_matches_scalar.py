"""The vectorised estimate of a whole enumerated table equals the scalar `estimate` of each plan:
`estimate_table` on thousands of rows (pipelines of different depths padded side by side, layout
variants, invalid and non-fitting plans mixed in) must not let one row leak into another.

A few hundred plans are drawn with a seeded RNG from the enumerations of three questions (dense,
MoE, long context); every estimate column is compared to 1e-9 relative."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar.calibration.estimate import estimate, estimate_table
from autopar.figures import AXES, MEMORY_TERMS, TIME_TERMS
from autopar.search.enumerate import enumerate_plans

RTOL = 1e-9
PER_QUESTION = 140

QUESTIONS = {
    "dense-llama3-70b-256": ("llama3-70b", 256, "default", 8192),
    "moe-mixtral-8x7b-64": ("mixtral-8x7b", 64, "moe", None),
    "long-context-llama3-8b-64-128k": ("llama3-8b", 64, "long-context", 131072),
}


def close(a, b) -> bool:
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) or abs(a - b) <= 1e-300


@pytest.fixture(scope="module", params=list(QUESTIONS), ids=list(QUESTIONS))
def case(request, sh):
    model, gpus, space_name, seq = QUESTIONS[request.param]
    q, space = sh.question(model, gpus, space_name, seq)
    table = enumerate_plans(space, q)
    cols = estimate_table(table, q.model, q.cluster, num_gpus=q.num_gpus, seq_len=q.seq_len, every_rank=True)
    rng = np.random.default_rng(20240601 + len(request.param))
    # a seeded draw, plus every layout variant's first row so uneven layouts are always covered
    idx = set(rng.choice(len(table), size=min(PER_QUESTION, len(table)), replace=False).tolist())
    for lid in np.unique(table.layout_id[table.layout_id >= 0])[:10]:
        idx.add(int(np.flatnonzero(table.layout_id == lid)[0]))
    return q, table, cols, sorted(idx)


def test_sample_is_diverse(case):
    """The draw covers what the padding could confuse: several pipeline depths, interleaving,
    uneven layouts, and plans that are invalid or do not fit as well as plans that fit."""
    q, table, cols, idx = case
    idx = np.asarray(idx)
    assert len(np.unique(table.pp[idx])) >= 3
    assert np.any(table.vpp[idx] > 1)
    if np.any(table.layout_id >= 0):  # the 80-layer dense case has uneven variants; 32-layer ones do not
        assert np.any(table.layout_id[idx] >= 0)
    assert np.any(cols["fits"][idx]) and np.any(~cols["fits"][idx])
    if q.model.moe is not None:
        assert np.any(table.ep[idx] > 1)


def test_every_column_matches_scalar_estimate(case):
    q, table, cols, idx = case
    mismatches = []

    def check(i, name, vec, scal):
        if isinstance(scal, (bool, np.bool_)) or isinstance(vec, (bool, np.bool_)):
            ok = bool(vec) == bool(scal)
        elif isinstance(scal, str) or isinstance(vec, str):
            ok = str(vec) == str(scal)
        else:
            ok = close(vec, scal)
        if not ok:
            mismatches.append(f"row {i} {table.plan(i).describe()}: {name} table={vec!r} scalar={scal!r}")

    for i in idx:
        plan = table.plan(i)
        e = estimate(plan, q.model, q.cluster, num_gpus=q.num_gpus, seq_len=q.seq_len)
        check(i, "valid", cols["valid"][i], e.valid)
        check(i, "fits", cols["fits"][i], e.fits)
        check(i, "step_time_s", cols["step_time_s"][i], e.step_time_s)
        for t in TIME_TERMS:
            check(i, f"time_{t}", cols[f"time_{t}"][i], e.time_s[t])
        for t in MEMORY_TERMS:
            check(i, f"mem_{t}", cols[f"mem_{t}"][i], e.memory_bytes[t])
        for a in AXES:
            check(i, f"comm_bytes_{a}", cols[f"comm_bytes_{a}"][i], e.comm_bytes_per_gpu[a])
        for name in (
            "peak_memory_bytes",
            "tokens_per_s",
            "tokens_per_s_per_gpu",
            "model_tflops_per_gpu",
            "mfu",
            "hfu",
            "bubble_fraction",
            "params_total",
            "params_per_gpu",
            "memory_capacity_bytes",
        ):
            check(i, name, cols[name][i], getattr(e, name))
        check(i, "num_microbatches", int(cols["num_microbatches"][i]), e.num_microbatches)
        check(i, "layout", cols["layout_text"][i], e.layout)
        for name in ("memory_rank", "pace_rank", "stage_imbalance", "model_flops_per_step"):
            check(i, name, cols[name][i], e.extra[name])
        # the rejection: a valid plan that does not fit names memory; an invalid one has reasons
        check(i, "memory_miss_gib>0", cols["memory_miss_gib"][i] > 0, e.valid and not e.fits)
        if not e.valid:
            assert cols["rejected_by"][i] and e.reasons, f"row {i}: invalid without a reason"
        elif e.fits:
            check(i, "rejected_by", cols["rejected_by"][i], "")
        else:
            check(i, "rejected_by", cols["rejected_by"][i], "memory")
        # per pipeline rank
        assert len(e.extra["stages"]) == plan.pp
        for st in e.extra["stages"]:
            r = st["rank"]
            check(i, f"stage{r}.memory", cols["stage_memory_bytes"][r, i], st["memory_bytes"])
            check(i, f"stage{r}.time_per_mb", cols["stage_time_per_mb"][r, i], st["time_per_mb_s"])
            check(i, f"stage{r}.params", cols["stage_params"][r, i], st["params"])
            check(i, f"stage{r}.layers", cols["stage_layers"][r, i], st["layers"])
            for a in AXES:
                check(i, f"stage{r}.comm_{a}", cols[f"stage_comm_bytes_{a}"][r, i], st["comm_bytes"][a])
        # ranks beyond this plan's pipeline are padding: nothing there
        assert not np.any(cols["stage_active"][plan.pp :, i])
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:20])


def test_scalar_plans_round_trip(case):
    """table.plan(i) is the row: a one-row table built from it has the same columns."""
    from autopar.spec.table import PlanTable

    _, table, _, idx = case
    plans = [table.plan(i) for i in idx]
    back = PlanTable.from_plans(plans)
    for name in (
        "tp",
        "pp",
        "dp",
        "cp",
        "ep",
        "etp",
        "vpp",
        "zero_stage",
        "micro_batch_size",
        "global_batch_size",
        "schedule",
        "recompute",
        "recompute_layers",
        "dtype",
        "sequence_parallel",
        "tp_comm_overlap",
    ):
        assert np.array_equal(back.columns[name], table.columns[name][idx]), name
