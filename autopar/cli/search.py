"""`autopar search`: which layouts fit and which is fastest, and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o


def _list(text: str, kind, flag: str) -> list:
    from autopar.errors import InputError

    try:
        return [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} '{text}' must be a comma-separated list, e.g. 128,256") from None


@app.command()
def search(
    model: o.Model,
    gpus: Annotated[str, typer.Option("--gpus", "-g", help="GPU count, or a comma list for a what-if (128,256,512).")],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU preset, or a comma list (h100-sxm,b200).")] = "h100-sxm",
    gpus_per_node: o.GpusPerNode = None, cluster: o.ClusterFile = None,
    seq_len: Annotated[Optional[str], typer.Option("--seq-len", "-s", help="Sequence length, or a comma list.")] = None,
    gbs: o.Gbs = None,
    space: Annotated[str, typer.Option("--space", help="Search space: a name in search_spaces/ or a YAML file.")] = "default",
    trainer: Annotated[Optional[str], typer.Option("--trainer", help="Only plans this trainer can run: megatron, nemo, "
                                                   "bridge, torchtitan, deepspeed, or a comma list (default: every "
                                                   "trainer, with the best plan of each).")] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Plans to show and keep in top.json.")] = 10,
    max_exhaustive: Annotated[int, typer.Option("--max-exhaustive", help="Largest space evaluated exhaustively; "
                                                "above it Optuna samples (0 forces Optuna).")] = 2_000_000,
    sampler: Annotated[str, typer.Option("--sampler", help="tpe | nsga2 | random (Optuna mode).")] = "tpe",
    n_trials: Annotated[int, typer.Option("--n-trials", help="Optuna trial budget of the study (Optuna mode).")] = 200,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Sampler seed.")] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", help="Optuna storage URL (postgresql://, mysql://, "
                                                   "sqlite:///) or a journal file (*.log); default: study.db in the run dir.")] = None,
    study_name: Annotated[Optional[str], typer.Option("--study-name", help="Study name (default: the run name).")] = None,
    multi_objective: Annotated[bool, typer.Option("--multi-objective", help="Optuna mode: optimise throughput and "
                                                  "memory headroom together (NSGA-II).")] = False,
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Where results go (default: "
                                                    "reports/<model>_<gpus>x<gpu>_s<seq>_gbs<gbs>_<space>).")] = None,
    trials: Annotated[int, typer.Option("--trials", help="Measured stage: run the analytic top-K plans for real "
                                        "(torchrun on this machine), ranked by measured step time.")] = 0,
    trial_budget: Annotated[Optional[int], typer.Option("--trial-budget", help="Plans to measure per round "
                                                        "(>= K; the sampler proposes the rest).")] = None,
    rounds: Annotated[int, typer.Option("--rounds", help="Measure, recalibrate, re-rank the untried, repeat.")] = 1,
    trial_steps: Annotated[int, typer.Option("--trial-steps", help="Timed steps per trial (after warm-up).")] = 5,
    trial_timeout: Annotated[float, typer.Option("--trial-timeout", help="Seconds before a trial is killed.")] = 120.0,
    as_json: o.Json = False,
) -> None:
    """Search every layout of the space for MODEL on GPUS: what fits, what is fastest, why.

    Example: autopar search --model 70b --gpus 256
    """
    from autopar.errors import InputError
    from autopar.search.scenarios import Scenario, run_scenarios
    from autopar.search.space import load_space
    from autopar.spec.presets import resolve_model
    from autopar.spec.trainers import parse_trainers

    trainers = parse_trainers(trainer)
    spec = resolve_model(model)
    if gpu == "local" and space == "default":
        space = "local"  # CPU trials: fp32, small batch, the knobs the trial model runs
    sp = load_space(space)
    gpu_counts = _list(gpus, int, "--gpus")
    gpu_kinds = _list(gpu, str, "--gpu") if not cluster else [None]
    seqs = _list(seq_len, int, "--seq-len") if seq_len else [spec.seq_len]
    if any(g <= 0 for g in gpu_counts) or any(s <= 0 for s in seqs) or (gbs is not None and gbs <= 0) \
            or top_k <= 0 or n_trials <= 0 or max_exhaustive < 0:
        raise InputError("--gpus, --seq-len, --gbs, --top-k and --n-trials must be positive")
    scenarios = [Scenario(num_gpus=g, gpu=k, seq_len=s) for k in gpu_kinds for g in gpu_counts for s in seqs]
    if len(scenarios) > 1 and (storage or study_name or run_dir):
        raise InputError("--storage, --study-name and --run-dir apply to one scenario; drop them for a what-if")
    from autopar.cli.render_search import SearchProgress, print_result, print_whatif

    with SearchProgress(enabled=not as_json) as progress:
        results = run_scenarios(spec, sp, scenarios, gpus_per_node=gpus_per_node, cluster_file=cluster, gbs=gbs,
                                top_k=top_k, max_exhaustive=max_exhaustive, sampler=sampler, n_trials=n_trials,
                                seed=seed, storage=storage, study_name=study_name, multi_objective=multi_objective,
                                run_dir=run_dir, progress=progress.update, trainers=trainers)
    if trials > 0:
        if len(results) != 1:
            raise InputError("--trials applies to one scenario")
        _measured_stage(results[0], spec, trials, trial_budget, rounds, trial_steps, trial_timeout, storage,
                        quiet=as_json, study_name=study_name)
    from autopar.report import write_reports

    reports = write_reports([r.run_dir for r in results])  # RUN_DIR/report.html; a what-if links them
    if as_json:
        from autopar.search.scenarios import result_json

        out = [result_json(r) | {"report": str(Path(r.run_dir) / "report.html")} for r in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, default=float))
        return
    if len(results) == 1:
        print_result(results[0])
    else:
        print_whatif(results)
    for p in reports:
        print(f"Report: {p}")


def _measured_stage(result, spec, k: int, budget, rounds: int, steps: int, timeout: float, storage, quiet: bool,
                    study_name: str | None = None) -> None:
    """Optuna's measured stage over the search result; figures into measured.json and search.json
    (written atomically: another worker may share the run directory)."""
    import sys
    import time

    from autopar.search.atomic import write_atomic
    from autopar.search.trials import acceptance, run_measured
    from autopar.trial.measure import measure_plan

    q = result.question
    model = spec.to_dict() | {"name": spec.name}
    peak = q.cluster.gpu.peak_flops("bf16") / 2 if q.cluster.gpu.key == "local" else q.cluster.gpu.peak_flops("bf16")
    workroot = Path(result.run_dir) / "trials" / "work"

    def measure(plan: dict, predicted: dict, on_step) -> dict:
        from autopar.search.trials import plan_key

        return measure_plan(model, plan, q.num_gpus, predicted=predicted, steps=steps, timeout_s=timeout,
                            seq_len=q.seq_len, workdir=workroot / plan_key(plan), peak_flops=peak, on_step=on_step)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if quiet else sys.stdout, flush=True)

    t0 = time.perf_counter()
    # another worker's trial ends within its timeout; one of another host silent far longer is dead
    stage = run_measured(result, measure, k, budget, rounds, storage=storage, log=log, study_name=study_name,
                         stale_after_s=max(600.0, 4 * timeout), wait_s=timeout + 60)
    figs = acceptance(result, stage) | {"wall_s_measured_stage": time.perf_counter() - t0}
    import os

    cores = os.cpu_count() or 1
    if q.cluster.gpu.key == "local" and q.num_gpus > cores:
        figs["oversubscribed"] = (f"{q.num_gpus} ranks on {cores} cores: the timings mostly measure CPU contention "
                                  f"and are not comparable with the cost model's one-core-per-rank profile")
    try:
        figs["load_average"] = os.getloadavg()  # other work on the machine distorts CPU timings
    except OSError:
        pass
    if stage.calibration is not None:
        import yaml

        from autopar.cost.calibrate import profile_dict

        write_atomic(Path(result.run_dir) / "calibrated.yaml", yaml.safe_dump(profile_dict(stage.calibration.cluster)))
    write_atomic(Path(result.run_dir) / "measured.json", json.dumps(figs, indent=2, default=float))
    info_path = Path(result.run_dir) / "search.json"
    info = json.loads(info_path.read_text())
    info["measured"] = figs
    write_atomic(info_path, json.dumps(info, indent=2, default=str))
    print_measured(figs, file=sys.stderr if quiet else sys.stdout)


def print_measured(f: dict, file=None) -> None:
    """The measured stage's summary lines."""
    w = f.get("winner")
    lines = [f"Measured stage: {f['trialled']} plans trialled, {f['succeeded']} ran, {f['failed']} failed"
             + (f" ({'; '.join(f'{k}: {v}' for k, v in f['failures'].items())[:300]})" if f["failed"] else "")
             + (f", {f['pruned']} pruned mid-run (" + ", ".join(f"{k} after {n} steps" for k, n in
                                                             f["pruned_after_steps"].items())[:300] + ")"
                if f.get("pruned") else "")]
    if w:
        lines.append(f"Winner (fastest measured that fitted): {w['key']} {w['measured_step_time_s']:.4f} s/step "
                     f"(predicted {w['predicted_step_time_s']:.4f})")
        lines.append(f"Spearman predicted vs measured: analytic {f['spearman_analytic']:.3f}"
                     + (f", calibrated {f['spearman_calibrated']:.3f}; measured-fastest in calibrated top 2: "
                        f"{f['fastest_in_calibrated_top2']}" if "spearman_calibrated" in f else ""))
        lines.append(f"Peak memory (tensor) error, max |predicted/measured - 1|: analytic "
                     f"{100 * f['memory_error_max_abs']:.1f}%"
                     + (f", calibrated {100 * f['memory_error_calibrated_max_abs']:.1f}%"
                        if "memory_error_calibrated_max_abs" in f else ""))
    if f.get("oversubscribed"):
        lines.append(f"Note: {f['oversubscribed']}")
    if "wall_s_measured_stage" in f:
        lines.append(f"Measured stage wall time: {f['wall_s_measured_stage']:.1f} s")
    print("\n".join(lines), file=file)
