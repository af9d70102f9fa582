"""Megatron-Core settings shared by the Megatron-LM, NeMo 2 and Megatron-Bridge exporters: the
TransformerConfig / ModelParallelConfig / DistributedDataParallelConfig values of a plan (ZeRO as
Megatron-FSDP strategies, recompute, MoE dispatch, the layout fields), and the plan read back from them.

Field names are Megatron-Core 0.16's (megatron/core/transformer/transformer_config.py,
megatron/core/distributed/distributed_data_parallel_config.py), checked by
tests/export/test_export_trainers.py against the installed package.
"""

from __future__ import annotations

from autopar.export.base import Context
from autopar.export.header import ep_overlap
from autopar.export.layouts import megatron_layout, stages_from_megatron
from autopar.export.view import normalize
from autopar.figures import NUM_MICROBATCHES

ZERO_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
#: delayed scaling's amax history: Megatron-Bridge 0.3.1's bf16_with_fp8_delayed_scaling_mixed
#: recipe (training/mixed_precision.py; the bridge export's mixed_precision), the same
#: TransformerConfig fields for Megatron-LM's flags; the other recipes keep no history
DELAYED_AMAX = {"fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max"}
FSDP_STRATEGY_ZERO = {v: k for k, v in ZERO_FSDP_STRATEGY.items()}


def fp8_settings(ctx: Context) -> dict:
    """TransformerConfig FP8 fields of an FP8 plan: the recipe (megatron/core/transformer/
    transformer_config.py fp8_recipe), with delayed scaling's amax history; none without FP8."""
    recipe = ctx.plan.fp8_recipe_used
    if recipe is None:
        return {}
    return {"fp8_recipe": recipe} | (DELAYED_AMAX if recipe == "delayed" else {})


def mxfp8_param_settings(ctx: Context) -> dict:
    """DDP / optimizer fields of a plan that keeps MXFP8 parameters: the parameter all-gather
    reuses the gradient buffer (Megatron-Core's OptimizerConfig warns that MXFP8 without it "will
    use significant amount additional GPU memory" and recommends it with --fp8-param-gather;
    Megatron-Bridge asserts it; NeMo 2's bf16_with_mxfp8_mixed sets it), which the cost model's
    memory assumes; none otherwise."""
    p = ctx.plan
    if p.fp8_recipe_used == "mxfp8" and p.fp8_param_gather_used:
        return {"reuse_grad_buf_for_mxfp8_param_ag": True}
    return {}


def capacity_settings(ctx: Context) -> dict:
    """TransformerConfig MoE dispatch fields: capacity dispatch drops the lowest-probability tokens
    past the capacity factor and pads every expert to its capacity (megatron/core/transformer/moe/
    moe_utils.py, token_dispatcher.py); dropless: none of them (Megatron's default)."""
    p = ctx.plan
    if ctx.model.moe is None or p.moe_dispatch != "capacity":
        return {}
    assert p.capacity_factor is not None  # capacity dispatch: ParallelPlan sets 1.0 when not given
    return {
        "moe_expert_capacity_factor": float(p.capacity_factor),
        "moe_token_drop_policy": "probs",
        "moe_pad_expert_input_to_capacity": True,
    }


def dispatcher_settings(ctx: Context) -> dict:
    """TransformerConfig token-dispatcher fields (megatron/core/transformer/moe/token_dispatcher.py):
    NCCL all-to-all, or the flex dispatcher with the DeepEP backend; and the EP all-to-all overlap
    with another microbatch's compute (overlap_moe_expert_parallel_comm, combined_1f1b.py)."""
    p = ctx.plan
    out: dict[str, object] = {"moe_token_dispatcher_type": "flex" if p.moe_dispatcher == "deepep" else "alltoall"}
    if p.moe_dispatcher == "deepep":
        out["moe_flex_dispatcher_backend"] = "deepep"
    if ep_overlap(p):
        out["overlap_moe_expert_parallel_comm"] = True
    return out


def dispatcher_from(dispatcher_type: str | None, backend: str | None) -> str:
    """moe_dispatcher from Megatron's token-dispatcher settings."""
    if dispatcher_type in (None, "alltoall"):
        return "alltoall"
    if dispatcher_type == "flex" and backend in (None, "deepep"):
        return "deepep"
    raise ValueError(f"token dispatcher {dispatcher_type}/{backend} is not one autopar emits")


def dispatch_from(capacity_factor, drop_policy, pad: bool) -> tuple[str, float | None]:
    """(moe_dispatch, capacity_factor) from Megatron's MoE dispatch settings."""
    if capacity_factor is None:
        return "dropless", None
    if drop_policy != "probs" or not pad:
        raise ValueError(f"capacity dispatch with drop policy {drop_policy} and padding {pad} is not one autopar emits")
    return "capacity", float(capacity_factor)


