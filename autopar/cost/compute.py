"""Compute time of one GPU: FLOPs / (peak x efficiency), efficiency by per-GPU GEMM shape.

GEMM efficiency = e_max * x / (x + x_half), where x is the smallest dimension of the per-GPU GEMMs
(tokens of the microbatch, hidden, ffn/tp, q/tp): small GEMMs (large tp, small microbatches, thin
experts) run further from peak. e_max and x_half are calibrated constants (CostConstants), fitted to
the published runs in calibration_runs.csv (`autopar validate --fit`). Core attention (flash) runs in
bf16 at `attention_efficiency` of the GEMM rate. Non-GEMM kernels (norms, SwiGLU, RoPE, residuals)
are memory bound: `elementwise_traffic_factor` x the activation bytes, over HBM bandwidth.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost.flops import (attention_core_flops_per_token, attention_linear_flops_per_token,
                                head_flops_per_token, mlp_flops_per_token)
from autopar.cost.plan_arrays import PlanArrays
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.table import DTYPE


def shape_efficiency(x, half) -> np.ndarray:
    """Saturating GEMM efficiency in the smallest dimension x: x / (x + x_half)."""
    x = np.asarray(x, dtype=float)
    return x / (x + half)


def gemm_rate(cluster: ClusterSpec, dtype, smallest_dim) -> np.ndarray:
    """Achieved FLOP/s of the GEMMs of a plan on one GPU."""
    k = cluster.constants
    g = cluster.gpu
    fp8 = np.asarray(dtype) == DTYPE["fp8"]
    fp32 = np.asarray(dtype) == DTYPE["fp32"]
    bf16 = g.bf16_tflops * 1e12 * k.gemm_efficiency
    # TF32 tensor cores run at half the BF16 rate (H100/A100 datasheets, reference C)
    peak = np.where(fp8, g.fp8_tflops * 1e12 * k.fp8_gemm_efficiency, np.where(fp32, bf16 / 2, bf16))
    return peak * shape_efficiency(smallest_dim, k.gemm_half_efficiency_dim)


def attention_rate(cluster: ClusterSpec) -> float:
    """Achieved FLOP/s of flash attention (bf16, also in FP8 runs)."""
    k = cluster.constants
    return cluster.gpu.bf16_tflops * 1e12 * k.gemm_efficiency * k.attention_efficiency


class ComputeTerms(NamedTuple):
    """Seconds per microbatch of each costed rank (forward + backward + recomputed forward), and
    the recomputed FLOPs that count towards HFU only."""

    gemm: np.ndarray  # dense and expert GEMMs
    attention: np.ndarray  # the attention core (flash)
    elementwise: np.ndarray  # memory-bound non-GEMM kernels
    launch: np.ndarray  # fixed per-layer overhead
    recompute_flops: np.ndarray  # recomputed forward FLOPs (hardware FLOPs, not model FLOPs)

    def total(self) -> np.ndarray:
        return self.gemm + self.attention + self.elementwise + self.launch


def compute_terms(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, rank_layers_act: np.ndarray) -> ComputeTerms:
    """Compute time per microbatch: 3 x forward FLOPs (backward = 2 x forward, Megatron's FLOPs
    convention) plus the recomputed forward, each GEMM class at its shape-dependent rate;
    elementwise kernels from the activation bytes they touch; a per-layer overhead (recomputed
    layers count half: a forward's kernels but no backward's)."""
    k = cluster.constants
    tf, tokens, share = x.tp_float, x.tokens, x.recompute_share
    lin_layer = (x.dense_layers * (attention_linear_flops_per_token(model) + mlp_flops_per_token(model, False))
                 + x.moe_layers * attention_linear_flops_per_token(model))
    expert_layer = x.moe_layers * mlp_flops_per_token(model, True) if model.moe else 0.0 * x.moe_layers
    fwd_gemm = tokens * (lin_layer + x.has_head * head_flops_per_token(model, x.tp)) / tf
    fwd_expert = tokens * expert_layer / tf
    fwd_core = tokens * (x.layers * attention_core_flops_per_token(model, x.seq_len)) / tf
    recompute_dense = share * tokens * lin_layer / tf
    recompute_expert = share * tokens * expert_layer / tf
    recompute_core = np.where(x.selective | x.full, np.where(x.full, share, 1.0), 0.0) * fwd_core
    rate_dense = gemm_rate(cluster, x.table.dtype, dense_gemm_dim(x, model))
    rate_expert = rate_dense
    if model.moe:
        rate_expert = gemm_rate(cluster, x.table.dtype, expert_gemm_dim(x, model)) * k.expert_gemm_efficiency
    gemm = (3 * fwd_gemm + recompute_dense) / rate_dense + (3 * fwd_expert + recompute_expert) / rate_expert
    attention = (3 * fwd_core + recompute_core) / attention_rate(cluster)
    elementwise = k.elementwise_traffic_factor * (rank_layers_act * (1 + share)) / (cluster.gpu.hbm_gbps * 1e9)
    launch = x.layers * (1 + share / 2) * k.layer_overhead_us * 1e-6
    return ComputeTerms(gemm, attention, elementwise, launch, recompute_dense + recompute_expert + recompute_core)


def dense_gemm_dim(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """The smallest dimension of the per-GPU dense GEMMs: tokens, hidden, ffn/tp, q/tp."""
    return np.minimum.reduce([x.tokens, np.full_like(x.tokens, model.hidden_size), model.ffn_hidden_size / x.tp_float,
                              model.q_size / x.tp_float])


def expert_gemm_dim(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """The smallest dimension of a grouped expert GEMM: tokens per local expert instance, expert
    ffn / etp, hidden."""
    mo = model.moe
    per_expert = x.micro_batch * x.seq_len * mo.top_k * x.ep * x.etp / (mo.num_experts * x.tp * x.cp)
    return np.minimum.reduce([per_expert, mo.expert_ffn_hidden_size / x.etp.astype(float),
                              np.full_like(x.tokens, model.hidden_size)])
