"""Memory of every costed pipeline rank at its peak, by term (vectorised, (C, n) arrays).

The accounting follows the training stack (`ClusterSpec.training_stack`): "megatron" (this
module: Megatron-Core's fused kernels and preallocated gradient buffers, Korthikanti et al. 2022
activations, Megatron `theoretical_memory_usage.py`) or "torch" (autopar.cost.torch_stack).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost import activations as act
from autopar.cost.memory import StateBytes, state_bytes
from autopar.cost.params import RankParams
from autopar.cost.pipeline import microbatches_in_flight
from autopar.cost.plan_arrays import PlanArrays
from autopar.cost.torch_stack import torch_stack_memory
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec


class MemoryTerms(NamedTuple):
    """Bytes per GPU of each costed rank at its peak."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    other: np.ndarray

    def total(self) -> np.ndarray:
        return sum(self)


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
    return state_bytes(prm.dense, prm.expert, t.zero_stage, x.dp_group, x.expert_dp, t.main_grads_fp32, x.fp32, x.pp)


def fsdp_gather_bytes(x: PlanArrays, prm: RankParams) -> np.ndarray:
    """ZeRO-3: the gathered unit being computed and the next one prefetched, two layers' weights
    (FSDP's default prefetch of one unit; Megatron-FSDP buckets by layer)."""
    return np.where((x.table.zero_stage == 3) & (x.dp_group > 1), 2.0 * x.weight_bytes * prm.dense_layer_max, 0.0)


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
    x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, prm: RankParams, layer_act: LayerActivations
) -> MemoryTerms:
    """Peak memory of every costed rank, by term, on the cluster's training stack."""
    states = model_states(x, prm)
    inflight = in_flight(x)
    gather, moe_buffers = fsdp_gather_bytes(x, prm), moe_buffer_bytes(x, model)
    if cluster.training_stack == "torch":  # PyTorch eager + FSDP2/DDP + torch pipelining (the built-in model)
        return MemoryTerms(
            **torch_stack_memory(
                model,
                x.table,
                x.stages,
                prm,
                states,
                tokens=x.tokens,
                m=x.microbatches,
                inflight=inflight,
                recompute_share=x.recompute_share,
                selective=x.selective,
                act_bytes=x.act_bytes,
                fp32=x.fp32,
                edp=x.expert_dp,
                constants=cluster.constants,
                fsdp_gather=gather,
                moe_buffers=moe_buffers,
            )
        )
    activations = inflight * stored_activations(x, model, layer_act) + working_set(x, layer_act)
    k = cluster.constants
    other = k.runtime_reserved_gib * GIB + k.allocator_overhead_fraction * activations + gather + moe_buffers
    return MemoryTerms(states.weights, states.gradients, states.optimizer, activations, other)


def stored_activations(x: PlanArrays, model: ModelSpec, layer_act: LayerActivations) -> np.ndarray:
    """Bytes one microbatch leaves stored on a rank: its layers (a recomputed share keeps only its
    inputs), the embedding's ids and masks, the head's inputs and fp32 logits (Korthikanti §4)."""
    share = x.recompute_share
    return (
        layer_act.rank_layers * (1 - share)
        + x.layers * layer_act.layer_input * share
        + x.has_embedding * act.embedding_bytes(model, x.tokens, x.tp, x.sequence_parallel)
        + x.has_head * act.head_bytes(model, x.tokens, x.tp, x.sequence_parallel, x.act_bytes)
    )


def working_set(x: PlanArrays, layer_act: LayerActivations) -> np.ndarray:
    """A recomputed layer's activations rebuilt for its backward, on top of what is stored
    (Korthikanti §5: one layer's full activations live during its recomputed backward)."""
    return np.where(x.recompute_share > 0, np.maximum(layer_act.dense, layer_act.moe), 0.0)
