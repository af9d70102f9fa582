"""Memory of every costed pipeline rank at its peak, by term (vectorised, (C, n) arrays).

Each plan is priced as its training program allocates (autopar.cost.memory_stacks picks the
program from the priced cluster's `training_stack`): Megatron-Core and the other
GPU programs in autopar.cost.gpu_memory, autopar's built-in model in autopar.cost.torch_stack.
`layer_activations` is Korthikanti et al. 2022's fused count, which the time model reads as the
elementwise kernels' traffic (autopar.cost.compute).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost import activations as act
from autopar.cost.gpu_memory import MemoryBreakdown, MemoryTerms, gpu_memory
from autopar.cost.memory import StateBytes, state_bytes
from autopar.cost.memory_stacks import BUILTIN, STACKS, MemoryFacts, stack_name
from autopar.cost.params import RankParams
from autopar.cost.pipeline import microbatches_in_flight
from autopar.cost.plan_arrays import PlanArrays
from autopar.cost.torch_stack import torch_stack_memory
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec


class LayerActivations(NamedTuple):
    """Bytes one layer stores per microbatch (Korthikanti et al. 2022 Table 2, fused kernels)."""

    dense: np.ndarray  # a dense layer
    moe: np.ndarray  # an MoE layer
    layer_input: np.ndarray  # a fully recomputed layer (its input only)
    rank_layers: np.ndarray  # (C, n): every layer of the rank, none recomputed


def layer_activations(x: PlanArrays, model: ModelSpec) -> LayerActivations:
    """The stored bytes of a rank's layers at the plan's activation precision."""
    dense = act.dense_layer_bytes(model, x.tokens, x.tp, x.sequence_parallel) * x.act_scale
    moe = (act.moe_layer_bytes(model, x.tokens, x.tp, x.etp) if model.moe else np.zeros_like(dense)) * x.act_scale
    layer_input = act.layer_input_bytes(model, x.tokens, x.tp, x.sequence_parallel) * x.act_scale
    return LayerActivations(dense, moe, layer_input, x.dense_layers * dense + x.moe_layers * moe)


def model_states(x: PlanArrays, prm: RankParams) -> StateBytes:
    """Weights, gradients and optimizer state of each rank (autopar.cost.memory)."""
    t = x.table
    return state_bytes(prm.dense, prm.expert, t.zero_stage, x.dp_shard, x.expert_dp, t.main_grads_fp32, x.fp32, x.pp)


def fsdp_gather_bytes(x: PlanArrays, prm: RankParams) -> np.ndarray:
    """ZeRO-3: the gathered unit being computed and the next one prefetched, two layers' weights
    (FSDP's default prefetch of one unit; Megatron-FSDP buckets by layer)."""
    return np.where((x.table.zero_stage == 3) & (x.dp_shard > 1), 2.0 * x.weight_bytes * prm.dense_layer_max, 0.0)


def moe_buffer_bytes(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """MoE token-dispatch buffers: the k routed copies of the tp-local tokens, sent and received,
    gathered over etp (Megatron-Core `MoEAlltoAllTokenDispatcher` permutation buffers)."""
    if not model.moe:
        return 0.0 * x.moe_layers
    copies = 2.0 * x.tokens / np.where(x.sequence_parallel, x.tp_float, 1.0) * model.moe.top_k
    return (copies * model.hidden_size * x.act_bytes * x.etp) * (x.moe_layers > 0)


def in_flight(x: PlanArrays) -> np.ndarray:
    """Microbatches whose activations each rank holds at its peak (autopar.cost.pipeline)."""
    return microbatches_in_flight(x.table.schedule, x.pp, x.rank, x.microbatches, x.vpp)


def memory_terms(
    x: PlanArrays,
    model: ModelSpec,
    cluster: ClusterSpec,
    prm: RankParams,
    layer_act: LayerActivations,
    facts: MemoryFacts | None = None,
) -> MemoryTerms:
    """Peak memory of every costed rank, by term, as the plans' training programs allocate it
    (autopar.cost.memory_stacks): "other" holds the buffers, the allocator's reserve, the CUDA
    context and NCCL. `facts`: what a run states beyond its plan (MemoryFacts)."""
    return memory_breakdown(x, model, cluster, prm, facts).terms()


def memory_breakdown(
    x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, prm: RankParams, facts: MemoryFacts | None = None
) -> MemoryBreakdown:
    """The peak of every costed rank by term, on the cluster's program (`stack_name`) or the one
    `facts.stack` names."""
    facts = facts or MemoryFacts()
    name = facts.stack or stack_name(cluster)
    if name == BUILTIN.name:
        return builtin_breakdown(x, model, cluster, prm)
    return gpu_memory(x, model, cluster, prm, STACKS[name], facts, moe_buffer_bytes(x, model))


def builtin_breakdown(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, prm: RankParams) -> MemoryBreakdown:
    """autopar's built-in model (autopar.cost.torch_stack): its terms, "other" as buffers."""
    terms = torch_stack_memory(
        model,
        x.table,
        x.stages,
        prm,
        model_states(x, prm),
        tokens=x.tokens,
        m=x.microbatches,
        inflight=in_flight(x),
        recompute_share=x.recompute_share,
        selective=x.selective,
        act_bytes=x.act_bytes,
        fp32=x.fp32,
        edp=x.expert_dp,
        constants=cluster.constants,
        fsdp_gather=fsdp_gather_bytes(x, prm),
        moe_buffers=moe_buffer_bytes(x, model),
    )
    zero = 0.0 * terms["other"]
    return MemoryBreakdown(
        terms["weights"], terms["gradients"], terms["optimizer"], terms["activations"], terms["other"], zero, zero, zero
    )
