"""The measured stage's calibration: which trials may calibrate the cost model, the fit to them,
and the run's plans re-ranked with it (read by autopar.measured.trials between rounds and by
autopar.measured.results and `autopar calibrate` after the stage)."""

from __future__ import annotations

from autopar.calibration.calibrate import Calibration, calibrate
from autopar.figures import PEAK_MEMORY_BYTES, STEP_TIME_S
from autopar.search.run import SearchResult
from autopar.spec.plan import ParallelPlan


def calibrates(doc: dict) -> bool:
    """Whether a trial may take part in the calibration fit: it ran, and on the plan's hardware
    (a proxy or a trainer's run measured elsewhere, e.g. on the CPU for a GPU plan, is left out)."""
    return (
        doc.get("status") == "ok"
        and bool(doc.get("measured"))
        and not (doc.get("proxy") or {}).get("cross_hardware")
        and not doc.get("cross_hardware")  # a trainer run on other hardware (autopar.measured.own_run)
    )


def calibrate_docs(result: SearchResult, docs: list[dict]) -> Calibration | None:
    """Fit the cost model to the successful trials of the run measured on its hardware (None if
    fewer than 2)."""
    ok = [d for d in docs if calibrates(d)]
    if len(ok) < 2:
        return None
    q = result.question
    plans = [ParallelPlan.from_dict(d["plan"]) for d in ok]
    return calibrate(
        plans,
        [d["measured"][STEP_TIME_S] for d in ok],
        [d["measured"].get(PEAK_MEMORY_BYTES, 0.0) for d in ok],  # 0: none logged, no memory fit
        q.model,
        q.cluster,
        q.num_gpus,
        q.seq_len,
    )


def evaluate_with(result: SearchResult, calib: Calibration):
    """The run's plans re-evaluated with a calibrated cluster."""
    from dataclasses import replace

    from autopar.search.enumerate import Enumerator
    from autopar.search.streaming import StreamOptions, stream

    q = replace(result.question, cluster=calib.cluster)
    headroom = float(result.options.space.constraints.get("memory_headroom_gib", 0.0))
    return stream(q, Enumerator(result.options.space, q), StreamOptions(headroom_gib=headroom)).pool
