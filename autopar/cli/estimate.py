"""`autopar estimate`: memory, time and throughput of one plan, with the breakdowns."""

from __future__ import annotations

import json
import math

from autopar.cli import app
from autopar.cli import options as o


@app.command()
def estimate(
    model: o.Model, gpus: o.Gpus, gpu: o.Gpu = "h100-sxm", gpus_per_node: o.GpusPerNode = None,
    cluster: o.ClusterFile = None, tp: o.Tp = 1, pp: o.Pp = 1, vpp: o.Vpp = 1, cp: o.Cp = 1, dp: o.Dp = None,
    ep: o.Ep = 1, etp: o.Etp = None, zero: o.Zero = 1, sp: o.Sp = None, mbs: o.Mbs = 1, gbs: o.Gbs = None,
    seq_len: o.SeqLen = None, pp_schedule: o.PpSchedule = None, recompute: o.Recompute = "none",
    recompute_layers: o.RecomputeLayers = None, dtype: o.Dtype = None, grads: o.Grads = "fp32",
    pp_layout: o.PpLayout = None, pp_first: o.PpFirst = None, pp_last: o.PpLast = None,
    pp_embedding_as_layer: o.EmbeddingAsLayer = False, pp_loss_as_layer: o.LossAsLayer = False,
    routing_imbalance: o.RoutingImbalance = 1.0, tp_comm_overlap: o.TpCommOverlap = False,
    as_json: o.Json = False,
) -> None:
    """Estimate one plan: fits?, peak memory per GPU, step time, tokens/s, MFU, and why.

    Example: autopar estimate --model 70b --gpus 256 --tp 8 --pp 4 --seq-len 8192 --gbs 512
    """
    from autopar.cost.estimate import estimate as run_estimate
    from autopar.errors import InputError
    from autopar.cli.render import estimate_tables
    from autopar.spec.presets import resolve_model
    from autopar.spec.resolve import default_dtype, resolve_cluster, resolve_plan

    spec = resolve_model(model)
    clus = resolve_cluster(gpu, gpus_per_node, cluster)
    dtype = dtype or default_dtype(clus)
    s = spec.seq_len if seq_len is None else seq_len
    plan = resolve_plan(spec, gpus, s, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, vpp=vpp, zero=zero, sp=sp,
                        mbs=mbs, gbs=gbs, pp_schedule=pp_schedule, recompute=recompute,
                        recompute_layers=recompute_layers, dtype=dtype, grads=grads, pp_layout=pp_layout,
                        pp_first=pp_first, pp_last=pp_last, embedding_as_layer=pp_embedding_as_layer,
                        loss_as_layer=pp_loss_as_layer, tp_comm_overlap=tp_comm_overlap)
    if not math.isfinite(routing_imbalance) or routing_imbalance < 1:
        raise InputError(f"--routing-imbalance must be >= 1 (busiest / mean), got {routing_imbalance}")
    est = run_estimate(plan, spec, clus, num_gpus=gpus, seq_len=s, routing_imbalance=routing_imbalance)
    if not est.valid:
        raise InputError("invalid plan: " + "; ".join(est.reasons))
    if as_json:
        out = est.to_dict()
        out.update(model=spec.name, gpu=clus.gpu.key, num_gpus=gpus, seq_len=s)
        print(json.dumps(out, indent=2, default=float))
        return
    from autopar.cli.render import console

    out = console()
    for renderable in estimate_tables(est, spec, clus, gpus, s):
        out.print(renderable)
