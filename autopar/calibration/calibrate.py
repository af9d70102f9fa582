"""Fit the cost model to this machine: a hardware profile from `autopar probe` microbenchmarks, and
the efficiency/overlap/memory constants from trial measurements (bounded least squares on log
predicted/measured, autopar/calibration/fit.py); Spearman rank correlation by scipy.stats.spearmanr."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from autopar.calibration.estimate import estimate_table
from autopar.calibration.fit import FitResult, fit_constants
from autopar.figures import PEAK_MEMORY_BYTES, STEP_TIME_S
from autopar.spec.constants import constant_table
from autopar.spec.hardware import GIB, LOCAL, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.table import PlanTable

#: the profile whose ranges (autopar/spec/data/constants.toml) bound a calibration: trials run the
#: built-in model
CALIBRATED_PROFILE = "autopar"
#: step-time constants `calibrate` moves
TIME_CONSTANTS = (
    "gemm_efficiency",
    "layer_overhead_us",
    "elementwise_traffic_factor",
    "intra_node_bw_efficiency",
    "pp_overlap",
    "dp_overlap",
)
#: memory constants: allocator allowance on activations, fixed reservation
MEMORY_CONSTANTS = ("allocator_overhead_fraction", "runtime_reserved_gib")


def bounds(names) -> dict[str, tuple[float, float]]:
    """Each constant's documented range for the built-in model (the one table of ranges)."""
    table = constant_table()
    return {
        n: (table[n].for_profile(CALIBRATED_PROFILE).low, table[n].for_profile(CALIBRATED_PROFILE).high) for n in names
    }


