"""Kernel rates of one GPU, from its published behaviour (autopar.spec.behaviour): what the GEMMs, the
attention kernels and the memory-bound kernels of a plan reach at efficiency 1. The trainer profiles'
efficiencies (autopar.cost.profiles) are fractions of these rates, never of the datasheet peak.

- GEMM: the achievable rate (MAMF: stas00/ml-engineering's mamf-finder over shapes) of the dtype,
  times the shape fall-off x / (x + x_half) in the smallest GEMM dimension x. x_half is fitted once to
  DeepGEMM's published rates (reference_half_dim) and moved with the GPU's ridge point: a GEMM with
  one small dimension x does about 2x / b FLOPs per byte it reads (b bytes per element), so it
  leaves the memory-bound regime at x ~ b x peak / HBM bandwidth / 2 (the roofline model, Williams
  et al. 2009). TF32 (fp32 training) runs at half the BF16 rate (H100/A100 datasheets).
- Attention: the published forward and backward rates of the GPU's kernels by the K/V length a
  kernel iterates over, at head dim 128, scaled by the FlashAttention-3 head-dim curve; mma.sync
  kernels (FlashAttention-2, SDPA's flash backend) at their own published forward+backward rate.
- Memory-bound kernels: the achieved HBM bandwidth (Dao-AILab/quack: ~90 % of peak).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from autopar.spec.behaviour import measured_behaviour, shared_figures
from autopar.spec.curves import GpuBehaviour
from autopar.spec.hardware import ClusterSpec
from autopar.spec.table import DTYPE


@cache
def reference_half_dim() -> float:
    """x_half of x / (x + x_half) fitted (least squares in log) to the published shape points, each
    the rate at M relative to M = 4096 of the same N and K (autopar.spec.behaviour.shared_figures)."""
    pts = np.array(shared_figures().shape_points)
    m, ratio = pts[:, 0], pts[:, 1]
    grid = np.geomspace(1.0, 16384.0, 4001)[:, None]
    model = (m / (m + grid)) / (4096.0 / (4096.0 + grid))
    err = np.sum(np.log(model / ratio) ** 2, axis=1)
    return float(grid[np.argmin(err), 0])


def gpu_behaviour(cluster: ClusterSpec) -> GpuBehaviour:
    """The GPU's published behaviour at the cluster's power limit, with what `autopar probe`
    measured on this cluster in its place."""
    return measured_behaviour(cluster.operating_gpu, cluster.measured)


def half_dims(cluster: ClusterSpec, dtype) -> np.ndarray:
    """The shape fall-off's x_half on this GPU for each plan's dtype: the reference value moved with
    the ridge point (b bytes per element x dense peak / HBM bandwidth), against the H800 FP8 of the
    measurements (b = 1); what `autopar probe` measured on the cluster, if it did."""
    d = np.asarray(dtype)
    if cluster.measured.gemm_half_dim is not None:
        return np.full(d.shape, cluster.measured.gemm_half_dim)
    gpu = cluster.gpu
    b = np.where(d == DTYPE["fp8"], 1.0, np.where(d == DTYPE["fp32"], 4.0, 2.0))
    peak = np.where(
        d == DTYPE["fp8"], gpu.fp8_tflops, np.where(d == DTYPE["fp32"], gpu.bf16_tflops / 2, gpu.bf16_tflops)
    )
    ridge = peak * 1e12 / (gpu.hbm_gbps * 1e9)
    return reference_half_dim() * b * ridge / shared_figures().shape_ridge


def large_gemm_rate(cluster: ClusterSpec, dtype) -> np.ndarray:
    """Achievable FLOP/s of large GEMMs in each plan's dtype (MAMF; TF32 at half the BF16 rate)."""
    g = gpu_behaviour(cluster).gemm
    d = np.asarray(dtype)
    fp8 = g.fp8_flops if g.fp8_flops > 0 else np.nan  # FP8 on a GPU without it: an invalid plan
    return np.where(d == DTYPE["fp8"], fp8, np.where(d == DTYPE["fp32"], g.bf16_flops / 2, g.bf16_flops))


