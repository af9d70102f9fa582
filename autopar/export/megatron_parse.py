"""Megatron-LM flags read back: the subset of Megatron-LM's argparse that the megatron exporter
writes (names and types as in Megatron-LM arguments.py, unknown flags an error), and the plan they
express, for `MegatronExporter.parse` and the tests that check the exports against Megatron-LM."""

from __future__ import annotations

import argparse

from autopar.export.layouts import parse_layout_string, stages_from_megatron
from autopar.export.megatron_core import (
    FSDP_STRATEGY_ZERO,
    activation_offload_from,
    dispatch_from,
    dispatcher_from,
    dp_shard_from_instances,
    offload_from,
    recompute_from,
)
from autopar.export.view import normalize
from autopar.figures import NUM_MICROBATCHES

#: the subset of Megatron-LM's argparse that autopar emits, by type (names as in arguments.py)
INT_FLAGS = (
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--kv-channels",
    "--num-query-groups",
    "--seq-length",
    "--max-position-embeddings",
    "--q-lora-rank",
    "--kv-lora-rank",
    "--qk-head-dim",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
    "--num-experts",
    "--moe-router-topk",
    "--moe-router-num-groups",
    "--moe-router-group-topk",
    "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--num-distributed-optimizer-instances",
    "--micro-batch-size",
    "--global-batch-size",
    "--recompute-num-layers",
    "--rotary-base",
    "--make-vocab-size-divisible-by",
    "--fp8-amax-history-len",
    "--save-interval",
)
STR_FLAGS = (
    "--normalization",
    "--position-embedding-type",
    "--moe-layer-freq",
    "--moe-token-dispatcher-type",
    "--pipeline-model-parallel-layout",
    "--data-parallel-sharding-strategy",
    "--recompute-granularity",
    "--recompute-method",
    "--fp8-format",
    "--moe-token-drop-policy",
    "--moe-flex-dispatcher-backend",
    "--fp8-amax-compute-algo",
    "--ckpt-format",
)
FLOAT_FLAGS = (
    "--attention-dropout",
    "--hidden-dropout",
    "--moe-expert-capacity-factor",
    "--norm-epsilon",
    "--optimizer-offload-fraction",
)
STORE_TRUE_FLAGS = (
    "--group-query-attention",
    "--fp8-param-gather",
    "--reuse-grad-buf-for-mxfp8-param-ag",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--add-qkv-bias",
    "--qk-layernorm",
    "--multi-latent-attention",
    "--moe-router-enable-expert-bias",
    "--moe-grouped-gemm",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--tp-comm-overlap",
    "--bf16",
    "--grad-reduce-in-bf16",
    "--moe-pad-expert-input-to-capacity",
    "--overlap-moe-expert-parallel-comm",
    "--optimizer-cpu-offload",
    "--fine-grained-activation-offloading",
    "--use-precision-aware-optimizer",
    "--overlap-cpu-optimizer-d2h-h2d",
)


def megatron_parser() -> argparse.ArgumentParser:
    """The subset of Megatron-LM's argparse that autopar emits (names and types as in arguments.py)."""
    ap = argparse.ArgumentParser(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False)
    for f in INT_FLAGS:
        ap.add_argument(f, type=int)
    for f in STR_FLAGS:
        ap.add_argument(f, type=str)
    for f in FLOAT_FLAGS:
        ap.add_argument(f, type=float)
    for f in STORE_TRUE_FLAGS:
        ap.add_argument(f, action="store_true")
    # Megatron-LM arguments.py: the scaling recipe, delayed unless given
    ap.add_argument(
        "--fp8-recipe", default="delayed", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"]
    )
    ap.add_argument("--recompute-modules", nargs="*", type=str)  # Megatron-LM arguments.py: a list of names
    ap.add_argument("--offload-modules", nargs="*", type=str)  # the same: a list of names
    # Megatron-LM's negated flag (store_false into gradient_accumulation_fusion)
    ap.add_argument("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion", action="store_false")
    return ap


