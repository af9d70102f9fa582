"""The torchtitan job layout of a plan, and back: the settings (section -> {field: value}) that
both config formats write (`torchtitan_values`), and the plan those settings express once read back
from the files (`view_from_torchtitan`). The mapping is listed in autopar/export/torchtitan.py."""

from __future__ import annotations

from autopar.export.base import Context
from autopar.export.header import tp_overlap
from autopar.export.layouts import stages_from_fqns, torchtitan_fqns
from autopar.export.view import normalize

SCHEDULES = {
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "gpipe": "GPipe",
    "zero-bubble": "InterleavedZeroBubble",
}
SCHEDULES_BACK = {v: k for k, v in SCHEDULES.items()}
RESHARD = {2: "never", 3: "always"}
RESHARD_BACK = {v: k for k, v in RESHARD.items()}


def torchtitan_values(ctx: Context, toml: bool) -> dict:
    """The torchtitan settings of the plan, section -> {field: value}."""
    p = ctx.plan
    replicate, shard = (p.dp, 1) if p.zero_stage == 0 else (1, p.dp)
    par: dict = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": RESHARD.get(p.zero_stage, "default"),
        "tensor_parallel_degree": p.tp,
    }
    if not toml:
        par["enable_sequence_parallel"] = bool(p.sequence_parallel)
    if toml:
        par["enable_async_tensor_parallel"] = tp_overlap(p)
    par["pipeline_parallel_degree"] = p.pp
    if p.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[str(p.pp_schedule)]  # set by the plan (fill_followers)
        par["pipeline_parallel_microbatch_size"] = p.micro_batch_size
        par["module_fqns_per_model_part"] = torchtitan_fqns(ctx.stages, "output" if toml else "lm_head")
    par["context_parallel_degree"] = p.cp
    par["expert_parallel_degree"] = p.ep
    if toml:
        par["expert_tensor_parallel_degree"] = p.etp if p.ep > 1 else 1
    backend = "deepep" if ctx.model.moe is not None and p.moe_dispatcher == "deepep" else "standard"
    if toml and ctx.model.moe is not None:
        par["expert_parallel_comm_backend"] = backend
    local = p.micro_batch_size * p.num_microbatches if p.pp > 1 else p.micro_batch_size
    training = {
        "local_batch_size": local,
        "global_batch_size": p.global_batch_size,
        "seq_len": ctx.seq_len,
        "mixed_precision_param": "float32" if p.dtype == "fp32" else "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    if not toml and (p.pp > 1 or p.ep > 1):
        # torchtitan >= 0.3 captures CUDA graphs by default and refuses them with PP or the all-to-all
        # EP dispatcher (Trainer.Config._validate_cuda_graphs); autopar's estimate assumes none
        training["disable_cuda_graphs"] = True
    compile_ = {"enable": tp_overlap(p), "components": ["model", "loss"]}
    if not toml:
        compile_["enable_async_tensor_parallel"] = tp_overlap(p)
    return {
        "parallelism": par,
        "training": training,
        "activation_checkpoint": p.recompute,
        "compile": compile_,
        "float8": p.dtype == "fp8",
        "moe_comm_backend": backend,
    }


def view_from_torchtitan(cfg: dict, num_gpus: int) -> dict:
    """The plan from torchtitan settings (as parse_torchtitan_* return them) and the world size."""
    par, tr = cfg["parallelism"], cfg["training"]
    tp, pp, cp = (
        par.get("tensor_parallel_degree", 1),
        par.get("pipeline_parallel_degree", 1),
        par.get("context_parallel_degree", 1),
    )
    rep, shard = par.get("data_parallel_replicate_degree", 1), par.get("data_parallel_shard_degree", -1)
    if shard < 0:
        shard = num_gpus // (rep * cp * tp * pp)
    if rep * shard * cp * tp * pp != num_gpus:
        raise ValueError("dp_replicate * dp_shard * cp * tp * pp != world size")
    dp = rep * shard
    zero = 0 if rep > 1 else RESHARD_BACK.get(par.get("fsdp_reshard_after_forward", "default"), 3)
    local, gbs = tr["local_batch_size"], tr["global_batch_size"]
    if gbs < 0:
        gbs = local * dp
    accum = gbs // (local * dp)
    if pp > 1:
        mbs = par.get("pipeline_parallel_microbatch_size", 1)
        m = (local // mbs) * accum
        parts = par.get("module_fqns_per_model_part")
        stages = stages_from_fqns(parts) if parts else None
        vpp = len(parts) // pp if parts else 1
        schedule = SCHEDULES_BACK[par.get("pipeline_parallel_schedule", "1F1B")]
    else:
        mbs, m, stages, vpp, schedule = local, accum, None, 1, None
    ep = par.get("expert_parallel_degree", 1)
    etp = cfg["etp"] if cfg["etp"] is not None else (1 if ep > 1 else tp)
    if ep == 1:
        etp = tp
    return normalize(
        {
            "num_gpus": num_gpus,
            "tp": tp,
            "pp": pp,
            "vpp": vpp,
            "cp": cp,
            "dp": dp,
            "ep": ep,
            "etp": etp,
            "sequence_parallel": par.get("enable_sequence_parallel", True) if tp > 1 else False,
            "zero_stage": zero,
            "micro_batch_size": mbs,
            "global_batch_size": gbs,
            "num_microbatches": m,
            "pp_schedule": schedule,
            "layout": stages,
            "recompute": cfg["activation_checkpoint"],
            "dtype": "fp8" if cfg["float8"] else ("fp32" if tr.get("mixed_precision_param") == "float32" else "bf16"),
            "main_grads_fp32": tr.get("mixed_precision_reduce", "float32") == "float32",
            "tp_comm_overlap": bool(
                par.get("enable_async_tensor_parallel") or cfg["compile"].get("enable_async_tensor_parallel")
            ),
            "moe_dispatcher": "deepep" if cfg["moe_comm_backend"] == "deepep" else "alltoall",
            # no partial recompute, MoE dispatch dropless only, no EP all-to-all overlap across
            # microbatches: those fields read back as the plan's defaults (normalize)
        }
    )
