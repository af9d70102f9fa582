"""`autopar estimate`: memory, time and throughput of one plan, with the breakdowns."""

from __future__ import annotations

import json
import math

from autopar.cli import app
from autopar.cli import options as o
from autopar.cli.plan_flags import with_plan_flags
from autopar.spec.resolve import PlanRequest


@app.command()
@with_plan_flags
def estimate(
    model: o.Model, gpus: o.Gpus, gpu: o.Gpu = "h100-sxm", gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None, seq_len: o.SeqLen = None, routing_imbalance: o.RoutingImbalance = 1.0,
    as_json: o.Json = False, plan: PlanRequest = PlanRequest(),
) -> None:
    """Estimate one plan: fits?, peak memory per GPU, step time, tokens/s, MFU, and why.

    The trainer (--trainer, default megatron; autopar's built-in model on --gpu local) is part of the
    plan: a plan it cannot run is refused with the reason, and the estimate uses its performance profile.

    Example: autopar estimate --model 70b --gpus 256 --tp 8 --pp 4 --seq-len 8192 --gbs 512
    """
    from autopar.cli.render import estimate_tables, trainer_line
    from autopar.cost.estimate import estimate as run_estimate
    from autopar.errors import InputError
    from autopar.spec.presets import resolve_model
    from autopar.spec.resolve import default_dtype, resolve_cluster, resolve_plan
    from autopar.spec.trainers import default_trainer

    spec = resolve_model(model)
    clus = resolve_cluster(gpu, gpus_per_node, cluster)
    s = spec.seq_len if seq_len is None else seq_len
    the_plan = resolve_plan(spec, gpus, s, plan.with_defaults(dtype=default_dtype(clus),
                                                             trainer=default_trainer(clus.gpu.key)))
    if not math.isfinite(routing_imbalance) or routing_imbalance < 1:
        raise InputError(f"--routing-imbalance must be >= 1 (busiest / mean), got {routing_imbalance}")
    est = run_estimate(the_plan, spec, clus, num_gpus=gpus, seq_len=s, routing_imbalance=routing_imbalance)
    if not est.valid:
        raise InputError("invalid plan: " + "; ".join(est.reasons))
    trainer, profile = trainer_line(est, clus)
    if as_json:
        out = est.to_dict()
        out.update(model=spec.name, gpu=clus.gpu.key, num_gpus=gpus, seq_len=s, trainer=trainer, profile=profile)
        print(json.dumps(out, indent=2, default=float))
        return
    from autopar.cli.render import console

    out = console()
    for renderable in estimate_tables(est, spec, clus, gpus, s):
        out.print(renderable)
