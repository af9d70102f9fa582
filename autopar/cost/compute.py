"""Compute time of one GPU: FLOPs / (peak x efficiency), efficiency by per-GPU GEMM shape.

GEMM efficiency = e_max * x / (x + x_half), where x is the smallest dimension of the per-GPU GEMMs
(tokens of the microbatch, hidden, ffn/tp, q/tp): small GEMMs (large tp, small microbatches, thin
experts) run further from peak. e_max and x_half are calibrated constants (CostConstants), fitted to
the published runs in calibration_runs.csv (`autopar validate --fit`). Core attention (flash) runs in
bf16 at `attention_efficiency` of the GEMM rate. Non-GEMM kernels (norms, SwiGLU, RoPE, residuals)
are memory bound: `elementwise_traffic_factor` x the activation bytes, over HBM bandwidth.
"""

from __future__ import annotations

import numpy as np

from autopar.spec.hardware import ClusterSpec
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
