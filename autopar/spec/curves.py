"""The typed figures of the hardware behaviour data (autopar.spec.behaviour reads them from
data/hardware_behaviour.toml): measured curves, and what each GPU's kernels and links are measured to
reach."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autopar.errors import InputError, quoted

if TYPE_CHECKING:  # numpy is imported where a curve is evaluated: reading the presets (`autopar
    import numpy as np  # search` checking --gpu) does not pay for it


@dataclass(frozen=True)
class Curve:
    """A measured curve y(x), interpolated piecewise-linearly in log x and log y; flat beyond its ends,
    or, `saturating`, continued above its last point as y_inf x / (x + x_h) through its last two
    points (a kernel rate still rising where the measurements stop: it nears its asymptote)."""

    x: tuple[float, ...]
    y: tuple[float, ...]
    saturating: bool = False

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y) or not self.x or any(v <= 0 for v in (*self.x, *self.y)):
            raise ValueError(f"a curve needs positive points of equal count, got {self.x} / {self.y}")
        if list(self.x) != sorted(self.x):
            raise ValueError(f"a curve's x must increase, got {self.x}")

    def __call__(self, q) -> np.ndarray:
        import numpy as np

        q = np.asarray(q, dtype=float)
        inside = np.exp(np.interp(np.log(np.maximum(q, 1e-30)), np.log(self.x), np.log(self.y)))
        if not self.saturating or len(self.x) < 2 or self.y[-1] <= self.y[-2]:
            return inside
        (x1, x2), (y1, y2) = self.x[-2:], self.y[-2:]
        # y = a x / (x + h) through (x1, y1) and (x2, y2)
        h = x1 * x2 * (y2 - y1) / (y1 * x2 - y2 * x1)
        a = y2 * (x2 + h) / x2
        return np.where(q > x2, a * q / (q + h), inside)

    def scaled(self, factor: float) -> "Curve":
        return Curve(self.x, tuple(v * factor for v in self.y), self.saturating)


@dataclass(frozen=True)
class GemmFigures:
    bf16_flops: float  # achievable (MAMF) FLOP/s
    fp8_flops: float  # 0: no FP8 tensor cores
    source: str


@dataclass(frozen=True)
class AttentionFigures:
    """Attention at head dim 128, FLOP/s by sequence length, causal and without a mask (`full`: the
    off-diagonal blocks of context-parallel attention). `native`: Hopper-native / newer kernels
    (FlashAttention-3, cuDNN fused attention, FlashAttention-4); `mma_sync`: FlashAttention-2
    forward + backward (one rate for both passes), or None where it is not published. Where the
    unmasked backward is not published it is the causal backward x the forwards' ratio at that length."""

    native_fwd: Curve | None
    native_bwd: Curve | None
    mma_sync_fwd_bwd: Curve | None
    mma_sync_hd64_ratio: Curve | None  # FA2 head dim 64 / 128, by sequence length
    source: str
    native_fwd_full: Curve | None = None
    native_bwd_full: Curve | None = None
    mma_sync_fwd_bwd_full: Curve | None = None


@dataclass(frozen=True)
class NvlinkFigures:
    """NCCL inside one NVLink domain."""

    all_reduce_s: Curve  # seconds of an 8-GPU all-reduce by buffer bytes
    ring_busbw: float  # B/s, large messages, ring algorithms (all-gather, reduce-scatter)
    sharp_busbw: float  # B/s, large-message all-reduce with NVLink SHARP (NVLS); = ring without it
    by_gpus: Curve | None  # large-message all-reduce busbw by group size (NVLS from 5 GPUs)
    all_to_all_busbw: float
    p2p: float  # B/s, one direction
    source: str
    all_to_all_source: str = ""


@dataclass(frozen=True)
class NetworkFigures:
    nic_fraction: float  # what a collective reaches of a NIC's line rate
    scan_small: tuple[int, Curve]  # (GPUs, all-reduce busbw by bytes)
    scan_large: tuple[int, Curve]
    all_to_all_fraction: float  # NCCL all-to-all per NIC, of its line rate
    base_latency_s: float
    hop_latency_s: float
    source: str


@dataclass(frozen=True)
class DispatchFigures:
    rdma_fraction: float  # DeepEP RDMA bottleneck bandwidth / NIC line rate
    nvlink_fraction: float  # DeepEP intranode bandwidth / NVLink line rate
    sms: int  # SMs a dispatcher takes from concurrent GEMMs
    #: GEMM-efficiency loss beside the dispatcher per SM share it takes (measured loss / SM share on
    #: the measured GPU: the SMs plus the memory traffic they bring)
    overhead_per_sm_share: float
    kernels_per_layer: float  # kernels of one MoE layer, forward + backward (DeepSeek's stack)
    source: str


@dataclass(frozen=True)
class GpuBehaviour:
    key: str
    gemm: GemmFigures
    hbm_fraction: float  # achievable fraction of the HBM peak for memory-bound kernels
    attention: AttentionFigures
    nvlink: NvlinkFigures | None  # None: priced from the preset's link figures (autopar.cost.collectives)
    sms: int
    #: DeepEP / HybridEP's NVLink rate as a fraction of the line rate on this GPU generation; None:
    #: the shared (Hopper) figure
    dispatch_nvlink_fraction: float | None = None
    dispatch_source: str = ""
    #: "figure: the GPU standing in, and why" for every figure not published for this GPU
    stand_ins: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class SharedFigures:
    shape_points: tuple[tuple[float, float], ...]  # (smallest dimension, rate / large-shape rate)
    shape_ridge: float  # FLOP per byte of the GPU the shape points were measured on
    head_dim: dict  # head dim -> causal forward rate by sequence length; "noncausal": head dim 128 unmasked
    network: NetworkFigures
    dispatch: DispatchFigures
    kernel_launch_s: float
    nccl_sms: float  # SMs a NCCL collective occupies beside compute (mean of the published range)
    ub_sms: float  # the same with user-buffer registration
    sources: dict[str, str]


def scaled_attention(a: AttentionFigures, factor: float, source: str) -> AttentionFigures:
    """Every rate curve of `a` x `factor` (the head-dim ratio is a ratio: kept)."""
    curves = {
        k: (c.scaled(factor) if isinstance(c, Curve) and k != "mma_sync_hd64_ratio" else c)
        for k, c in vars(a).items()
        if k != "source"
    }
    return AttentionFigures(**curves, source=source)


@dataclass(frozen=True)
class MeasuredBehaviour:
    """What `autopar probe` measured on the user's cluster (a cluster file's `behaviour:` mapping),
    replacing the published or derived figure of the same name; None = not measured."""

    #: x_half of the GEMM shape fall-off x / (x + x_half), fitted to the probe's GEMMs by shape
    gemm_half_dim: float | None = None

    @classmethod
    def from_dict(cls, data: object, origin: str) -> "MeasuredBehaviour":
        if not isinstance(data, dict):
            raise InputError(f"{origin}: 'behaviour' must be a mapping, e.g. behaviour: {{gemm_half_dim: 8}}")
        known = {"gemm_half_dim": (1e-3, 1e6)}
        for k, v in data.items():
            if k not in known:
                raise InputError(f"{origin}: unknown behaviour field {quoted(str(k), 40)}; known: {', '.join(known)}")
            lo, hi = known[k]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
                raise InputError(f"{origin}: behaviour.{k} must be a number in [{lo:g}, {hi:g}], got {quoted(v)}")
        return cls(**{k: float(v) for k, v in data.items()})
