"""Hardware behaviour per GPU: the published microbenchmarks (data/hardware_behaviour.toml) as typed
curves the cost model reads: the achievable GEMM rate (MAMF) and its fall-off with small GEMM
dimensions, attention forward and backward rates by sequence length and head dimension, NCCL
collective time by message size inside a node, scale-out efficiency by message size and node count,
NCCL all-to-all and DeepEP dispatch bandwidths, the kernel-launch floor.

A GPU without a published figure takes a stand-in GPU's (named, with why, and scaled by the stated
factor); a GPU with no entry at all (a custom GPU of a cluster file, or `--gpu local` before `autopar
probe`) gets curves derived from its preset figures (`derived_behaviour`), said so in `stand_ins`.
A cluster file's `behaviour:` mapping (written by `autopar probe`) replaces the tables it gives.

Arithmetic here is unit conversion and interpolation of the published points only; which rate a plan
runs at is the cost model's (autopar.cost.kernels, autopar.cost.collectives).
"""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from functools import cache
from importlib import resources

import numpy as np

from autopar.spec.curves import (
    AttentionFigures,
    Curve,
    DispatchFigures,
    GemmFigures,
    GpuBehaviour,
    MeasuredBehaviour,
    NetworkFigures,
    NvlinkFigures,
    SharedFigures,
    scaled_attention,
)

_COMPUTE_TABLES = ("gemm", "attention")
#: keys of one curve: an entry giving `bytes` replaces the whole curve of its stand-in
_CURVE_KEYS = ("bytes", "all_reduce_us", "all_reduce_busbw")


@cache
def _data() -> dict:
    """The published behaviour table, parsed once (package data; its readers copy what they change:
    a GPU without published figures asks for it on every pricing, `behaviour` caching no KeyError)."""
    return tomllib.loads(resources.files("autopar.spec").joinpath("data/hardware_behaviour.toml").read_text())


@cache
def shared_figures() -> SharedFigures:
    d = _data()
    g = d["gemm_shape"]
    points = _shape_points(g["dense"], g["grouped_large"], g["grouped_small"])
    hd = d["attention_head_dim"]
    head: dict[int | str, Curve] = {
        int(k.removeprefix("causal_hd")): Curve(tuple(hd["seq"]), tuple(v))
        for k, v in hd.items()
        if k.startswith("causal_hd")
    }
    head["noncausal"] = Curve(tuple(hd["seq"]), tuple(hd["noncausal_hd128"]))
    n = d["network"]
    network = NetworkFigures(
        nic_fraction=n["nic_achieved_gbps"] / n["nic_line_gbps"],
        scan_small=(
            n["scan_small_gpus"],
            Curve(tuple(n["scan_small_bytes"]), tuple(v * 1e9 for v in n["scan_small_busbw"])),
        ),
        scan_large=(
            n["scan_large_gpus"],
            Curve(tuple(n["scan_large_bytes"]), tuple(v * 1e9 for v in n["scan_large_busbw"])),
        ),
        all_to_all_fraction=n["all_to_all_busbw_gbps"] / n["nic_line_gbps"],
        base_latency_s=n["base_latency_us"] * 1e-6,
        hop_latency_s=n["hop_latency_us"] * 1e-6,
        nvlink_hop_latency_s=n["nvlink_hop_latency_us"] * 1e-6,
        source="; ".join(n[k] for k in ("source_nic", "source_scan", "source_all_to_all", "source_latency")),
    )
    x = d["dispatch"]
    dispatch = DispatchFigures(
        rdma_fraction=float(np.mean(x["rdma_gbps"])) / n["nic_line_gbps"],
        nvlink_fraction=_nvlink_fraction(x["nvlink_gbps"], x["nvlink_gpu"]),
        sms=int(x["sms"]),
        overhead_per_sm_share=x["gemm_overhead"] / (x["sms"] / int(d[x["gemm_overhead_gpu"]]["sms"])),
        kernels_per_layer=x["kernels"] / x["layer_passes"],
        source="; ".join(x[k] for k in ("source_rdma", "source_nvlink", "source_sms", "source_kernels")),
    )
    return SharedFigures(
        shape_points=points,
        shape_ridge=g["ridge_flops_per_byte"],
        head_dim=head,
        network=network,
        dispatch=dispatch,
        kernel_launch_s=d["launch"]["kernel_launch_us"] * 1e-6,
        nccl_sms=float(np.mean(d["nccl"]["sms"])),
        ub_sms=float(np.mean(d["nccl"]["ub_sms"])),
        sources={
            "nccl": d["nccl"]["source_sms"],
            "gemm_shape": g["source"],
            "attention_head_dim": hd["source"],
            "launch": d["launch"]["source"],
            "nic": n["source_nic"],
            "network_all_to_all": n["source_all_to_all"],
            "dispatch_rdma": x["source_rdma"],
            "dispatch_nvlink": x["source_nvlink"],
        },
    )


