"""`autopar estimate`: memory, time and throughput of one plan, with the breakdowns."""

from __future__ import annotations

import shlex
from typing import Optional

from autopar.cli import app
from autopar.cli import options as o
from autopar.cli.plan_flags import with_plan_flags
from autopar.cli.run_flags import with_run_flags
from autopar.figures import PEAK_MEMORY_BYTES
from autopar.json_out import dumps
from autopar.spec.resolve import PlanRequest
from autopar.spec.training_run import TrainingRun


@app.command()
@with_run_flags
@with_plan_flags
def estimate(
    model: o.Model,
    gpus: o.Gpus,
    gpu: o.Gpu = "h100-sxm",
    gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None,
    power_limit: o.PowerLimit = None,
    seq_len: o.SeqLen = None,
    routing_imbalance: o.RoutingImbalance = None,
    as_json: o.Json = False,
    plan: PlanRequest = PlanRequest(),
    run: Optional[TrainingRun] = None,
) -> None:
    """Estimate one plan: fits?, peak memory per GPU, step time, tokens/s, MFU, and why.

    The trainer (--trainer, default megatron; autopar's built-in model on --gpu local) is part of the
    plan: a plan it cannot run is refused with the reason, and the estimate uses its performance profile.

    With --tokens: days to train, GPU-hours, cost and goodput after checkpoints and failures.

    Example: autopar estimate --model 70b --gpus 256 --tp 8 --pp 4 --seq-len 8192 --gbs 512
    """
    from autopar.calibration.estimate import estimate as run_estimate
    from autopar.cli.checks import check_routing_imbalance
    from autopar.cli.render import estimate_tables, trainer_line
    from autopar.errors import InputError
    from autopar.spec.presets import resolve_model
    from autopar.spec.resolve import default_dtype, resolve_cluster, resolve_plan
    from autopar.spec.routing import REAL_ROUTER_IMBALANCE
    from autopar.spec.trainers import default_trainer

    spec = resolve_model(model)
    clus = resolve_cluster(gpu, gpus_per_node, cluster, power_limit)
    s = spec.seq_len if seq_len is None else seq_len
    the_plan = resolve_plan(
        spec, gpus, s, plan.with_defaults(dtype=default_dtype(clus), trainer=default_trainer(clus.gpu.key))
    )
    if routing_imbalance is None:  # a real router's (autopar.spec.routing), capped at ep by the model
        routing_imbalance = min(REAL_ROUTER_IMBALANCE, float(the_plan.ep)) if spec.moe else 1.0
    check_routing_imbalance(routing_imbalance, the_plan.ep)
    est = run_estimate(the_plan, spec, clus, num_gpus=gpus, seq_len=s, routing_imbalance=routing_imbalance)
    if not est.valid:
        raise InputError("invalid plan: " + "; ".join(est.reasons))
    trainer, profile = trainer_line(est, clus)
    if run is not None:
        run.check_one_step(the_plan.global_batch_size, s)
    whole = None if run is None else whole_run(est, spec, clus, gpus, run, model)
    from autopar.cost.ep_detail import ep_details
    from autopar.cost.profiles import priced_cluster

    dispatch = ep_details(the_plan, spec, priced_cluster(clus, trainer), gpus, s, routing_imbalance)
    fits_with = fit_flags(est, spec, clus, gpus, s, routing_imbalance)
    if as_json:
        out = est.to_dict() | ({"fits_with": fits_with} if fits_with else {})
        out.update(model=spec.name, gpu=clus.gpu.key, num_gpus=gpus, seq_len=s, trainer=trainer, profile=profile)
        out.update(routing_imbalance=routing_imbalance, ep_dispatch=[d.to_dict() for d in dispatch])
        if whole is not None:
            assert run is not None  # whole is priced only for a run
            out["run"] = whole.to_dict() | {"training_run": run.to_dict()}
        print(dumps(out, indent=2))
        return
    from autopar.cli.render import console, ep_table, run_table

    term = console()
    tables = estimate_tables(est, spec, clus, gpus, s, fits_with) + ep_table(dispatch, the_plan, routing_imbalance)
    for renderable in tables + ([] if whole is None else [run_table(whole, run)]):
        term.print(renderable)


def fit_flags(est, spec, cluster, gpus: int, seq_len: int, routing_imbalance: float) -> dict | None:
    """The FP8 flag that fits a plan that does not fit: keeping the FP8 parameters and all-gathering
    them in one byte (--fp8-param-gather on) where the trainer leaves it off by default (Megatron-LM's
    delayed scaling; Megatron-Bridge's registered recipes turn it on: one Megatron-Core trainer's plan
    is another's with this flag). {"flags", "peak_memory_bytes"}, or None where it is not the fix."""
    from autopar.calibration.estimate import estimate as run_estimate

    plan = est.plan
    if est.fits or plan.dtype != "fp8" or plan.fp8_param_gather_used or plan.fp8_param_gather == "off":
        return None
    on = plan.with_(fp8_param_gather="on")
    other = run_estimate(on, spec, cluster, num_gpus=gpus, seq_len=seq_len, routing_imbalance=routing_imbalance)
    if not (other.valid and other.fits):
        return None
    return {"flags": "--fp8-param-gather on", PEAK_MEMORY_BYTES: other.peak_memory_bytes}


def whole_run(est, spec, cluster, gpus: int, run: TrainingRun, model: str):
    """The plan's whole run (autopar.cost.goodput.run_time), or UnmetGoal (one line, exit 1) when it
    misses the deadline or the budget, saying what it needs."""
    from autopar.cost.goodput import finish_problem, run_time
    from autopar.errors import InputError, UnmetGoal
    from autopar.spec.training_run import deadline_text, money_text, tokens_text

    run.check_prices([cluster.gpu])
    never = finish_problem(cluster.reliability, gpus, spec.params_total, fp32=est.plan.dtype == "fp32")
    if never:
        raise InputError(never)
    r = run_time(
        run.tokens,
        est.tokens_per_s,
        gpus,
        spec.params_total,
        fp32=est.plan.dtype == "fp32",
        rel=cluster.reliability,
        price_per_gpu_hour=run.price_for(cluster.gpu),
        power_w=cluster.operating_gpu.power_w,
    )
    what = f"this plan needs {float(r.days):.1f} days for {tokens_text(run.tokens)} tokens"
    what_if = f"--gpus {gpus},{2 * gpus},{4 * gpus} --tokens {tokens_text(run.tokens)}"
    search = f"autopar search --model {shlex.quote(model)} {what_if}"
    if run.deadline_s is not None and float(r.wall_s) > run.deadline_s:
        raise UnmetGoal(
            f"{what}, past {deadline_text(run.deadline_s)}; find a plan that meets it: {search} "
            f"--deadline {run.deadline_s / 86_400:g}d"
        )
    if run.budget is not None:
        assert r.cost is not None  # --budget needs a price (autopar.spec.training_run)
        if float(r.cost) > run.budget:
            raise UnmetGoal(
                f"this plan costs {money_text(float(r.cost))} for {tokens_text(run.tokens)} tokens, over the "
                f"budget of {money_text(run.budget)}; raise --budget, or compare GPU counts: {search}"
            )
    return r
