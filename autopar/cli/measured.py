"""The measured stage of `autopar search --trials K` as the command runs it: the stage
(autopar.measured.stage), then its summary lines."""

from __future__ import annotations

import math
import sys

from autopar.measured.stage import TrialOptions
from autopar.measured.stage import run_stage as run_measured_stage


def run_stage(
    result,
    spec,
    k: int,
    budget,
    rounds: int,
    steps: int,
    timeout: float,
    storage,
    quiet: bool,
    study_name: str | None = None,
    options: TrialOptions | None = None,
) -> dict:
    """The measured stage over a search result, its log and summary on stdout (stderr when
    `quiet`: the command prints JSON); returns its figures."""
    out = sys.stderr if quiet else sys.stdout
    figs = run_measured_stage(result, spec, k, budget, rounds, steps, timeout, storage, out, study_name, options)
    print_measured(figs, file=out)
    return figs


def _s(v) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else "-"


def _rho(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) and v == v else "n/a (fewer than 2 distinct values)"


def print_measured(f: dict, file=None) -> None:
    """The measured stage's summary lines: counts, one line per candidate (how it ran, predicted vs
    measured, the proxy's own figures, or why it did not run), winner, Spearman, memory."""
    w = f.get("winner")
    proxies = f.get("proxies") or 0
    by = f.get("measured_with")
    lines = [
        f"Measured stage: {f['trialled']} plans trialled"
        + (f" with {by if isinstance(by, str) else ', '.join(by)} (its own code)" if by else "")
        + (f" ({proxies} as proxies)" if proxies else "")
        + f", {f['succeeded']} ran, {f['failed']} failed"
        + (f" ({'; '.join(f'{k}: {v}' for k, v in f['failures'].items())[:300]})" if f["failed"] else "")
        + (
            f", {f['pruned']} pruned mid-run ("
            + ", ".join(f"{k} after {n} steps" for k, n in f["pruned_after_steps"].items())[:300]
            + ")"
            if f.get("pruned")
            else ""
        )
        + (f"; {len(f['not_runnable'])} not runnable here" if f.get("not_runnable") else "")
    ]
    for r in f.get("candidates") or []:
        head = f"  {r['key']}: "
        if r["status"] == "not-runnable":
            lines.append(head + f"not run here, predicted {_s(r['predicted_step_time_s'])} s/step: {r['reason']}")
            continue
        how = "proxy" if r["kind"] == "proxy" else (r.get("measured_with") or "full size")
        text = head + f"{how}, {r['status']}, predicted {_s(r['predicted_step_time_s'])} s/step"
        if r.get("measured_step_time_s") is not None:
            text += f", measured {_s(r['measured_step_time_s'])}" + (" (scaled back)" if r["kind"] == "proxy" else "")
        if r["kind"] == "proxy" and r.get("proxy_step_time_s") is not None:
            text += (
                f"; the proxy: {_s(r['proxy_step_time_s'])} s measured vs {_s(r['proxy_predicted_step_time_s'])} "
                f"predicted here"
            )
        if r.get("reason"):
            text += f": {r['reason'][:200]}"
        lines.append(text)
    if w:
        lines.append(
            f"Winner (fastest measured that fitted): {w['key']} {w['measured_step_time_s']:.4f} s/step "
            f"(predicted {w['predicted_step_time_s']:.4f})"
            + (" — measured as a proxy, scaled back by the estimate's ratio" if proxies else "")
        )
        lines.append(
            f"Spearman predicted vs measured: analytic {_rho(f['spearman_analytic'])}"
            + (
                f", calibrated {_rho(f['spearman_calibrated'])}; measured-fastest in calibrated top 2: "
                f"{f['fastest_in_calibrated_top2']}"
                if "spearman_calibrated" in f
                else ""
            )
        )
        if "memory_error_max_abs" in f:  # a trainer's log may carry no memory figure
            lines.append(
                f"Peak memory ({'as the trainer logs it' if by else 'tensor'}) error, max |predicted/measured - 1|: "
                f"analytic {100 * f['memory_error_max_abs']:.1f}%"
                + (
                    f", calibrated {100 * f['memory_error_calibrated_max_abs']:.1f}%"
                    if "memory_error_calibrated_max_abs" in f
                    else ""
                )
            )
    iv = f.get("intervals") or {}
    if iv.get("half_width_log") is not None:
        lines.append(
            f"80 % interval of step time after calibration: the calibrated prediction x/ "
            f"{math.exp(iv['half_width_log']):.3f} (split conformal over {iv['trials']} trials; before: the "
            f"published runs' band of each plan's regime)"
        )
    if f.get("not_calibrated"):
        lines.append(
            f"Not calibrated on: {', '.join(f['not_calibrated']['keys'])[:200]} ({f['not_calibrated']['why']})"
        )
    if f.get("oversubscribed"):
        lines.append(f"Note: {f['oversubscribed']}")
    if "wall_s_measured_stage" in f:
        lines.append(f"Measured stage wall time: {f['wall_s_measured_stage']:.1f} s")
    print("\n".join(lines), file=file)
