"""The streamed exhaustive search (autopar.search.streaming) is exact: priced in small chunks, with
its running state pruned again and again, it keeps the same pool, Pareto front, sample, closest
miss, counts and rejection counts as one chunk holding the whole space, and those equal what plain
pandas computes from every plan's estimate (the non-search path, with the rejection reasons as
text), on every shipped space."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autopar.calibration.estimate import estimate_table
from autopar.report.scatter_tables import pareto_mask
from autopar.search.enumerate import Enumerator
from autopar.search.results import frame
from autopar.search.space import load_space, space_names
from autopar.search.streaming import LAYOUT_KEY, StreamOptions, stream
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question

pytestmark = [pytest.mark.slow]  # every shipped space, streamed and in one piece: about 8 s

CASES = [("llama3-70b", 256), ("qwen3-30b-a3b", 64), ("tiny", 2)]
#: small enough that a chunk of a few thousand plans overflows the running state (it is pruned)
SMALL = dict(pool=7, sample=40, per_layout=1)


def _question(model: str, gpus: int) -> Question:
    m = get_preset(model)
    return Question(m, gpus, default_cluster("h100-sxm"), m.seq_len, 512)


def _reference(space, q: Question, headroom: float) -> pd.DataFrame:
    """Every plan priced in one table by the non-search path (reasons as text, per-rank columns)."""
    e = Enumerator(space, q)
    table = e.chunk(0, e.total)
    est = estimate_table(
        table,
        q.model,
        q.cluster,
        num_gpus=q.num_gpus,
        seq_len=q.seq_len,
        headroom_gib=headroom,
        routing_imbalance=q.routing_imbalance,
    )
    return frame(table, est)


@pytest.mark.parametrize("space_name", space_names())
@pytest.mark.parametrize("model,gpus", CASES, ids=[m for m, _ in CASES])
def test_streamed_equals_one_shot_and_pandas(space_name, model, gpus):
    space, q = load_space(space_name), _question(model, gpus)
    headroom = float(space.constraints.get("memory_headroom_gib", 0.0))
    e = Enumerator(space, q)
    if e.total == 0:
        pytest.skip(f"{space_name} holds no plan for {model} on {gpus} GPUs")
    whole = stream(q, e, StreamOptions(chunk=e.total + 1, headroom_gib=headroom, **SMALL))
    parts = stream(q, e, StreamOptions(chunk=1021, headroom_gib=headroom, **SMALL))
    for name in ("pool", "pareto", "sample", "closest"):
        a, b = getattr(whole, name), getattr(parts, name)
        assert a["plan_index"].tolist() == b["plan_index"].tolist(), name
    assert (whole.evaluated, whole.valid, whole.fit) == (parts.evaluated, parts.valid, parts.fit)
    assert whole.rejections == parts.rejections

    ref = _reference(space, q, headroom)
    assert ref["plan_index"].is_unique  # the place in the full walk, as the stream numbers it
    assert (whole.evaluated, whole.valid, whole.fit) == (len(ref), int(ref["valid"].sum()), int(ref["fits"].sum()))
    # rejection counts: bitmasks in the stream, reason text here
    counts: dict[str, int] = {}
    for text in ref.loc[~ref["fits"], "rejected_by"]:
        for label in text.split(", "):
            counts[label] = counts.get(label, 0) + 1
    assert whole.rejections == counts
    fit = ref[ref["fits"]].sort_values(["step_time_s", "peak_memory_bytes", "plan_index"], kind="stable")
    pool = pd.concat(
        [
            fit.groupby("trainer", sort=False).head(SMALL["pool"]),
            fit.groupby(list(LAYOUT_KEY), sort=False).head(SMALL["per_layout"]),
        ]
    )
    assert sorted(whole.pool["plan_index"]) == sorted(set(pool["plan_index"]))
    # the front by another algorithm (throughput up, memory down; one of exact duplicates)
    mask = pareto_mask(fit["tokens_per_s"].to_numpy(), fit["peak_memory_bytes"].to_numpy())
    assert len(whole.pareto) == int(mask.sum())
    front = whole.pareto.set_index("plan_index")
    assert (np.sort(front["peak_memory_bytes"].to_numpy()) == np.sort(fit["peak_memory_bytes"].to_numpy()[mask])).all()
    near = ref[ref["valid"] & ~ref["fits"]].sort_values(["memory_miss_gib", "plan_index"], kind="stable")
    assert whole.closest["plan_index"].tolist() == near["plan_index"].head(1).tolist()
    # the kept rows carry the reference's every column, exactly (the search prices the time on
    # fewer pipeline ranks and each plan once per profile: the same numbers, bit for bit)
    kept = pd.concat([whole.pool, whole.sample, whole.closest]).drop_duplicates("plan_index").set_index("plan_index")
    same = ref.set_index("plan_index").loc[kept.index]
    shared = [c for c in kept.columns if c in same.columns]
    assert len(shared) > 60
    for col in shared:
        assert kept[col].astype(str).tolist() == same[col].astype(str).tolist(), col
