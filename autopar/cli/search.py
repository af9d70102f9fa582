"""`autopar search`: which layouts fit and which is fastest, and why."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.cli.checks import check_routing_imbalance
from autopar.cli.run_flags import with_run_flags
from autopar.cli.trial_flags import TrialFlags, with_trial_flags
from autopar.errors import InputError, quoted
from autopar.json_out import dumps
from autopar.search.limits import DEFAULT_MAX_EXHAUSTIVE, RANK_BY
from autopar.spec.schema import check_flags
from autopar.spec.training_run import TrainingRun

# the options of `search` alone (those shared with other commands are in autopar.cli.options)
Gpus = Annotated[str, typer.Option("--gpus", "-g", help="GPU count, or a comma list for a what-if (128,256,512).")]
Gpu = Annotated[
    Optional[str],
    typer.Option(
        "--gpu",
        help="GPU preset, or a comma list (h100-sxm,b200); default h100-sxm (local, this machine's CPU "
        "profile, when --measure-with runs on a machine without GPUs).",
    ),
]
SeqLen = Annotated[Optional[str], typer.Option("--seq-len", "-s", help="Sequence length, or a comma list.")]
Gbs = Annotated[
    Optional[str],
    typer.Option(
        "--gbs",
        help="Global batch size in sequences, or a comma list for a what-if (default: the space's "
        "tokens_per_step, ~4M tokens).",
    ),
]
Dtype = Annotated[
    Optional[str],
    typer.Option(
        "--dtype",
        help="Precision of the plans (bf16, fp8, fp32), or a comma list for a what-if (bf16,fp8): sets the "
        "space's dtype knob (default: the space's).",
    ),
]
Space = Annotated[
    Optional[str],
    typer.Option(
        "--space",
        help="Search space: a name in search_spaces/ or a YAML file (default: chosen from the model and "
        "sequence length: default, moe, long-context from 32K tokens, or both).",
    ),
]
Trainer = Annotated[
    Optional[str],
    typer.Option(
        "--trainer",
        help="Only plans this trainer can run: megatron, nemo, bridge, torchtitan, deepspeed, or a comma "
        "list (default: every trainer, with the best plan of each).",
    ),
]
Recipe = Annotated[
    Optional[str],
    typer.Option(
        "--recipe",
        help="The recipe a trainer that starts from one runs a model without a preset on: NAME, or "
        "nemo=NAME,bridge=NAME (NeMo 2 recipe module, Megatron-Bridge recipe function); the exports use it.",
    ),
]
TopK = Annotated[int, typer.Option("--top-k", help="Plans to show and keep in top.json.")]
MaxExhaustive = Annotated[
    int,
    typer.Option(
        "--max-exhaustive",
        help="Largest space evaluated exhaustively; above it Optuna samples (0 forces Optuna; default: about "
        "ten seconds of exhaustive search).",
    ),
]
Sampler = Annotated[str, typer.Option("--sampler", help="tpe | nsga2 | random (Optuna mode).")]
NTrials = Annotated[int, typer.Option("--n-trials", help="Optuna trial budget of the study (Optuna mode).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Sampler seed.")]
Storage = Annotated[
    Optional[str],
    typer.Option(
        "--storage",
        help="Optuna storage URL (postgresql://, mysql://, sqlite:///) or a journal file (*.log); default: "
        "study.db in the run dir.",
    ),
]
StudyName = Annotated[Optional[str], typer.Option("--study-name", help="Study name (default: the run name).")]
MultiObjective = Annotated[
    bool,
    typer.Option("--multi-objective", help="Optuna mode: optimise throughput and memory headroom together (NSGA-II)."),
]
RunDir = Annotated[
    Optional[Path],
    typer.Option("--run-dir", help="Where results go (default: reports/<model>_<gpus>x<gpu>_s<seq>_gbs<gbs>_<space>)."),
]
RankBy = Annotated[
    str,
    typer.Option(
        "--rank-by",
        help="expected: rank by the central prediction (default); p80: by the pessimistic end of each "
        "plan's 80 % interval (the step time 90 % of outcomes beat).",
    ),
]
Csv = Annotated[bool, typer.Option("--csv", help="Also write plans.csv (every plan; plans.parquet always has them).")]


@app.command()
@with_trial_flags
@with_run_flags
def search(
    model: o.Model,
    gpus: Gpus,
    gpu: Gpu = None,
    gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None,
    power_limit: o.PowerLimit = None,
    routing_imbalance: o.RoutingImbalance = None,
    seq_len: SeqLen = None,
    gbs: Gbs = None,
    dtype: Dtype = None,
    space: Space = None,
    trainer: Trainer = None,
    recipe: Recipe = None,
    top_k: TopK = 10,
    max_exhaustive: MaxExhaustive = DEFAULT_MAX_EXHAUSTIVE,
    sampler: Sampler = "tpe",
    n_trials: NTrials = 200,
    seed: Seed = None,
    storage: Storage = None,
    study_name: StudyName = None,
    multi_objective: MultiObjective = False,
    run_dir: RunDir = None,
    csv: Csv = False,
    rank_by: RankBy = "expected",
    as_json: o.Json = False,
    run: Optional[TrainingRun] = None,
    measure: Optional[TrialFlags] = None,
) -> None:
    """Search every layout of the space for MODEL on GPUS: what fits, what is fastest, why.

    Example: autopar search --model 70b --gpus 256
    """
    check_flags({"--gpus-per-node": gpus_per_node, "--top-k": top_k, "--max-exhaustive": max_exhaustive})
    check_flags({"--n-trials": n_trials, "--seed": seed})
    assert measure is not None  # filled by @with_trial_flags
    if measure.trials > 0:  # before the analytic search, not after it
        from autopar.measured.needs_torch import require_torch

        require_torch("autopar search --trials")
    if rank_by not in RANK_BY:
        raise InputError(f"--rank-by {quoted(rank_by)} is not one of {', '.join(RANK_BY)}; choose one of them")
    gpu, trainer = _own_trainer_question(measure, gpu, trainer, cluster, quiet=as_json)
    spec, sp, scenarios, trainers = _question(
        model,
        gpus,
        gpu,
        cluster,
        seq_len,
        gbs,
        space,
        trainer,
        run_dir,
        storage,
        study_name,
        sampler,
        dtype,
        gpus_per_node,
        power_limit,
    )
    from autopar.spec.trainers import parse_recipes

    options = dict(top_k=top_k, max_exhaustive=max_exhaustive, sampler=sampler, n_trials=n_trials, seed=seed)
    options |= dict(storage=storage, study_name=study_name, multi_objective=multi_objective, run_dir=run_dir)
    options |= dict(rank_by=rank_by, recipes=parse_recipes(recipe, trainers), power_limit_w=power_limit)
    options |= dict(routing_imbalance=check_routing_imbalance(routing_imbalance))
    loaded = _read_back(scenarios, options)
    results = _run(spec, sp, scenarios, gpus_per_node, cluster, trainers, run, csv, quiet=as_json, **options)
    from autopar.report import write_reports  # after the question's checks: a bad input stays quick
    from autopar.search.scenarios import check_any_valid
    from autopar.search.training import check_run

    check_any_valid(results)  # no valid plan at all: one line, exit 2 (the run directory stays for a look)
    if measure.trials > 0:
        if len(results) != 1:
            raise InputError("--trials applies to one scenario")
        _measured_stage(results[0], spec, measure, storage, quiet=as_json, study_name=study_name)
    reports = write_reports([r.run_dir for r in results], loaded)  # RUN_DIR/report.html; a what-if links them
    answer = check_run(results, run)  # a deadline or budget no plan meets: one line, exit 1
    _show(results, reports, answer, as_json)


def _read_back(scenarios: list, options: dict) -> dict:
    """The runs a what-if's reports read, filled as each scenario's search ends (while the others are
    still searched: `run_scenarios`' on_result); one scenario reads its run when its report is written,
    after the measured stage (--trials takes one scenario)."""
    loaded: dict = {}
    if len(scenarios) > 1:
        from autopar.report import read_run

        options["on_result"] = lambda r: read_run(r.run_dir, loaded)
    return loaded


def _own_trainer_question(measure: TrialFlags, gpu: str | None, trainer: str | None, cluster, quiet: bool):
    """--gpu and --trainer under --measure-with TRAINER: the search ranks that trainer's plans, and on a
    machine without GPUs prices them on this machine's profile (local), which its runs calibrate."""
    home = measure.options.trainer if measure.trials > 0 else None
    if home is None:
        return gpu or "h100-sxm", trainer
    if trainer is None:
        trainer = home.trainer
    elif [t.strip() for t in trainer.split(",")] != [home.trainer]:
        raise InputError(
            f"--measure-with {home.trainer} measures {home.trainer}'s plans; drop --trainer {quoted(trainer)} "
            f"or make it --trainer {home.trainer}"
        )
    if gpu is None and cluster is None:
        from autopar.measured.resources import detect

        gpu = "h100-sxm" if detect().gpus else "local"
        if gpu == "local":
            print(
                "no GPU on this machine: the plans are priced on its CPU profile (--gpu local), which "
                f"{home.trainer}'s runs here calibrate; give --gpu to price another",
                file=sys.stderr if quiet else sys.stdout,
            )
    return gpu or "h100-sxm", trainer


def _run(
    spec, space, scenarios, gpus_per_node, cluster, trainers, run, csv, quiet: bool, rank_by="expected", **options
) -> list:
    """Every scenario's search (autopar.search.scenarios), with a progress bar unless `quiet`; Ctrl-C
    and SIGTERM leave the run directory marked incomplete (autopar.measured.hygiene)."""
    from autopar.cli.render_search import SearchProgress
    from autopar.measured import hygiene
    from autopar.search.scenarios import run_scenarios

    with SearchProgress(enabled=not quiet) as progress:
        return run_scenarios(
            spec,
            space,
            scenarios,
            gpus_per_node=gpus_per_node,
            cluster_file=cluster,
            progress=progress.update,
            trainers=trainers,
            rank_by=rank_by,
            csv=csv,
            interrupts=hygiene,
            training=run,
            **options,
        )


def _show(results: list, reports: list, answer, as_json: bool) -> None:
    """The results: JSON (one scenario, a list of them, or the whole run's answers with the
    scenarios), or the terminal tables and the reports' paths."""
    from autopar.cli.render import console
    from autopar.cli.render_search import print_answer, print_result, print_whatif
    from autopar.search.scenarios import result_json, space_bounds

    if as_json:
        out = [result_json(r) | {"report": str(Path(r.run_dir) / "report.html")} for r in results]
        doc = (out[0] if len(out) == 1 else out) if answer is None else {"scenarios": out} | answer.to_dict()
        print(dumps(doc, indent=2))
        return
    for r in results:
        for note in r.notes:  # wrapped at the terminal's width, as every table is
            line = f"autopar: {note}" if len(results) == 1 else f"autopar: {r.question.num_gpus:,} GPUs: {note}"
            console().print(line, markup=False, highlight=False)
    chosen = dict.fromkeys(f"{r.options.space.name} ({r.options.space.chosen_because})" for r in results)
    if all(r.options.space.chosen_because for r in results):  # one line: which space, and why
        console().print(f"Space: {'; '.join(chosen)}; pass --space to choose another", markup=False)
    if len(results) == 1:
        print_result(results[0])
    else:
        print_whatif(results)
    for i, r in enumerate(results, start=1):  # the winner on a bound of the space: it may decide the answer
        for bound in space_bounds(r):  # one per line: the tables' 120 columns
            console().print(f"Space bound{'' if len(results) == 1 else f' (scenario {i})'}: {bound}", markup=False)
    if answer is not None:
        print_answer(answer)
    for p in reports:
        print(f"Report: {p}")


def _question(
    model,
    gpus,
    gpu,
    cluster,
    seq_len,
    gbs,
    space,
    trainer,
    run_dir,
    storage,
    study_name,
    sampler,
    dtype,
    gpus_per_node,
    power_limit=None,
):
    """The model, the space, the scenarios (--gpus x --gpu x --seq-len x --gbs x --dtype) and the trainers of
    the command line, or one line naming the bad option. Checked before pandas, the cost model and
    the search are imported, so that a bad input fails in a fraction of a second (docs/benchmarks.md);
    the space's module (and numpy, through the plan's fields) only when --dtype or --space is given."""
    from autopar.search.limits import SAMPLERS
    from autopar.search.what_if import MAX_SCENARIOS, Scenario
    from autopar.spec.presets import resolve_model
    from autopar.spec.schema import parse_list
    from autopar.spec.trainers import parse_trainers

    gpu_counts = parse_list(gpus, "--gpus")
    gpu_kinds = parse_list(gpu, "--gpu", number=False) if not cluster else [None]
    seqs = parse_list(seq_len, "--seq-len") if seq_len is not None else None
    batches = parse_list(gbs, "--gbs") if gbs is not None else [None]
    dtypes: list = [None]  # None: the space's own dtype knob
    if dtype is not None:
        from autopar.search.space import check_choices

        dtypes = list(dict.fromkeys(parse_list(dtype, "--dtype", number=False, example="bf16,fp8")))
        check_choices("dtype", dtypes, "--dtype")
    for flag, value in (("--storage", storage), ("--study-name", study_name)):
        if value is not None and not value.strip():
            raise InputError(f"{flag} is empty; give a value or leave the option out")
    if sampler not in SAMPLERS:
        raise InputError(f"--sampler {quoted(sampler)} is not one of {', '.join(SAMPLERS)}; choose one of them")
    spec = resolve_model(model)
    if gpu == "local" and space is None:
        space = "local"  # CPU trials: fp32, small batch, the knobs the trial model runs
    sp = None  # None: chosen per scenario (run_scenarios)
    if space is not None:
        from autopar.search.space import load_space

        sp = load_space(space)
    trainers = parse_trainers(trainer, "local" if gpu_kinds == ["local"] else "")
    scenarios = [
        Scenario(num_gpus=g, gpu=k, seq_len=s, gbs=b, dtype=d)
        for k in gpu_kinds
        for g in gpu_counts
        for s in (seqs or [spec.seq_len])
        for b in batches
        for d in dtypes
    ]
    if len(scenarios) > MAX_SCENARIOS:
        raise InputError(
            f"this what-if has {len(scenarios):,} scenarios (--gpus x --gpu x --seq-len x --gbs x --dtype); "
            f"give at most {MAX_SCENARIOS}"
        )
    if len(scenarios) > 1 and (storage or study_name or run_dir):
        raise InputError("--storage, --study-name and --run-dir apply to one scenario; drop them for a what-if")
    from autopar.spec.resolve import resolve_cluster

    for kind in gpu_kinds:  # a bad --gpu or --cluster file fails here, not after the search is imported
        resolve_cluster(kind or "h100-sxm", gpus_per_node, cluster, power_limit)  # as run_scenarios does
    return spec, sp, scenarios, trainers


def _measured_stage(result, spec, measure: TrialFlags, storage, quiet: bool, study_name: str | None = None) -> dict:
    """Optuna's measured stage over the search result (autopar.measured.stage: where the trials run,
    as they are or as proxies, or on the cluster); figures into measured.json and search.json."""
    from autopar.cli.measured import run_stage

    m = measure
    return run_stage(
        result,
        spec,
        m.trials,
        m.trial_budget,
        m.rounds,
        m.trial_steps,
        m.trial_timeout,
        storage,
        quiet,
        study_name=study_name,
        options=m.options,
    )


def print_measured(f: dict, file=None) -> None:
    """The measured stage's summary lines (autopar.cli.measured.print_measured)."""
    from autopar.cli.measured import print_measured as show

    show(f, file=file)