def parse_megatron_args(argv: list[str]) -> argparse.Namespace:
    """Parse flags written by the megatron exporter (unknown flags are an error)."""
    ns, unknown = megatron_parser().parse_known_args(argv)
    if unknown:
        raise ValueError(f"flags autopar does not emit: {unknown}")
    return ns


def megatron_vpp(ns: argparse.Namespace) -> int:
    pp = ns.pipeline_model_parallel_size or 1
    if ns.pipeline_model_parallel_layout:
        return len(parse_layout_string(ns.pipeline_model_parallel_layout)) // pp
    if ns.num_virtual_stages_per_pipeline_rank:
        return ns.num_virtual_stages_per_pipeline_rank
    if ns.num_layers_per_virtual_pipeline_stage:
        return (ns.num_layers // pp) // ns.num_layers_per_virtual_pipeline_stage
    return 1


def view_from_megatron_argv(argv: list[str], num_gpus: int) -> dict:
    ns = parse_megatron_args(argv)
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size
    if num_gpus % (tp * pp * cp):
        raise ValueError(f"world size {num_gpus} does not divide by tp*pp*cp")
    dp = num_gpus // (tp * pp * cp)
    vpp = megatron_vpp(ns)
    stages = stages_from_megatron(
        ns.num_layers,
        pp,
        vpp=vpp,
        first=ns.decoder_first_pipeline_num_layers,
        last=ns.decoder_last_pipeline_num_layers,
        layout=ns.pipeline_model_parallel_layout,
    )
    if ns.use_megatron_fsdp:
        zero = FSDP_STRATEGY_ZERO[ns.data_parallel_sharding_strategy]
    else:
        zero = 1 if ns.use_distributed_optimizer else 0
    recompute, rl, modules = recompute_from(
        ns.recompute_granularity, ns.recompute_method, ns.recompute_num_layers, vpp, ns.recompute_modules
    )
    mbs, gbs = ns.micro_batch_size, ns.global_batch_size
    ep = ns.expert_model_parallel_size or 1
    dispatch, cf = dispatch_from(
        ns.moe_expert_capacity_factor, ns.moe_token_drop_policy, ns.moe_pad_expert_input_to_capacity
    )
    dispatcher = dispatcher_from(ns.moe_token_dispatcher_type, ns.moe_flex_dispatcher_backend)
    return normalize(
        {
            "num_gpus": num_gpus,
            "tp": tp,
            "pp": pp,
            "vpp": vpp,
            "cp": cp,
            "dp": dp,
            "ep": ep,
            "etp": ns.expert_tensor_parallel_size or tp,
            "sequence_parallel": ns.sequence_parallel,
            "zero_stage": zero,
            "dp_shard": dp_shard_from_instances(ns.num_distributed_optimizer_instances, dp, cp),
            "micro_batch_size": mbs,
            "global_batch_size": gbs,
            NUM_MICROBATCHES: gbs // (mbs * dp),
            "pp_schedule": "interleaved-1f1b" if vpp > 1 else "1f1b",
            "layout": stages,
            "recompute": recompute,
            "recompute_layers": rl,
            "recompute_modules": modules,
            "offload_modules": activation_offload_from(ns.fine_grained_activation_offloading, ns.offload_modules),
            "dtype": "fp8" if ns.fp8_format else ("bf16" if ns.bf16 else "fp32"),
            "fp8_recipe": ns.fp8_recipe if ns.fp8_format else None,
            "fp8_param_gather": ns.fp8_param_gather if ns.fp8_format else None,
            "main_grads_fp32": not ns.grad_reduce_in_bf16,
            "tp_comm_overlap": ns.tp_comm_overlap,
            "moe_dispatch": dispatch,
            "capacity_factor": cf,
            "moe_dispatcher": dispatcher,
            "ep_comm_overlap": ns.overlap_moe_expert_parallel_comm,
            "optimizer_offload": offload_from(ns.optimizer_cpu_offload, ns.optimizer_offload_fraction),
        }
    )
