"""Predicted vs measured peak memory of CPU trials (tiny model, world 2), before any calibration.

Each plan runs as the search's memory trial (autopar.measured.measure.trial_configs: AdamW, 2 steps,
the second measured as live tensor bytes, autopar.trial.memory), all in one torchrun launch; the
prediction is the cost model's on the `local` profile's defaults (training stack "torch",
allocator_overhead_fraction 0, nothing reserved), per pipeline rank. Prints one row per plan:
the peak rank's prediction and measurement, the error, every rank's pair, and the predicted terms.

    .venv/bin/python benchmarks/bench_memory_accuracy.py [--plans JSON] [--json]

With --published it launches nothing and prints instead the published memory figures of the bundled
calibration runs against the estimate of the same quantity (autopar.calibration.memory_published: what
each source's figure measures, the prediction, the error, MAPE per source) and every published run
the estimate predicts not to fit (tests/cost/test_memory_published.py asserts the same):

    .venv/bin/python benchmarks/bench_memory_accuracy.py --published [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from autopar.calibration.estimate import estimate
from autopar.measured.launcher import launch
from autopar.measured.measure import trial_configs
from autopar.spec.hardware import LOCAL_DEFAULTS, cluster_from_dict, load_cluster_file
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset

MIB = 2**20
#: the search's CPU space (search_spaces/local.yaml: tp/pp/vpp, gpipe/1f1b, mbs, ZeRO 0/1/3,
#: gbs 8) plus ZeRO-2, recompute, context parallelism and zero-bubble
PLANS: list[dict] = [
    {"tp": 2},
    {"tp": 2, "micro_batch_size": 4},
    {"tp": 2, "sequence_parallel": False},
    {"tp": 2, "recompute": "full"},
    {"tp": 2, "recompute": "selective"},
    {"dp": 2, "zero_stage": 0},
    {"dp": 2, "zero_stage": 0, "micro_batch_size": 4},
    {"dp": 2, "zero_stage": 1},
    {"dp": 2, "zero_stage": 1, "micro_batch_size": 2},
    {"dp": 2, "zero_stage": 1, "recompute": "full"},
    {"dp": 2, "zero_stage": 2},
    {"dp": 2, "zero_stage": 3},
    {"dp": 2, "zero_stage": 3, "micro_batch_size": 4},
    {"dp": 2, "zero_stage": 3, "micro_batch_size": 2, "recompute": "selective"},
    {"pp": 2, "pp_schedule": "1f1b"},
    {"pp": 2, "pp_schedule": "1f1b", "micro_batch_size": 2},
    {"pp": 2, "pp_schedule": "1f1b", "recompute": "full"},
    {"pp": 2, "pp_schedule": "gpipe"},
    {"pp": 2, "pp_schedule": "gpipe", "micro_batch_size": 4},
    {"pp": 2, "pp_schedule": "gpipe", "recompute": "selective"},
    {"pp": 2, "vpp": 2, "pp_schedule": "interleaved-1f1b"},
    {"pp": 2, "vpp": 2, "pp_schedule": "interleaved-1f1b", "recompute": "full", "recompute_layers": 1},
    {"cp": 2},
    {"cp": 2, "recompute": "full"},
    {"pp": 2, "pp_schedule": "zero-bubble"},
]


def run(plans: list[dict], model: str = "tiny", gbs: int = 8, cluster=None) -> list[dict]:
    spec = get_preset(model)
    cluster = cluster or cluster_from_dict(LOCAL_DEFAULTS, origin="local defaults")
    full = [ParallelPlan(dtype="fp32", global_batch_size=gbs, **p) for p in plans]
    configs = [trial_configs(model, p.to_dict(), name=f"plan{i}")[1] for i, p in enumerate(full)]
    with tempfile.TemporaryDirectory() as work:
        res = launch(configs, 2, timeout_s=900, workdir=Path(work))
    if not res.succeeded:
        sys.exit(f"launch {res.outcome}: {'; '.join(res.reasons)}\n{res.stderr_tail[-3000:]}")
    rows = []
    for plan, trial in zip(full, res.trials):
        est = estimate(plan, spec, cluster, num_gpus=2)
        stages = est.extra["stages"]
        ranks = [(r["peak_memory_bytes"], stages[r["coords"]["pp"]]["memory_bytes"]) for r in trial["ranks"]]
        measured = max(m for m, _ in ranks)
        label = plan.describe() + ("-nosp" if plan.tp > 1 and not plan.sequence_parallel else "")
        rows.append(
            {
                "plan": label,
                "schedule": plan.pp_schedule,
                "zero": plan.zero_stage,
                "mbs": plan.micro_batch_size,
                "recompute": plan.recompute + (f"/{plan.recompute_layers}" if plan.recompute_layers else ""),
                "predicted": est.peak_memory_bytes,
                "measured": measured,
                "error": est.peak_memory_bytes / measured - 1,
                "rank_errors": [p / m - 1 for m, p in ranks],
                "method": trial["ranks"][0]["memory_method"],
                "terms": est.memory_bytes,
            }
        )
    return rows


def published(as_json: bool) -> None:
    """The published-memory comparison (no trials)."""
    from autopar.calibration.memory_published import compare_published_memory
    from autopar.calibration.run_cases import build_cases
    from autopar.calibration.run_rows import load_runs

    runs = load_runs(None)
    result = compare_published_memory(build_cases(runs)[0], runs)
    figures = [
        {
            "row_id": c.row_id,
            "source": c.source,
            "measures": f"{c.figure.quantity} ({c.figure.ranks}{', ' + c.figure.variant if c.figure.variant else ''})",
            "published_gib": c.figure.gib,
            "predicted_gib": c.predicted_gib,
            "error": c.error,
        }
        for c in result.comparisons
    ]
    misses = [
        {"row_id": f.row_id, "required_gib": f.required_gib, "capacity_gib": f.capacity_gib} for f in result.not_fitting
    ]
    peaks = result.mape(lambda c: c.figure.quantity in ("reserved", "device"))
    summary = {"by_source": result.by_source(), "mape": result.mape(), "mape_measured_peaks": peaks}
    if as_json:
        print(json.dumps({"figures": figures, **summary, "not_fitting": misses, "checked": len(result.fit_checks)}))
        return
    for f in figures:
        print(
            f"{f['row_id']:>4s} {f['source']:17s} {f['measures']:42s} published {f['published_gib']:7.2f} GiB  "
            f"predicted {f['predicted_gib']:7.2f} GiB  {100 * f['error']:+6.1f}%"
        )
    for source, s in result.by_source().items():
        mape, worst = 100 * s["mape"], 100 * s["max_abs_error"]
        print(f"{source:17s} {s['figures']:3d} figures  MAPE {mape:5.1f}%  max {worst:5.1f}%")
    print(f"all figures MAPE {100 * result.mape():.1f}%; measured peaks (nanotron, BLOOM) {100 * peaks:.1f}%")
    over = ", ".join(f"{m['row_id']} ({m['required_gib']:.1f} > {m['capacity_gib']:.1f} GiB)" for m in misses)
    print(f"{len(result.fit_checks)} runs checked; predicted not to fit: {over or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", help="JSON list of plan dicts (default: the built-in list)")
    ap.add_argument("--profile", type=Path, help="hardware profile YAML (default: the local defaults)")
    ap.add_argument("--published", action="store_true", help="compare the published runs' memory instead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.published:
        published(args.json)
        return
    rows = run(
        json.loads(args.plans) if args.plans else PLANS,
        cluster=load_cluster_file(args.profile) if args.profile else None,
    )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{'plan':12s} {'schedule':16s} {'ZeRO':>4s} {'mbs':>3s} {'recompute':10s} {'pred MiB':>9s} "
        f"{'meas MiB':>9s} {'error':>7s}  ranks   | predicted W/G/O/A/other MiB"
    )
    for r in rows:
        t = r["terms"]
        print(
            f"{r['plan']:12s} {r['schedule']:16s} {r['zero']:4d} {r['mbs']:3d} {r['recompute']:10s} "
            f"{r['predicted'] / MIB:9.3f} {r['measured'] / MIB:9.3f} {100 * r['error']:+6.1f}%  "
            + " ".join(f"{100 * e:+.1f}%" for e in r["rank_errors"])
            + "  | "
            + "/".join(f"{t[k] / MIB:.2f}" for k in ("weights", "gradients", "optimizer", "activations", "other"))
        )
    worst = max(rows, key=lambda r: abs(r["error"]))
    print(
        f"{len(rows)} plans ({rows[0]['method']}); worst {worst['plan']} {worst['schedule']} "
        f"{100 * worst['error']:+.1f}%; within 10%: {sum(abs(r['error']) <= 0.10 for r in rows)}/{len(rows)}"
    )


if __name__ == "__main__":
    main()
