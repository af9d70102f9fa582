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

from autopar.cost.flops import (
    attention_core_flops_per_token,
    attention_linear_flops_per_token,
    head_flops_per_token,
    mlp_flops_per_token,
)
from autopar.cost.plan_arrays import PlanArrays
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.table import DISPATCH, DTYPE


def shape_efficiency(x, half) -> np.ndarray:
    """Saturating GEMM efficiency in the smallest dimension x: x / (x + x_half)."""
    x = np.asarray(x, dtype=float)
    return x / (x + half)


def large_gemm_rate(cluster: ClusterSpec, dtype) -> np.ndarray:
    """Achieved FLOP/s of large GEMMs in the plan's dtype: the dense peak x the efficiency of its
    precision (TF32 tensor cores run at half the BF16 rate: H100/A100 datasheets, reference C)."""
    k = cluster.constants
    g = cluster.gpu
    fp8 = np.asarray(dtype) == DTYPE["fp8"]
    fp32 = np.asarray(dtype) == DTYPE["fp32"]
    bf16 = g.bf16_tflops * 1e12 * k.gemm_efficiency
    return np.where(fp8, g.fp8_tflops * 1e12 * k.fp8_gemm_efficiency, np.where(fp32, bf16 / 2, bf16))


def gemm_rate(cluster: ClusterSpec, dtype, smallest_dim) -> np.ndarray:
    """Achieved FLOP/s of the GEMMs of a plan on one GPU."""
    return large_gemm_rate(cluster, dtype) * shape_efficiency(smallest_dim, cluster.constants.gemm_half_efficiency_dim)


def attention_rate(cluster: ClusterSpec, kv_len=None, head_dim: int | None = None) -> np.ndarray:
    """Achieved FLOP/s of flash attention (bf16, also in FP8 runs): the tensor-core rate of the
    kernel's instructions (mma.sync kernels reach only part of a Hopper's peak, FlashAttention-3
    paper sec. 2.2), x attention_efficiency, rising with the K/V length a kernel iterates over
    (L / (L + attention_half_seq)) and with the head dimension (d / (d + 16): FlashAttention-2
    paper Fig. 4-7, head dim 64 runs ~10 % below 128)."""
    k, g = cluster.constants, cluster.gpu
    peak = g.bf16_tflops * 1e12 * (1 - k.attention_mma_sync + k.attention_mma_sync * g.mma_sync_fraction)
    rate = peak * k.gemm_efficiency * k.attention_efficiency
    if kv_len is not None and k.attention_half_seq > 0:
        kv = np.asarray(kv_len, dtype=float)
        rate = rate * kv / (kv + k.attention_half_seq)
    if head_dim is not None and k.attention_half_seq > 0:
        rate = rate * head_dim / (head_dim + 16.0) / (128 / 144)  # relative to head dim 128
    return rate


def causal_block_waste(cluster: ClusterSpec, seq_len) -> np.ndarray:
    """Executed / causal attention FLOPs: a causal flash kernel skips the blocks above the diagonal
    but computes the diagonal ones in full, s*B/2 more than s^2/2 (FlashAttention-2 paper sec. 3.1);
    an attention that materialises its scores computes all s^2 of them, then masks."""
    k = cluster.constants
    flash = 1.0 + np.minimum(k.attention_block / np.asarray(seq_len, dtype=float), 1.0)
    return k.attention_flash * flash + (1 - k.attention_flash) * 2.0