def recompute_settings(ctx: Context) -> dict:
    """TransformerConfig recompute fields for the plan."""
    p = ctx.plan
    if p.recompute == "selective":  # the modules always explicit, so a recipe's own cannot linger
        return {"recompute_granularity": "selective", "recompute_modules": list(p.selective_modules)}
    if p.recompute == "full":
        if p.recompute_layers is None:
            return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
        return {
            "recompute_granularity": "full",
            "recompute_method": "block",
            "recompute_num_layers": p.recompute_layers // p.vpp,
        }
    return {}


def recompute_from(
    granularity: str | None, method: str | None, num_layers: int | None, vpp: int, modules: list | None = None
) -> tuple:
    """(recompute, recompute_layers, recompute_modules) from Megatron's recompute settings
    (recompute_modules None: Megatron-Core's default, core_attn)."""
    if granularity in (None, "none"):
        return "none", None, None
    if granularity == "selective":
        return "selective", None, tuple(modules) if modules is not None else None
    if method == "uniform" and num_layers == 1:
        return "full", None, None
    if method == "block" and num_layers is not None:
        return "full", int(num_layers) * vpp, None
    raise ValueError(f"recompute {granularity}/{method}/{num_layers} is not one autopar emits")


# ---- NeMo 2 strategy / Megatron-Bridge model override fields -------------------------------------


def core_parallel_fields(ctx: Context) -> dict:
    """TransformerConfig / ModelParallelConfig fields of the plan (every layout field explicit, so a
    recipe's own layout settings cannot linger)."""
    p, m = ctx.plan, ctx.model
    lay = megatron_layout(ctx.stages, p.pp, p.vpp)
    out: dict[str, object] = {
        "tensor_model_parallel_size": p.tp,
        "pipeline_model_parallel_size": p.pp,
        "virtual_pipeline_model_parallel_size": p.vpp if p.vpp > 1 else None,
        "context_parallel_size": p.cp,
        "sequence_parallel": bool(p.sequence_parallel),
    }
    if m.moe is not None:
        out.update(expert_model_parallel_size=p.ep, expert_tensor_parallel_size=p.etp)
    out.update(
        num_layers_in_first_pipeline_stage=lay.first,
        num_layers_in_last_pipeline_stage=lay.last,
        pipeline_model_parallel_layout=lay.layout,
        account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
    )
    return out


def core_recompute_fields(ctx: Context) -> dict:
    """TransformerConfig recompute and activation-offloading fields, every one explicit (so a
    recipe's own cannot linger)."""
    r = recompute_settings(ctx)
    return {
        "recompute_granularity": r.get("recompute_granularity"),
        "recompute_method": r.get("recompute_method"),
        "recompute_num_layers": r.get("recompute_num_layers"),
        "recompute_modules": r.get("recompute_modules"),
    } | activation_offload_settings(ctx.plan)


def activation_offload_settings(plan) -> dict:
    """TransformerConfig fine-grained activation offloading fields (megatron-core 0.16
    transformer_config.py fine_grained_activation_offloading, offload_modules: a list of names,
    which must be non-empty when the switch is on)."""
    names = list(plan.offload_modules or ())
    return {"fine_grained_activation_offloading": bool(names), "offload_modules": names}


def activation_offload_from(on, modules) -> tuple[str, ...] | None:
    """The plan's offload_modules back from TransformerConfig's fields."""
    return tuple(modules) if on and modules else None


def core_moe_fields(ctx: Context) -> dict:
    """TransformerConfig MoE dispatch fields, every one explicit for MoE models (so a recipe's own
    capacity, dispatcher or overlap settings cannot linger); none for dense models. Grouped expert
    GEMMs as autopar prices them (and as Megatron-LM's --moe-grouped-gemm sets), which moe_act
    recompute needs (transformer_config.py: "moe_act in recompute_modules is only supported with
    moe_grouped_gemm")."""
    if ctx.model.moe is None:
        return {}
    cap, disp = capacity_settings(ctx), dispatcher_settings(ctx)
    return {
        "moe_grouped_gemm": True,
        "moe_expert_capacity_factor": cap.get("moe_expert_capacity_factor"),
        "moe_token_drop_policy": cap.get("moe_token_drop_policy", "probs"),
        "moe_pad_expert_input_to_capacity": cap.get("moe_pad_expert_input_to_capacity", False),
        "moe_token_dispatcher_type": disp["moe_token_dispatcher_type"],
        "moe_flex_dispatcher_backend": disp.get("moe_flex_dispatcher_backend", "deepep"),
        "overlap_moe_expert_parallel_comm": disp.get("overlap_moe_expert_parallel_comm", False),
    }


