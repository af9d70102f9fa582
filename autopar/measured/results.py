"""What the measured stage found: the trials that calibrate the cost model, the calibration fitted
to them, the untried plans re-ranked with it, and the stage's acceptance figures (Spearman rank
correlation of predicted and measured step times, memory error)."""

from __future__ import annotations

import math
import warnings

from autopar.calibration.calibrate import predict, spearman
from autopar.calibration.uncertainty import LEVEL, conformal_half_width
from autopar.figures import INTERVAL, PEAK_MEMORY_BYTES, STEP_TIME_S
from autopar.measured.calibration import calibrates
from autopar.measured.trials import NOT_RUNNABLE, MeasuredStage
from autopar.search.run import SearchResult
from autopar.spec.plan import ParallelPlan


def acceptance(result: SearchResult, stage: MeasuredStage) -> dict:
    """The figures of the measured stage: winner, Spearman before/after calibration, whether the
    measured-fastest plan is in the calibrated model's top 2, memory errors, counts (pruned plans
    ran only their first steps and no memory trial: counted apart, left out of the fits)."""
    q = result.question
    ok = [stage.docs[k] for k in stage.order if k in stage.docs and stage.docs[k].get("status") == "ok"]
    pruned = [stage.docs[k] for k in stage.order if k in stage.docs and stage.docs[k].get("status") == "pruned"]
    failed = [
        stage.docs[k] for k in stage.order if k in stage.docs and stage.docs[k].get("status") not in ("ok", "pruned")
    ]
    out: dict = {
        "trialled": len(stage.order),
        "succeeded": len(ok),
        "failed": len(failed),
        "failures": {d["key"]: d.get("reasons") for d in failed},
        "pruned": len(pruned),
        "pruned_after_steps": {d["key"]: (d.get("measured") or {}).get("steps_run") for d in pruned},
        "proxies": sum(1 for d in ok if d.get("kind") == "proxy"),
        "not_runnable": {
            k: (d.get("reasons") or [""])[0] for k, d in stage.docs.items() if d.get("status") == NOT_RUNNABLE
        },
        "candidates": candidate_rows(stage),
    }
    cross = [d["key"] for d in ok if not calibrates(d)]
    if cross:
        out["not_calibrated"] = {
            "keys": cross,
            "why": "measured on other hardware than the plans are priced on (ranked, left out of the "
            "calibration fit" + (")" if any(d.get("measured_with") for d in ok) else "; proxies scaled back)"),
        }
    trainers = sorted({d["measured_with"] for d in stage.docs.values() if d.get("measured_with")})
    if trainers:
        out["measured_with"] = trainers[0] if len(trainers) == 1 else trainers
    if not ok:
        return out
    meas = [d["measured"][STEP_TIME_S] for d in ok]
    fastest = ok[min(range(len(ok)), key=lambda i: meas[i])]
    out["winner"] = {
        "key": fastest["key"],
        "measured_step_time_s": fastest["measured"][STEP_TIME_S],
        "predicted_step_time_s": fastest["predicted"].get(STEP_TIME_S),
    }
    plans = [ParallelPlan.from_dict(d["plan"]) for d in ok]
    before_t, before_m = predict(plans, q.model, q.cluster, q.num_gpus, q.seq_len)
    # a trainer's log may carry no memory figure (autopar.measured.trainer_logs): 0, left out here
    mem = [float(d["measured"].get(PEAK_MEMORY_BYTES) or 0.0) for d in ok]
    with warnings.catch_warnings():  # tied predictions (or one trial): no rank correlation, NaN
        warnings.simplefilter("ignore")
        out["spearman_analytic"] = spearman(before_t, meas)
    out["memory_error_analytic"] = {d["key"]: float(p / m - 1) for d, p, m in zip(ok, before_m, mem) if m > 0}
    if out["memory_error_analytic"]:
        out["memory_error_max_abs"] = max(abs(v) for v in out["memory_error_analytic"].values())
    if stage.calibration is not None:
        c = stage.calibration
        after_t, after_m = predict(plans, q.model, c.cluster, q.num_gpus, q.seq_len)
        top2 = sorted(range(len(ok)), key=lambda i: after_t[i])[:2]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out["spearman_calibrated"] = spearman(after_t, meas)
        out["fastest_in_calibrated_top2"] = fastest["key"] in [ok[i]["key"] for i in top2]
        out["calibrated_constants"] = {n: float(getattr(c.cluster.constants, n)) for n in c.time_fit.names}
        out["time_residuals_calibrated"] = {d["key"]: float(p / m - 1) for d, p, m in zip(ok, after_t, meas)}
        if any(m > 0 for m in mem):
            out["memory_error_calibrated_max_abs"] = float(max(abs(p / m - 1) for p, m in zip(after_m, mem) if m > 0))
        out["intervals"] = intervals_before_after(ok, after_t, meas)
    return out


def intervals_before_after(ok: list[dict], after_t, measured) -> dict:
    """Each measured plan's 80 % step-time interval before calibration (the published runs' band)
    and after it: the calibrated prediction x exp(+-h), h the conformal half-width of the calibrated
    trials' residuals ln(measured / calibrated) (autopar.calibration.uncertainty); None with too few trials."""
    residuals = [math.log(m / p) for p, m in zip(after_t, measured)]
    h = conformal_half_width(residuals)
    plans = {}
    for d, p in zip(ok, after_t):
        before = (d.get("predicted") or {}).get(INTERVAL[STEP_TIME_S])
        after = None if h is None else [float(p * math.exp(-h)), float(p * math.exp(h))]
        plans[d["key"]] = {"before": before, "after": after, "calibrated_step_time_s": float(p)}
    return {"level": LEVEL, "trials": len(residuals), "half_width_log": h, "plans": plans}


def candidate_rows(stage: MeasuredStage) -> list[dict]:
    """Per trialled or refused plan: how it ran (full / proxy / not-runnable), predicted, measured
    (a proxy's scaled back) and the proxy's own measured and predicted step time and memory."""
    rows = []
    order = list(stage.order) + [
        k for k, d in stage.docs.items() if d.get("status") == NOT_RUNNABLE and k not in stage.order
    ]
    for k in order:
        d = stage.docs.get(k)
        if d is None:
            continue
        m, p = d.get("measured") or {}, d.get("predicted") or {}
        own = m.get("proxy") or {}
        rows.append(
            {
                "key": k,
                "kind": d.get("kind") or ("proxy" if d.get("proxy") else "full"),
                "measured_with": d.get("measured_with"),
                "status": d.get("status"),
                "predicted_step_time_s": p.get(STEP_TIME_S),
                "measured_step_time_s": m.get(STEP_TIME_S),
                "proxy_step_time_s": own.get(STEP_TIME_S),
                "proxy_predicted_step_time_s": own.get("predicted_step_time_s"),
                "predicted_peak_memory_bytes": p.get(PEAK_MEMORY_BYTES),
                "measured_peak_memory_bytes": m.get(PEAK_MEMORY_BYTES),
                "proxy": (d.get("proxy") or {}).get("summary"),
                "reason": "; ".join(d.get("reasons") or []) if d.get("status") != "ok" else "",
            }
        )
    return rows