def score_matrix_bytes(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec) -> np.ndarray:
    """HBM bytes of the attention score matrices per microbatch when they are materialised
    (attention_flash 0): per layer the stored 5as^2 bytes of Korthikanti et al. 2022 Table 2 (QK^T
    and softmax outputs 2as^2 each, the dropout mask as^2) per sequence, over the tp ranks; written in
    the forward, read in the backward and rebuilt by a recompute of the attention core."""
    k = cluster.constants
    passes = 2.0 + np.where(x.full, x.recompute_share, np.where(x.selective, 1.0, 0.0))
    per_layer = 5.0 * model.num_attention_heads * x.seq_len**2 * x.micro_batch / x.tp_float
    return (1 - k.attention_flash) * x.layers * per_layer * passes


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
    lin_layer = x.dense_layers * (
        attention_linear_flops_per_token(model) + mlp_flops_per_token(model, False)
    ) + x.moe_layers * attention_linear_flops_per_token(model)
    expert_layer = x.moe_layers * mlp_flops_per_token(model, True) if model.moe else 0.0 * x.moe_layers
    fwd_gemm = tokens * (lin_layer + x.has_head * head_flops_per_token(model, x.tp)) / tf
    fwd_expert = tokens * expert_layer / tf
    fwd_core = tokens * (x.layers * attention_core_flops_per_token(model, x.seq_len)) / tf
    recompute_dense = share * tokens * lin_layer / tf
    recompute_expert = share * tokens * expert_layer / tf
    recompute_core = np.where(x.selective | x.full, np.where(x.full, share, 1.0), 0.0) * fwd_core
    rate_dense = gemm_rate(cluster, x.table.dtype, dense_gemm_dim(x, model))
    gemm = (3 * fwd_gemm + recompute_dense) / rate_dense
    if model.moe:
        gemm = gemm + (3 * fwd_expert + recompute_expert) / expert_rate(x, model, cluster) * expert_load(x)
    attn_rate = attention_rate(cluster, x.seq_len / x.cp, model.qk_head_dim)
    attention = (3 * fwd_core + recompute_core) * causal_block_waste(cluster, x.seq_len) / attn_rate
    hbm = cluster.gpu.hbm_gbps * 1e9
    elementwise = (
        k.elementwise_traffic_factor * (rank_layers_act * (1 + share) + score_matrix_bytes(x, model, cluster))
        + moe_traffic_bytes(x, model)
    ) / hbm
    launch = (x.layers * k.layer_overhead_us + x.moe_layers * k.moe_layer_overhead_us) * (1 + share / 2) * 1e-6
    return ComputeTerms(gemm, attention, elementwise, launch, recompute_dense + recompute_expert + recompute_core)


def expert_rate(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec) -> np.ndarray:
    """Achieved FLOP/s of the grouped expert GEMMs: the GEMM rate of the dtype at the shape
    efficiency of the geometric-mean dimension of one local expert's GEMM (tokens per local expert x
    expert ffn / etp x hidden), with its own half point: small experts run far below dense GEMMs
    (Megatron-Core grouped GEMM, TE GroupedLinear: one GEMM per local expert)."""
    k = cluster.constants
    full = large_gemm_rate(cluster, x.table.dtype) * k.expert_gemm_efficiency
    return full * shape_efficiency(expert_gemm_dim(x, model), k.expert_gemm_half_dim)


def expert_load(x: PlanArrays) -> np.ndarray:
    """The busiest expert rank's tokens over the mean: dropless dispatch computes whatever the router
    sends (x routing imbalance; 1 when forced-balanced), capacity dispatch pads every expert to its
    capacity (x capacity factor: Megatron --moe-pad-expert-input-to-capacity)."""
    dropless = np.full(len(x.table), x.routing_imbalance)
    return np.where(x.table.moe_dispatch == DISPATCH["capacity"], x.table.capacity_factor, dropless)


def moe_traffic_bytes(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """HBM bytes of the MoE token shuffling per microbatch: permute (read T x h, write k T x h) and
    unpermute (read k T x h, write T x h) in the forward and again in the backward, plus the router's
    fp32 logits, softmax and top-k over E experts (Megatron-Core moe_utils permute / unpermute,
    router.py); a recomputed layer repeats its forward."""
    if not model.moe:
        return 0.0 * x.moe_layers
    m = model.moe
    local = x.tokens / np.where(x.sequence_parallel, x.tp_float, 1.0)
    per_pass = local * (2.0 * (m.top_k + 1) * model.hidden_size * x.act_bytes + 3 * 4.0 * m.num_experts)
    return x.moe_layers * per_pass * (2.0 + x.recompute_share)


def dense_gemm_dim(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """The smallest dimension of the per-GPU dense GEMMs: tokens, hidden, ffn/tp, q/tp."""
    return np.minimum.reduce(
        [
            x.tokens,
            np.full_like(x.tokens, model.hidden_size),
            model.ffn_hidden_size / x.tp_float,
            model.q_size / x.tp_float,
        ]
    )


def expert_gemm_dim(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """The geometric-mean dimension of one local expert's GEMM: (tokens per local expert instance x
    expert ffn / etp x hidden)^(1/3)."""
    mo = model.moe
    per_expert = x.micro_batch * x.seq_len * mo.top_k * x.ep * x.etp / (mo.num_experts * x.tp * x.cp)
    return np.cbrt(per_expert * (mo.expert_ffn_hidden_size / x.etp.astype(float)) * model.hidden_size)