def view_from_core_fields(
    f: dict,
    *,
    num_layers: int,
    num_gpus: int,
    mbs: int,
    gbs: int,
    zero: int,
    dtype: str,
    main_grads_fp32: bool,
    tp_comm_overlap: bool,
) -> dict:
    """The plan from Megatron-Core config fields (the NeMo / Bridge override values)."""
    tp, pp, cp = f["tensor_model_parallel_size"], f["pipeline_model_parallel_size"], f["context_parallel_size"]
    dp = num_gpus // (tp * pp * cp)
    layout = f.get("pipeline_model_parallel_layout")
    vpp = f.get("virtual_pipeline_model_parallel_size") or 1
    if layout:
        from autopar.export.layouts import parse_layout_string

        vpp = len(parse_layout_string(layout)) // pp
    stages = stages_from_megatron(
        num_layers,
        pp,
        vpp=vpp,
        first=f.get("num_layers_in_first_pipeline_stage"),
        last=f.get("num_layers_in_last_pipeline_stage"),
        layout=layout,
    )
    recompute, rl, modules = recompute_from(
        f.get("recompute_granularity"),
        f.get("recompute_method"),
        f.get("recompute_num_layers"),
        vpp,
        f.get("recompute_modules"),
    )
    offloaded = activation_offload_from(f.get("fine_grained_activation_offloading"), f.get("offload_modules"))
    ep = f.get("expert_model_parallel_size", 1)
    dispatch, cf = dispatch_from(
        f.get("moe_expert_capacity_factor"),
        f.get("moe_token_drop_policy", "probs"),
        f.get("moe_pad_expert_input_to_capacity", False),
    )
    dispatcher = dispatcher_from(f.get("moe_token_dispatcher_type"), f.get("moe_flex_dispatcher_backend"))
    return normalize(
        {
            "num_gpus": num_gpus,
            "tp": tp,
            "pp": pp,
            "vpp": vpp,
            "cp": cp,
            "dp": dp,
            "ep": ep,
            "etp": f.get("expert_tensor_parallel_size") or tp,
            "sequence_parallel": f["sequence_parallel"],
            "zero_stage": zero,
            "micro_batch_size": mbs,
            "global_batch_size": gbs,
            NUM_MICROBATCHES: gbs // (mbs * dp),
            "pp_schedule": "interleaved-1f1b" if vpp > 1 else "1f1b",
            "layout": stages,
            "recompute": recompute,
            "recompute_layers": rl,
            "recompute_modules": modules,
            "offload_modules": offloaded,
            "dtype": dtype,
            "main_grads_fp32": main_grads_fp32,
            "tp_comm_overlap": tp_comm_overlap,
            "moe_dispatch": dispatch,
            "capacity_factor": cf,
            "moe_dispatcher": dispatcher,
            "ep_comm_overlap": bool(f.get("overlap_moe_expert_parallel_comm")),
        }
    )


def optimizer_instances(plan) -> int:
    """Megatron-Core's distributed-optimizer instances of a hybrid-sharded plan: dp x cp / dp_shard
    (DistributedDataParallelConfig.num_distributed_optimizer_instances, megatron-core 0.16); 1 when
    the optimizer shards over the whole dp x cp group."""
    return plan.dp * plan.cp // plan.dp_shard if plan.dp_shard else 1


def dp_shard_from_instances(instances, dp: int, cp: int) -> int | None:
    """The plan's dp_shard back from a run's instance count (None: one instance, no hybrid sharding)."""
    n = int(instances or 1)
    return dp * cp // n if n > 1 else None


def offload_settings(plan) -> dict:
    """Megatron-Core OptimizerConfig fields of an optimizer offloaded to host memory (megatron-core
    0.16.1 optimizer_config.py): optimizer_cpu_offload with optimizer_offload_fraction (the share of
    the shard, HybridDeviceOptimizer offload_fraction); use_precision_aware_optimizer, whose code path
    the hybrid optimizer reuses (use_precision_aware_optimizer_no_fp8_or_ds_fp8), so the distributed
    optimizer keeps no fp32 copy of the offloaded share on the GPU (Megatron-LM's arguments.py asserts
    it with --optimizer-cpu-offload [UNCERTAIN: Megatron-LM is not installed here]); and
    overlap_cpu_optimizer_d2h_h2d, the per-tensor pipelining autopar prices (cpu_optimizer_overlap).
    None without offload."""
    if not plan.optimizer_offload:
        return {}
    return {
        "optimizer_cpu_offload": True,
        "optimizer_offload_fraction": float(plan.optimizer_offload),
        "use_precision_aware_optimizer": True,
        "overlap_cpu_optimizer_d2h_h2d": True,
    }


def offload_from(cpu_offload, fraction) -> float:
    """The plan's optimizer_offload back from Megatron-Core's OptimizerConfig fields."""
    return float(fraction or 0.0) if cpu_offload else 0.0