def _nvlink_fraction(gbps: list[float], gpu: str) -> float:
    """A dispatcher's measured NVLink rate as a fraction of the GPU preset's line rate."""
    from autopar.spec.hardware import get_gpu

    return float(np.mean(gbps)) / get_gpu(gpu).intra_node_gbps


def _shape_points(dense, grouped_large, grouped_small) -> tuple[tuple[float, float], ...]:
    """(M, rate at M / rate at a large M of the same N and K): dense rows against M = 4096, grouped
    masked rows against the contiguous (large-group) rows of the same N and K. Mean per M."""
    large = {(n, k): t for m, n, k, t in dense if m == 4096}
    large_grouped = {(n, k): t for m, n, k, t in grouped_large}
    by_m: dict[float, list[float]] = {}
    for m, n, k, t in dense:
        if m < 4096:
            by_m.setdefault(float(m), []).append(t / large[(n, k)])
    for m, n, k, t in grouped_small:
        by_m.setdefault(float(m), []).append(t / large_grouped[(n, k)])
    return tuple((m, float(np.mean(v))) for m, v in sorted(by_m.items())) + ((4096.0, 1.0),)


# ---- per GPU -------------------------------------------------------------------------------------


def _merged(key: str, table: dict, seen: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """The GPU's tables with its stand-in's filled in (scaled), and the stand-in notes."""
    if key in seen:
        raise ValueError(f"hardware_behaviour.toml: stand-in cycle {' -> '.join(seen + (key,))}")
    own = copy.deepcopy(table[key])
    notes: list[str] = []
    base_key = own.pop("stand_in", None)
    why = own.pop("stand_in_why", "")
    if base_key is None:
        hbm = own.get("hbm", {})
        if "achieved_tbps" in hbm:  # as a fraction of this GPU's own HBM peak, which a stand-in inherits
            from autopar.spec.hardware import get_gpu

            hbm["achieved_fraction"] = hbm.pop("achieved_tbps") * 1e3 / get_gpu(key).hbm_gbps
        return own, notes
    base, base_notes = _merged(base_key, table, seen + (key,))
    notes += base_notes
    out = copy.deepcopy(base)
    for name in ("scale_compute", "scale_nvlink"):
        factor = own.pop(name, None)
        if factor is None:
            continue
        for t in _COMPUTE_TABLES if name == "scale_compute" else ("nvlink",):
            if t in out and t not in own:
                out[t] = dict(out[t], _scale=out[t].get("_scale", 1.0) * factor)
    for t, v in own.items():
        if isinstance(v, dict) and isinstance(out.get(t), dict):
            inherited = {k: x for k, x in out[t].items() if not (k in _CURVE_KEYS and "bytes" in v)}
            if t in _COMPUTE_TABLES:
                inherited.pop("_scale", None) if t == "gemm" else None
            out[t] = inherited | v
        else:
            out[t] = v
    inherited_tables = sorted(
        t for t, v in base.items() if isinstance(v, dict) and (t not in own or set(v) - set(own.get(t, {})))
    )
    notes.append(f"{', '.join(inherited_tables)} from {base_key}: {why}")
    return out, notes


def _attention(t: dict, gpus: dict, shared_hd: dict[int | str, Curve]) -> AttentionFigures:
    scale = t.get("_scale", 1.0)
    if "stand_in" in t:  # a sub-table stand-in: another GPU's attention scaled
        other = behaviour(t["stand_in"]).attention
        return scaled_attention(other, t["scale"] * scale, f"{t['stand_in']} x {t['scale']}: {t['stand_in_why']}")
    fwd = bwd = fwd_full = bwd_full = None
    if "fwd_us" in t:
        seq = tuple(float(s) for s in t["seq"])
        flops = [4.0 * t["batch"] * s * s * t["heads"] * t["head_dim"] / 2 for s in seq]
        fwd = Curve(seq, tuple(f / (us * 1e-6) * scale for f, us in zip(flops, t["fwd_us"])), saturating=True)
        bwd = Curve(seq, tuple(2.5 * f / (us * 1e-6) * scale for f, us in zip(flops, t["bwd_us"])), saturating=True)
        unmasked = shared_hd["noncausal"](seq) / shared_hd[128](seq)
        fwd_full = Curve(seq, tuple(float(v) for v in fwd(seq) * unmasked), saturating=True)
        bwd_full = Curve(seq, tuple(float(v) for v in bwd(seq) * unmasked), saturating=True)
    elif "at_seq" in t:  # one published point: the shape in S of another GPU's curve
        shape = behaviour(t["shape_from"]).attention
        at = t["at_seq"]

        def fit(curve: Curve | None, tflops: float) -> Curve:
            assert curve is not None  # the shape's GPU publishes its native curves
            return curve.scaled(tflops * 1e12 * scale / float(curve(at)))

        fwd, bwd = fit(shape.native_fwd, t["fwd_tflops"]), fit(shape.native_bwd, t["bwd_tflops"])
        fwd_full = fit(shape.native_fwd_full, t["noncausal_fwd_tflops"])
        bwd_full = fit(shape.native_bwd_full, t["noncausal_bwd_tflops"])
    fa2 = ratio = fa2_full = None
    if "fa2_causal_hd128" in t:
        seq = tuple(float(s) for s in t["fa2_seq"])
        fa2 = Curve(seq, tuple(v * 1e12 * scale for v in t["fa2_causal_hd128"]))
        ratio = Curve(seq, tuple(a / b for a, b in zip(t["fa2_causal_hd64"], t["fa2_causal_hd128"])))
        full_seq = tuple(float(s) for s in t["fa2_noncausal_seq"])
        fa2_full = Curve(full_seq, tuple(v * 1e12 * scale for v in t["fa2_noncausal_hd128"]))
    sources = "; ".join(str(t[k]) for k in ("source", "source_fa2") if k in t)
    return AttentionFigures(fwd, bwd, fa2, ratio, sources, fwd_full, bwd_full, fa2_full)


def _nvlink(t: dict | None) -> NvlinkFigures | None:
    if t is None or "bytes" not in t:
        return None
    scale = t.get("_scale", 1.0)
    size = tuple(float(b) for b in t["bytes"])
    if "all_reduce_us" in t:
        secs = tuple(us * 1e-6 / scale for us in t["all_reduce_us"])
    else:  # busbw = 2(n-1)/n x bytes / time, n = 8
        secs = tuple(1.75 * b / (bw * 1e9 * scale) for b, bw in zip(size, t["all_reduce_busbw"]))
    ring = t["ring_busbw_gbps"] * 1e9 * scale
    by = None
    if "by_gpus" in t:
        by = Curve(tuple(float(n) for n in t["by_gpus"]), tuple(v * 1e9 * scale for v in t["by_gpus_busbw"]))
    large = 1.75 * size[-1] / secs[-1]
    return NvlinkFigures(
        all_reduce_s=Curve(size, secs),
        ring_busbw=ring,
        sharp_busbw=t.get("sharp_busbw_gbps", large / 1e9 / scale) * 1e9 * scale,
        by_gpus=by,
        all_to_all_busbw=t["all_to_all_busbw_gbps"] * 1e9 * scale,
        p2p=t.get("p2p_gbps", ring / 1e9 / scale) * 1e9 * scale,
        source="; ".join(str(v) for k, v in t.items() if k.startswith("source")),
        all_to_all_source=str(t.get("source_all_to_all", "")),
    )


@cache
def behaviour(key: str) -> GpuBehaviour:
    """The published behaviour of a GPU preset (with its stand-ins), or KeyError."""
    from autopar.spec.hardware import get_gpu

    d = _data()
    gpus = {k: v for k, v in d.items() if isinstance(v, dict) and "gemm_shape" != k and k in _gpu_keys(d)}
    if key not in gpus:
        raise KeyError(key)
    t, notes = _merged(key, gpus)
    spec = get_gpu(key)
    g = t["gemm"]
    gs = g.get("_scale", 1.0)
    fp8 = g["fp8_tflops"] * 1e12 * gs
    if fp8 <= 0 and spec.fp8_tflops > 0:  # FP8 tensor cores without a published MAMF: BF16's fraction
        fp8 = g["bf16_tflops"] * gs / spec.bf16_tflops * spec.fp8_tflops * 1e12
        notes.append("FP8 GEMM rate: the BF16 MAMF's fraction of peak (no published FP8 MAMF)")
    hbm = t["hbm"]
    fraction = hbm["achieved_fraction"]
    if "stand_in_why" in hbm:
        notes.append(f"HBM: {hbm['stand_in_why']}")
    return GpuBehaviour(
        key=key,
        gemm=GemmFigures(g["bf16_tflops"] * 1e12 * gs, fp8, g["source"]),
        hbm_fraction=float(fraction),
        attention=_attention(t["attention"], gpus, shared_figures().head_dim),
        nvlink=_nvlink(t.get("nvlink")),
        sms=int(t["sms"]),
        dispatch_nvlink_fraction=_nvlink_fraction(t["dispatch"]["nvlink_gbps"], key) if "dispatch" in t else None,
        dispatch_source=t["dispatch"]["source"] if "dispatch" in t else "",
        stand_ins=tuple(notes),
    )


def _gpu_keys(d: dict) -> set[str]:
    shared = {"gemm_shape", "attention_head_dim", "network", "dispatch", "nccl", "launch"}
    return {k for k, v in d.items() if isinstance(v, dict) and k not in shared}


def published_gpus() -> list[str]:
    return sorted(_gpu_keys(_data()))


def derived_behaviour(gpu) -> GpuBehaviour:
    """Curves for a GPU with no published microbenchmark (a custom GPU of a cluster file, the local
    CPU profile): its preset peaks as the achievable rates (a probe measures achieved rates), the
    H100's attention curves scaled by the ratio of peaks, links from the preset's line rates."""
    h100 = behaviour("h100-sxm")
    ratio = gpu.bf16_tflops * 1e12 / h100.gemm.bf16_flops
    att = h100.attention
    return GpuBehaviour(
        key=gpu.key,
        gemm=GemmFigures(gpu.bf16_tflops * 1e12, gpu.fp8_tflops * 1e12, f"the preset's peak ({gpu.source})"),
        hbm_fraction=1.0,
        attention=scaled_attention(att, ratio, f"h100-sxm x {ratio:.3g} (ratio of peaks)"),
        nvlink=None,
        sms=h100.sms,
        stand_ins=(
            f"every figure derived from {gpu.key}'s preset (no published microbenchmark): GEMM at its peak, "
            "attention as the H100's scaled by the ratio of peaks, links at their line rates",
        ),
    )


def behaviour_of(gpu) -> GpuBehaviour:
    """The behaviour the cost model prices a GpuSpec with: its published one, else derived; under a
    power limit below its TDP, the compute figures (GEMM, attention) at the clock the cap leaves
    (autopar.spec.hardware.compute_clock_factor). Memory-bound kernels and the links keep theirs: no
    source shows HBM or NVLink clocks falling under a cap."""
    from autopar.spec.hardware import compute_clock_factor

    try:
        beh = behaviour(gpu.key)
    except KeyError:
        beh = derived_behaviour(gpu)
    factor = compute_clock_factor(gpu)
    if factor == 1.0:
        return beh
    why = f"x {factor:.3f} at the {gpu.power_limit_w:g} W power limit of a {gpu.tdp_w:g} W GPU"
    return dataclasses.replace(
        beh,
        gemm=GemmFigures(beh.gemm.bf16_flops * factor, beh.gemm.fp8_flops * factor, f"{beh.gemm.source}; {why}"),
        attention=scaled_attention(beh.attention, factor, f"{beh.attention.source}; {why}"),
        stand_ins=beh.stand_ins + (f"GEMM and attention {why}",),
    )


@cache
def measured_behaviour(gpu, measured: MeasuredBehaviour) -> GpuBehaviour:
    """The GPU's behaviour with what `autopar probe` measured on the cluster in place of the published
    (or derived) figures of the same name; the ones it did not measure stay, and `stand_ins` says
    which figures the probe replaced."""
    beh = behaviour_of(gpu)
    if not measured.overrides():
        return beh
    m, src = measured, measured.source or "autopar probe"
    gemm = beh.gemm
    if m.bf16_tflops is not None or m.fp8_tflops is not None:
        gemm = GemmFigures(
            m.bf16_tflops * 1e12 if m.bf16_tflops is not None else gemm.bf16_flops,
            m.fp8_tflops * 1e12 if m.fp8_tflops is not None else gemm.fp8_flops,
            src,
        )
    att = beh.attention
    if m.attention_seq is not None:

        def curve(tflops: tuple[float, ...] | None) -> Curve | None:
            return None if tflops is None else Curve(m.attention_seq or (), tuple(v * 1e12 for v in tflops))

        native = {}
        if m.attention_fwd_tflops is not None:
            native = {
                "native_fwd": curve(m.attention_fwd_tflops),
                "native_bwd": curve(m.attention_bwd_tflops),
                "native_fwd_full": curve(m.attention_fwd_full_tflops),
                "native_bwd_full": curve(m.attention_bwd_full_tflops),
            }
        mma = {}
        if m.attention_mma_sync_tflops is not None:
            mma = {
                "mma_sync_fwd_bwd": curve(m.attention_mma_sync_tflops),
                "mma_sync_fwd_bwd_full": curve(m.attention_mma_sync_full_tflops),
                # head dim 64 against 128 is not probed: the published ratio, else none
                "mma_sync_hd64_ratio": att.mma_sync_hd64_ratio or Curve((1.0,), (1.0,)),
            }
        att = dataclasses.replace(att, **native, **mma, source=f"{src}; {att.source}")
    nvlink = beh.nvlink
    if m.nvlink_bytes is not None and m.nvlink_all_reduce_busbw is not None:
        assert m.nvlink_all_gather_busbw and m.nvlink_all_to_all_busbw and m.nvlink_p2p_gbps  # together
        # the cost model reads an 8-GPU all-reduce's time by size: busbw = 2(n-1)/n x size / time, n = 8
        size, busbw = m.nvlink_bytes, [b * 1e9 for b in m.nvlink_all_reduce_busbw]
        nvlink = NvlinkFigures(
            all_reduce_s=Curve(size, tuple(1.75 * s / b for s, b in zip(size, busbw))),
            ring_busbw=m.nvlink_all_gather_busbw * 1e9,
            sharp_busbw=busbw[-1],
            by_gpus=None,
            all_to_all_busbw=m.nvlink_all_to_all_busbw * 1e9,
            p2p=m.nvlink_p2p_gbps * 1e9,
            source=f"{src} ({m.nvlink_gpus:g} GPUs)",
            all_to_all_source=f"{src} ({m.nvlink_gpus:g} GPUs)",
        )
    measured_names = [k for k, v in vars(m).items() if v is not None and k != "source"]
    return dataclasses.replace(
        beh,
        nvlink=nvlink,
        gemm=gemm,
        hbm_fraction=m.hbm_gbps / gpu.hbm_gbps if m.hbm_gbps is not None else beh.hbm_fraction,
        attention=att,
        stand_ins=(*beh.stand_ins, f"measured on this cluster ({src}): {', '.join(measured_names)}"),
    )
