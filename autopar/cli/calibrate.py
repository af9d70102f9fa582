"""`autopar calibrate RUN_DIR`: fit the cost model's constants to the run's trials, write a profile,
re-rank the untried plans, optionally measure more rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.figures import STEP_TIME_S
from autopar.measured.needs_torch import require_torch


def _question(run_dir: Path):
    """The run's question and space from search.json (the cluster as the search used it)."""
    from dataclasses import fields, replace

    from autopar.errors import InputError
    from autopar.search.run_dir import load
    from autopar.spec.hardware import ClusterSpec, CostConstants, default_cluster
    from autopar.spec.presets import model_from_dict
    from autopar.spec.question import Question

    info = load(run_dir).search  # a complete run directory of this autopar, or one line
    try:
        qd = info["question"]
        c = dict(qd["cluster"])
        base = default_cluster(c.pop("gpu"))
        consts = CostConstants(**c.pop("constants"))
        c = {k: v for k, v in c.items() if k in {f.name for f in fields(ClusterSpec)}}
        cluster = replace(base, **c, constants=consts)
        m = dict(qd["model"])
        model = model_from_dict(m.pop("name", "model"), m)
        q = Question(
            model=model,
            num_gpus=qd["num_gpus"],
            cluster=cluster,
            seq_len=qd["seq_len"],
            global_batch_size=qd["global_batch_size"],
        )
        return q, _space(info["space"], run_dir), info
    except (KeyError, TypeError, AttributeError) as e:
        raise InputError(
            f"'{run_dir}/search.json' lacks the question autopar calibrates ({type(e).__name__}: "
            f"{str(e)[:60]}); rerun `autopar search`"
        ) from None


def _space(sd: dict, run_dir: Path):
    """The run's search space: the shipped one of that name if its knobs match, else rebuilt from
    the knobs and constraints search.json recorded."""
    import yaml

    from autopar.errors import InputError
    from autopar.search.space import load_space

    try:
        space = load_space(sd["name"])
        if space.knobs == sd["knobs"] and space.constraints == sd["constraints"]:
            return space
    except InputError:
        pass
    path = run_dir / f"space-{sd['name']}.yaml"
    path.write_text(yaml.safe_dump({"name": sd["name"], "knobs": sd["knobs"], "constraints": sd["constraints"]}))
    return load_space(str(path))


@app.command()
def calibrate(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of `autopar search --trials`.")],
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Profile to write (default RUN_DIR/calibrated.yaml).")
    ] = None,
    top: Annotated[int, typer.Option("--top", help="Untried plans to list, re-ranked.")] = 5,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            help="Then measure this many more rounds of --trials plans "
            "from the re-ranked list, recalibrating after each.",
        ),
    ] = 0,
    trials: Annotated[int, typer.Option("--trials", help="Plans per round (with --rounds).")] = 4,
) -> None:
    """Fit efficiency, overlap and memory constants to RUN_DIR/trials/*.json (bounded least squares).

    Example: autopar calibrate reports/tiny_2xlocal_s128_gbs8_local --rounds 1
    """
    import yaml

    from autopar.calibration.calibrate import profile_dict
    from autopar.cli.checks import output_file
    from autopar.errors import InputError
    from autopar.measured.calibration import calibrate_docs, calibrates, evaluate_with
    from autopar.measured.trials import NOT_RUNNABLE, candidates, load_docs
    from autopar.search.run import SearchOptions, run_search
    from autopar.spec.schema import Limit, check_flag

    check_flag("--top", top)
    check_flag("--rounds", rounds, Limit(0, 1_000))
    check_flag("--trials", trials, Limit(1, 10_000))
    if rounds > 0:  # the fit alone needs no torch; more rounds run trials
        require_torch("autopar calibrate --rounds")
    q, space, info = _question(run_dir)
    output_file(out or run_dir / "calibrated.yaml", "--out" if out else "the profile path")
    docs = load_docs(run_dir / "trials")
    if sum(1 for d in docs.values() if calibrates(d)) < 2:  # before the search rewrites the run directory
        raise InputError(
            f"{run_dir}/trials has fewer than 2 successful trials on the plans' hardware to fit (proxies "
            f"measured elsewhere are left out); run more trials, e.g. with --launcher slurm"
        )
    from autopar.measured import hygiene

    result = run_search(q, SearchOptions(space=space, run_dir=run_dir), interrupts=hygiene)
    calib = calibrate_docs(result, list(docs.values()))
    if calib is None:
        raise InputError(
            f"{run_dir}/trials has fewer than 2 successful trials on the plans' hardware to fit; run "
            f"more trials, e.g. with --launcher slurm"
        )
    f = calib.time_fit
    print(f"Step-time fit ({'converged' if f.success else f.message}) over {len(f.residuals)} trials:")
    for n in f.names:
        print(f"  {n:28s} {getattr(q.cluster.constants, n):>10.4g} -> {getattr(calib.cluster.constants, n):.4g}")
    if calib.memory_fit:
        for n in calib.memory_fit.names:
            print(f"  {n:28s} {getattr(q.cluster.constants, n):>10.4g} -> {getattr(calib.cluster.constants, n):.4g}")
    ok = [d for d in docs.values() if calibrates(d)]
    print("Residuals (predicted/measured - 1), before -> after:")
    for d, r0, r1 in zip(ok, f.initial_residuals, f.residuals):
        print(f"  {d['key']:55s} {100 * r0:+7.1f}% -> {100 * r1:+7.1f}%")
    if calib.memory_fit:
        print(f"Memory residuals after: max |err| {100 * max(abs(calib.memory_fit.residuals)):.1f}%")
    print(f"Spearman: {calib.spearman_before:.3f} -> {calib.spearman_after:.3f}")
    dest = out or run_dir / "calibrated.yaml"
    dest.write_text(yaml.safe_dump(profile_dict(calib.cluster)))
    print(f"Profile: {dest} (use with --cluster)")
    ranking = candidates(result, evaluate_with(result, calib))
    untried = [(k, c) for k, c in ranking.items() if k not in docs][:top]
    print("Untried plans, re-ranked by the calibrated model:")
    for i, (k, c) in enumerate(untried, 1):
        print(f"  {i}. {k}  {c['predicted'][STEP_TIME_S]:.4f} s/step")
    if rounds > 0:
        from autopar.cli.measured import run_stage

        n_done = sum(1 for d in docs.values() if d.get("status") != NOT_RUNNABLE)
        run_stage(result, q.model, trials, n_done + trials, rounds + 1, 5, 120.0, None, False)