def shape_fraction(x, half) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return x / (x + half)


def gemm_rate(cluster: ClusterSpec, dtype, smallest_dim) -> np.ndarray:
    """Achievable FLOP/s of GEMMs whose smallest dimension is `smallest_dim`."""
    return large_gemm_rate(cluster, dtype) * shape_fraction(smallest_dim, half_dims(cluster, dtype))


def head_dim_factor(head_dim: float, kv_len) -> np.ndarray:
    """Rate at head dim d relative to 128 (FlashAttention-3 causal forward, by sequence length),
    interpolated in log d between the published 64, 128 and 256; flat beyond."""
    curves = {d: c for d, c in shared_figures().head_dim.items() if isinstance(d, int)}
    dims = sorted(curves)
    ref = curves[128](kv_len)
    d = float(np.clip(head_dim, dims[0], dims[-1]))
    lo = max(x for x in dims if x <= d)
    hi = min(x for x in dims if x >= d)
    if lo == hi:
        return curves[lo](kv_len) / ref
    w = (np.log(d) - np.log(lo)) / (np.log(hi) - np.log(lo))
    return np.exp((1 - w) * np.log(curves[lo](kv_len) / ref) + w * np.log(curves[hi](kv_len) / ref))


def causal_share(cp) -> np.ndarray:
    """Share of a rank's attention work in causally masked blocks: all of it without CP; with the
    load-balanced context-parallel split (each rank holds chunks i and 2cp-1-i of 2cp: Megatron /
    Transformer Engine p2p CP) only its 2 diagonal blocks, 1 / (2 cp) of its work; the other blocks
    are whole (unmasked)."""
    cp = np.asarray(cp, dtype=float)
    return np.where(cp > 1, 1.0 / (2.0 * cp), 1.0)


def attention_seconds(
    cluster: ClusterSpec, fwd_flops, kv_len, head_dim: float, forwards, mma_sync, cp=1, fa1=0.0, triton_rate=1.0
) -> np.ndarray:
    """Seconds of flash attention doing `fwd_flops` (causal) per forward, `forwards` forwards (1 +
    recomputed ones) and one backward (2.5 x the forward's FLOPs: Dao-AILab/flash-attention#1525), at
    the published rates of the GPU's kernels for this K/V length, causally masked blocks at the causal
    rate and a CP rank's whole blocks at the unmasked rate (`causal_share`); `mma_sync` is the share
    of it on FlashAttention-2-class kernels, `fa1` of that on FlashAttention-in-Triton ones at
    `triton_rate` of FA2's (the constant triton_attention_rate: FA2 paper sec. 4.1). A GPU without a
    published curve for one kind uses the other's."""
    a = gpu_behaviour(cluster).attention
    f = np.asarray(fwd_flops, dtype=float)
    hd = head_dim_factor(head_dim, kv_len)
    c = causal_share(cp)
    native = mma = None
    if a.native_fwd is not None:
        # the native curves are published (or fitted) together (autopar.spec.behaviour)
        assert a.native_fwd_full is not None and a.native_bwd is not None and a.native_bwd_full is not None
        fwd = c / a.native_fwd(kv_len) + (1 - c) / a.native_fwd_full(kv_len)
        bwd = c / a.native_bwd(kv_len) + (1 - c) / a.native_bwd_full(kv_len)
        native = f * (forwards * fwd + 2.5 * bwd) / hd
    if a.mma_sync_fwd_bwd is not None:
        assert a.mma_sync_hd64_ratio is not None and a.mma_sync_fwd_bwd_full is not None  # FA2's come together
        ratio = np.where(head_dim <= 64, a.mma_sync_hd64_ratio(kv_len), 1.0)
        per = c / a.mma_sync_fwd_bwd(kv_len) + (1 - c) / a.mma_sync_fwd_bwd_full(kv_len)
        mma = f * (forwards + 2.5) * per / ratio * (1.0 - fa1 + fa1 / triton_rate)
    native = mma if native is None else native
    mma = native if mma is None else mma
    return (1 - mma_sync) * native + mma_sync * mma


