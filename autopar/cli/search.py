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
    as_json: o.Json = False,
) -> None:
    """Search every layout of the space for MODEL on GPUS: what fits, what is fastest, why.

    Example: autopar search --model 70b --gpus 256
    """
    from autopar.errors import InputError
    from autopar.search.scenarios import Scenario, run_scenarios
    from autopar.search.space import load_space
    from autopar.spec.presets import resolve_model

    spec = resolve_model(model)
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
                                run_dir=run_dir, progress=progress.update)
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