def predict(
    plans: list[ParallelPlan], model: ModelSpec, cluster: ClusterSpec, num_gpus: int, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Predicted step time (s) and peak memory (bytes) of each plan."""
    est = estimate_table(PlanTable.from_plans(plans), model, cluster, num_gpus=num_gpus, seq_len=seq_len)
    return np.asarray(est[STEP_TIME_S], float), np.asarray(est[PEAK_MEMORY_BYTES], float)


@dataclass
class Calibration:
    cluster: ClusterSpec
    time_fit: FitResult
    memory_fit: FitResult | None
    predicted_s: np.ndarray
    measured_s: np.ndarray
    spearman_before: float
    spearman_after: float


def spearman(a, b) -> float:
    """Spearman's rank correlation; NaN for fewer than 2 values or a constant side (tied
    measurements: no ranking to correlate, not a warning on the user's terminal)."""
    from scipy.stats import spearmanr

    if len(a) < 2 or len(set(np.asarray(a, float))) < 2 or len(set(np.asarray(b, float))) < 2:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def calibrate(
    plans: list[ParallelPlan],
    measured_s,
    measured_mem,
    model: ModelSpec,
    cluster: ClusterSpec,
    num_gpus: int,
    seq_len: int,
    names: list[str] | None = None,
) -> Calibration:
    """Fit the step-time constants to measured step times, then the memory constants to measured
    peaks (bounded least squares, autopar.calibration.fit); returns the calibrated cluster and residuals."""
    measured_s = np.asarray(measured_s, float)
    measured_mem = np.asarray(measured_mem, float)

    def time_errors(k):
        return predict(plans, model, cluster.with_constants(k), num_gpus, seq_len)[0] / measured_s - 1

    names = [n for n in (names or TIME_CONSTANTS) if n in TIME_CONSTANTS]
    before = predict(plans, model, cluster, num_gpus, seq_len)[0]
    tfit = _multistart(time_errors, cluster.constants, names, bounds(TIME_CONSTANTS))
    mfit = None
    if np.all(measured_mem > 0):

        def mem_errors(k):
            return predict(plans, model, cluster.with_constants(k), num_gpus, seq_len)[1] / measured_mem - 1

        mfit = fit_constants(mem_errors, tfit.constants, list(MEMORY_CONSTANTS), bounds(MEMORY_CONSTANTS))
    consts = mfit.constants if mfit else tfit.constants
    out = cluster.with_constants(consts, name=(cluster.name or cluster.gpu.key) + " (calibrated)")
    after = predict(plans, model, out, num_gpus, seq_len)[0]
    return Calibration(
        cluster=out,
        time_fit=tfit,
        memory_fit=mfit,
        predicted_s=after,
        measured_s=measured_s,
        spearman_before=spearman(before, measured_s),
        spearman_after=spearman(after, measured_s),
    )


#: the step-time fit's tolerance (scipy's ftol and xtol): a part in a million of the cost, where
#: measured step times scatter by a percent; scipy's default 1e-8 spent most of a measured stage's
#: time polishing digits no measurement supports, three starts over
TIME_FIT_TOL = 1e-6


def _multistart(errors_for, start, names: list[str], bounds: dict, fractions=(0.1, 0.5)) -> FitResult:
    """fit_constants from the given constants and from points a fraction of the way up every bound
    (the fit is non-convex: overlaps and per-layer overheads trade off), the lowest cost kept."""
    fits = [fit_constants(errors_for, start, names, bounds, TIME_FIT_TOL)]
    for f in fractions:
        s = replace(start, **{n: bounds[n][0] + f * (bounds[n][1] - bounds[n][0]) for n in names})
        fits.append(fit_constants(errors_for, s, names, bounds, TIME_FIT_TOL))
    return min(fits, key=lambda r: float(np.sum(np.log1p(r.residuals) ** 2)))


def profile_dict(cluster: ClusterSpec, **extra) -> dict:
    """A cluster as a profile file (`--cluster`, or the `local` profile): gpu fields, links, constants."""
    gpu = asdict(cluster.gpu)
    out = {
        "name": cluster.name,
        "gpu": gpu,
        "gpus_per_node": cluster.gpus_per_node,
        "intra_node_gbps": cluster.intra_node_gbps,
        "inter_node_gbps": cluster.inter_node_gbps,
        "intra_node_latency_us": cluster.intra_node_latency_us,
        "inter_node_latency_us": cluster.inter_node_latency_us,
        "constants": asdict(cluster.constants),
    }
    measured = cluster.to_dict()["behaviour"]
    if measured:
        out["behaviour"] = measured
    return out | extra


def fit_gemm(gemm: list[dict]) -> tuple[float, float]:
    """Peak FLOP/s and half-efficiency dimension of rate = peak * x / (x + half), x = smallest GEMM
    dimension, least squares on log rates (the cost model's shape-efficiency curve)."""
    from scipy.optimize import least_squares

    x = np.array([min(g["m"], g["n"], g["k"]) for g in gemm], float)
    r = np.array([g["flops_per_s"] for g in gemm], float)

    def res(z):
        return np.log(np.exp(z[0]) * x / (x + np.exp(z[1]))) - np.log(r)

    sol = least_squares(res, [np.log(r.max()), np.log(16.0)])
    return float(np.exp(sol.x[0])), float(np.exp(sol.x[1]))


def profile_from_probe(gemm: dict, colls: list[dict], ranks: int, ram_bytes: float, efficiency: float = 0.9) -> dict:
    """The `local` profile from probe results: fp32 GEMM peak (the cost model runs fp32 at half its
    bf16 figure, so bf16_tflops = 2 x fitted fp32 peak / gemm_efficiency), memory bandwidth of an
    elementwise add, link bandwidth = the largest all-reduce bus bandwidth, latency = the smallest
    all-reduce's time / 2(n-1) steps; memory = RAM / ranks; one node of `ranks` ranks (on one
    machine there is no inter-node link: it is set equal to the intra-node one)."""
    peak, half = fit_gemm(gemm["gemm"])
    busbw = max((c["busbw_gbps"] for coll in colls for c in coll["all_reduce"]), default=1.0)
    lat = min(
        (c["seconds"] / max(1, 2 * (coll["world_size"] - 1)) for coll in colls for c in coll["all_reduce"]),
        default=50e-6,
    )
    return {
        "name": "local (autopar probe)",
        "gpu": {
            "key": LOCAL,
            "name": f"this machine (CPU, {gemm.get('threads', 1)} thread(s) per rank)",
            "bf16_tflops": 2 * peak / efficiency / 1e12,
            "fp8_tflops": 0.0,
            "hbm_gib": ram_bytes / ranks / GIB,
            "hbm_gbps": gemm["memory_bytes_per_s"] / 1e9,
            "intra_node_gbps": busbw,
            "nic_gbps": busbw,
            "gpus_per_node": ranks,
            "source": "autopar probe: GEMM, elementwise add and gloo collectives on this machine",
        },
        "gpus_per_node": ranks,
        "intra_node_gbps": busbw,
        "inter_node_gbps": busbw,
        "intra_node_latency_us": lat * 1e6,
        "inter_node_latency_us": lat * 1e6,
        "behaviour": {"gemm_half_dim": max(half, 1.0)},
        "constants": {
            "gemm_efficiency": efficiency,
            "runtime_reserved_gib": 0.0,
            "allocator_overhead_fraction": 0.0,
            "intra_node_bw_efficiency": 1.0,
            "inter_node_bw_efficiency": 1.0,
        },
    }


def cluster_from_gpu_probe(doc: dict, preset: str) -> dict:
    """The cluster file of a GPU probe (autopar.trial.probe.gpu_probe): the preset's datasheet figures,
    as many GPUs per node as the probe saw, and what it measured as the `behaviour:` mapping, which
    replaces the published figures of the same name (autopar.spec.behaviour.measured_behaviour):
    the achievable rate = the best of the large GEMMs (as ml-engineering's MAMF finder reports), the
    shape fall-off fitted to the small-M GEMMs, the copy's bandwidth, the attention curves of the
    backends that ran (cuDNN: Hopper-native forward and backward; FlashAttention-2: forward + backward),
    and, on a node of several GPUs, its NCCL all-reduce busbw by size and the large-message
    all-gather, all-to-all and send/recv rates."""
    from autopar.errors import InputError

    half = fit_gemm(doc["bf16_gemm_small_m"])[1]
    if not 1.0 <= half <= 65536.0:  # the GEMM shapes of any model; outside, the timings were not rates
        raise InputError(
            f"the probe's small-M GEMM rates do not follow rate = peak x / (x + x_half) (fitted x_half {half:.3g}); "
            "rerun autopar probe --device cuda on an idle GPU"
        )
    behaviour: dict = {
        "bf16_tflops": max(r["flops_per_s"] for r in doc["bf16_gemm"]) / 1e12,
        "gemm_half_dim": half,
        "hbm_gbps": doc["copy_bytes_per_s"] / 1e9,
    }
    if doc.get("fp8_gemm"):
        behaviour["fp8_tflops"] = max(r["flops_per_s"] for r in doc["fp8_gemm"]) / 1e12
    ran = {a["backend"]: a["rows"] for a in doc.get("attention", []) if a.get("rows")}
    seqs = {tuple(r["seq"] for r in rows) for rows in ran.values()}
    if len(seqs) == 1:
        behaviour["attention_seq"] = list(next(iter(seqs)))

        def tflops(rows: list[dict], key: str) -> list[float]:
            return [r[key] / 1e12 for r in rows]

        if "cudnn" in ran:
            for name, key in (
                ("fwd", "causal_fwd"),
                ("bwd", "causal_bwd"),
                ("fwd_full", "full_fwd"),
                ("bwd_full", "full_bwd"),
            ):
                behaviour[f"attention_{name}_tflops"] = tflops(ran["cudnn"], f"{key}_flops_per_s")
        if "flash" in ran:
            behaviour["attention_mma_sync_tflops"] = tflops(ran["flash"], "causal_fwd_bwd_flops_per_s")
            behaviour["attention_mma_sync_full_tflops"] = tflops(ran["flash"], "full_fwd_bwd_flops_per_s")
    node = doc.get("node_collectives") or {}
    if node.get("rows") and int(node.get("world_size", 1)) > 1:
        rows = node["rows"]
        behaviour |= {
            "nvlink_gpus": int(node["world_size"]),
            "nvlink_bytes": [r["bytes"] for r in rows],
            "nvlink_all_reduce_busbw": [r["all_reduce_busbw_gbps"] for r in rows],
            "nvlink_all_gather_busbw": rows[-1]["all_gather_busbw_gbps"],
            "nvlink_all_to_all_busbw": rows[-1]["all_to_all_busbw_gbps"],
            "nvlink_p2p_gbps": node["p2p_gbps"],
        }
    behaviour["source"] = (
        f"autopar probe on {doc['device']} (torch {doc['torch']}, CUDA {doc.get('cuda')}), {doc['date']}"
    )
    body: dict = {"name": f"{preset} as probed", "gpu": preset}
    if int(doc.get("device_count") or 1) > 1:
        # the node's GPUs as the probe saw them; one visible GPU says nothing about the node (a
        # scheduler may show one of eight), so the preset's node size stays
        body["gpus_per_node"] = int(doc["device_count"])
    return body | {"behaviour": behaviour}