def hbm_rate(cluster: ClusterSpec) -> float:
    """Achieved B/s of memory-bound kernels."""
    return cluster.gpu.hbm_gbps * 1e9 * gpu_behaviour(cluster).hbm_fraction


def probed_figures(cluster: ClusterSpec) -> list[dict]:
    """The rates the cost model prices this cluster with beside the published (or stand-in) ones of
    its GPU, for the figures `autopar probe` measured on it (`behaviour:`): GEMMs, the small-dimension
    fall-off, memory-bound kernels, attention at 4K and 16K, NCCL inside the node at 1 GiB."""
    from dataclasses import replace

    from autopar.spec.curves import MeasuredBehaviour

    m = cluster.measured
    plain = replace(cluster, measured=MeasuredBehaviour())
    rows: list[tuple[str, str, object]] = [
        ("achievable BF16 GEMM", "TFLOP/s", m.bf16_tflops),
        ("achievable FP8 GEMM", "TFLOP/s", m.fp8_tflops),
        ("GEMM fall-off x_half (BF16)", "dim", m.gemm_half_dim),
        ("memory-bound kernels", "GB/s", m.hbm_gbps),
        ("attention causal fwd @4K (native)", "TFLOP/s", m.attention_fwd_tflops),
        ("attention causal bwd @4K (native)", "TFLOP/s", m.attention_bwd_tflops),
        ("attention causal fwd @16K (native)", "TFLOP/s", m.attention_fwd_tflops),
        ("attention causal fwd+bwd @4K (FA2)", "TFLOP/s", m.attention_mma_sync_tflops),
        ("NVLink all-reduce busbw @1 GiB", "GB/s", m.nvlink_all_reduce_busbw),
        ("NVLink all-gather busbw", "GB/s", m.nvlink_all_gather_busbw),
        ("NVLink all-to-all busbw", "GB/s", m.nvlink_all_to_all_busbw),
    ]

    def value(c: ClusterSpec, name: str) -> float | None:
        beh = gpu_behaviour(c)
        a, nv = beh.attention, beh.nvlink
        bf16 = DTYPE["bf16"]
        figures = {
            "achievable BF16 GEMM": lambda: float(large_gemm_rate(c, bf16)) / 1e12,
            "achievable FP8 GEMM": lambda: beh.gemm.fp8_flops / 1e12,
            "GEMM fall-off x_half (BF16)": lambda: float(half_dims(c, bf16)),
            "memory-bound kernels": lambda: hbm_rate(c) / 1e9,
            "attention causal fwd @4K (native)": lambda: float(a.native_fwd(4096)) / 1e12 if a.native_fwd else None,
            "attention causal bwd @4K (native)": lambda: float(a.native_bwd(4096)) / 1e12 if a.native_bwd else None,
            "attention causal fwd @16K (native)": lambda: float(a.native_fwd(16384)) / 1e12 if a.native_fwd else None,
            "attention causal fwd+bwd @4K (FA2)": lambda: (
                float(a.mma_sync_fwd_bwd(4096)) / 1e12 if a.mma_sync_fwd_bwd else None
            ),
            "NVLink all-reduce busbw @1 GiB": lambda: (
                1.75 * 2**30 / float(nv.all_reduce_s(2**30)) / 1e9 if nv else None
            ),
            "NVLink all-gather busbw": lambda: nv.ring_busbw / 1e9 if nv else None,
            "NVLink all-to-all busbw": lambda: nv.all_to_all_busbw / 1e9 if nv else None,
        }
        return figures[name]()

    return [
        {"figure": name, "unit": unit, "published": value(plain, name), "this_cluster": value(cluster, name)}
        for name, unit, measured in rows
        if measured is not None
    ]
