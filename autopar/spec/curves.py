"""The typed figures of the hardware behaviour data (autopar.spec.behaviour reads them from
data/hardware_behaviour.toml): measured curves, and what each GPU's kernels and links are measured to
reach."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
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

    @cached_property
    def _log_points(self) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        return np.log(self.x), np.log(self.y)

    def log_at(self, log_q) -> np.ndarray:
        """log y at log q: one interpolation, where y(q) would take a log and an exp more (a
        saturating curve goes through y)."""
        import numpy as np

        if self.saturating:
            return np.log(self(np.exp(log_q)))
        return np.interp(log_q, *self._log_points)

    def __call__(self, q) -> np.ndarray:
        import numpy as np

        q = np.asarray(q, dtype=float)
        inside = np.exp(np.interp(np.log(np.maximum(q, 1e-30)), *self._log_points))
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
    #: a ring step between two GPUs of one node over NVLink (NCCL's Ring Simple hop)
    nvlink_hop_latency_s: float
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
    replacing the published or derived figure of the same name; None = not measured.

    The figures have the published tables' conventions (data/hardware_behaviour.toml): achievable
    GEMM rates (the best of large shapes, as ml-engineering's MAMF finder reports), attention at head
    dim 128 by sequence length with forward FLOPs 4 B S^2 H D (/2 causal) and backward 2.5 x the
    forward's, and the bytes a device-to-device copy reads and writes per second."""

    #: x_half of the GEMM shape fall-off x / (x + x_half), fitted to the probe's GEMMs by shape
    gemm_half_dim: float | None = None
    #: achievable dense GEMM TFLOP/s (MAMF) in BF16 and in FP8
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    #: achieved HBM GB/s of a large device-to-device copy (read + write)
    hbm_gbps: float | None = None
    #: sequence lengths of the attention curves below, increasing
    attention_seq: tuple[float, ...] | None = None
    #: Hopper-native attention (cuDNN fused attention through PyTorch SDPA), TFLOP/s per length:
    #: causal forward and backward, and unmasked (context-parallel off-diagonal blocks)
    attention_fwd_tflops: tuple[float, ...] | None = None
    attention_bwd_tflops: tuple[float, ...] | None = None
    attention_fwd_full_tflops: tuple[float, ...] | None = None
    attention_bwd_full_tflops: tuple[float, ...] | None = None
    #: FlashAttention-2-class (mma.sync) attention, forward + backward at one rate, causal and unmasked
    attention_mma_sync_tflops: tuple[float, ...] | None = None
    attention_mma_sync_full_tflops: tuple[float, ...] | None = None
    #: NCCL inside one node, measured on `nvlink_gpus` GPUs: all-reduce busbw (GB/s) by buffer bytes,
    #: and the large-message all-gather (ring), all-to-all busbw and one-direction send/recv rate
    nvlink_gpus: float | None = None
    nvlink_bytes: tuple[float, ...] | None = None
    nvlink_all_reduce_busbw: tuple[float, ...] | None = None
    nvlink_all_gather_busbw: float | None = None
    nvlink_all_to_all_busbw: float | None = None
    nvlink_p2p_gbps: float | None = None
    #: what measured them (the device, the software, the date)
    source: str | None = None

    @classmethod
    def from_dict(cls, data: object, origin: str) -> "MeasuredBehaviour":
        if not isinstance(data, dict):
            raise InputError(f"{origin}: 'behaviour' must be a mapping, e.g. behaviour: {{gemm_half_dim: 8}}")
        numbers = {"gemm_half_dim": (1e-3, 1e6), "bf16_tflops": (1e-6, 1e5), "fp8_tflops": (1e-6, 1e5)}
        numbers["hbm_gbps"] = (1e-3, 1e6)
        numbers |= {f"nvlink_{k}": (1e-6, 1e5) for k in ("all_gather_busbw", "all_to_all_busbw", "p2p_gbps")}
        numbers["nvlink_gpus"] = (2, 72)
        known = [*numbers, "attention_seq", *_MEASURED_CURVES, *_NVLINK_CURVES, "source"]
        out: dict = {}
        for k, v in data.items():
            if k not in known:
                raise InputError(f"{origin}: unknown behaviour field {quoted(str(k), 40)}; known: {', '.join(known)}")
            if k == "source":
                if not isinstance(v, str) or len(v) > 1024:
                    raise InputError(f"{origin}: behaviour.source must be text (at most 1024 characters)")
                out[k] = v
            elif k in numbers:
                lo, hi = numbers[k]
                if not _finite_number(v) or not lo <= v <= hi:
                    raise InputError(f"{origin}: behaviour.{k} must be a number in [{lo:g}, {hi:g}], got {quoted(v)}")
                out[k] = float(v)
            else:
                top = 1e15 if k == "nvlink_bytes" else 1e9  # buffer bytes; rates and lengths
                if not isinstance(v, list) or not v or not all(_finite_number(x) and 0 < x <= top for x in v):
                    raise InputError(f"{origin}: behaviour.{k} must be a list of positive numbers, got {quoted(v)}")
                out[k] = tuple(float(x) for x in v)
        return cls._checked(out, origin)

    @classmethod
    def _checked(cls, out: dict, origin: str) -> "MeasuredBehaviour":
        nvlink = [k for k in _NVLINK_FIELDS if k in out]
        if nvlink and len(nvlink) != len(_NVLINK_FIELDS):
            missing = [k for k in _NVLINK_FIELDS if k not in out]
            raise InputError(f"{origin}: behaviour.{nvlink[0]} comes with {', '.join(missing)} (measured together)")
        if nvlink:
            sizes, busbw = out["nvlink_bytes"], out["nvlink_all_reduce_busbw"]
            if list(sizes) != sorted(set(sizes)) or len(busbw) != len(sizes):
                raise InputError(
                    f"{origin}: behaviour.nvlink_bytes must increase and nvlink_all_reduce_busbw give one value each"
                )
        given = [k for k in _MEASURED_CURVES if k in out]
        seq = out.get("attention_seq")
        if given and seq is None:
            raise InputError(f"{origin}: behaviour.{given[0]} needs behaviour.attention_seq (its sequence lengths)")
        if seq is not None and list(seq) != sorted(set(seq)):
            raise InputError(f"{origin}: behaviour.attention_seq must increase, got {list(seq)}")
        for k in given:
            if len(out[k]) != len(seq or ()):
                raise InputError(
                    f"{origin}: behaviour.{k} has {len(out[k])} values for {len(seq or ())} lengths in attention_seq"
                )
        for group in (_MEASURED_CURVES[:4], _MEASURED_CURVES[4:]):
            have = [k for k in group if k in out]
            if have and len(have) != len(group):
                missing = [k for k in group if k not in out]
                raise InputError(f"{origin}: behaviour.{have[0]} comes with {', '.join(missing)} (measured together)")
        return cls(**out)

    def overrides(self) -> bool:
        """Whether any figure was measured."""
        return any(v is not None for k, v in vars(self).items() if k != "source")


#: the attention curves of MeasuredBehaviour: the four native ones, then the two FlashAttention-2 ones
_MEASURED_CURVES = (
    "attention_fwd_tflops",
    "attention_bwd_tflops",
    "attention_fwd_full_tflops",
    "attention_bwd_full_tflops",
    "attention_mma_sync_tflops",
    "attention_mma_sync_full_tflops",
)


#: the node's collectives of MeasuredBehaviour, measured together; the first two are curves
_NVLINK_CURVES = ("nvlink_bytes", "nvlink_all_reduce_busbw")
_NVLINK_FIELDS = (
    *_NVLINK_CURVES,
    "nvlink_gpus",
    "nvlink_all_gather_busbw",
    "nvlink_all_to_all_busbw",
    "nvlink_p2p_gbps",
)


def _finite_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
