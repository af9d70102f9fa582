"""The estimate's columns from its terms: the per-plan columns (memory on the most loaded rank,
time terms, throughput, MFU), the search's ranking columns, the per-axis communication bytes, the
per-rank (per-stage) columns, and the validity columns (valid, fits, rejected_code)."""

from __future__ import annotations

import numpy as np

from autopar.cost.comm_terms import CommTerms
from autopar.cost.flops import model_flops_per_step
from autopar.cost.memory_terms import MemoryTerms
from autopar.cost.plan_arrays import PlanArrays
from autopar.cost.step import StepTerms
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.rules import RuleResult

#: the bit of `rejected_code` for "valid, but does not fit in memory" (rule bits count from 0)
MEMORY_BIT = 63

#: what a search ranks and filters every plan by (autopar.search.streaming; plans.parquet)
RANKING_COLUMNS = (
    "valid",
    "fits",
    "rejected_code",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_memory_bytes",
    "memory_capacity_bytes",
    "memory_miss_gib",
    "bubble_fraction",
)


def ranking_columns(
    x: PlanArrays,
    model: ModelSpec,
    cluster: ClusterSpec,
    rules: RuleResult,
    memory: MemoryTerms,
    step: StepTerms,
    headroom_gib: float = 0.0,
) -> dict[str, np.ndarray]:
    """RANKING_COLUMNS only, equal to `plan_columns`' (the search re-prices the plans it keeps in full)."""
    gbs = x.table.global_batch_size.astype(float)
    n_gpus = x.table.num_gpus.astype(float)
    flops = model_flops_per_step(model, gbs, x.seq_len, x.tp)
    out = {
        "peak_memory_bytes": np.max(np.where(x.active, memory.total(), -np.inf), axis=0),
        "memory_capacity_bytes": np.full(len(x.table), cluster.gpu.hbm_bytes),
        "step_time_s": step.step,
        "tokens_per_s": gbs * x.seq_len / step.step,
        "tokens_per_s_per_gpu": gbs * x.seq_len / step.step / n_gpus,
        "mfu": flops / step.step / n_gpus / (cluster.gpu.bf16_tflops * 1e12),
        "bubble_fraction": step.bubble_fraction,
    }
    set_validity(out, rules.codes(), headroom_gib)
    return out


def plan_columns(
    x: PlanArrays,
    xt: PlanArrays,
    model: ModelSpec,
    cluster: ClusterSpec,
    rules: RuleResult,
    memory: MemoryTerms,
    step: StepTerms,
    recompute_flops,
    params,
    headroom_gib: float = 0.0,
) -> dict[str, np.ndarray]:
    """The per-plan columns: memory on the most loaded rank (of `x`'s ranks), time terms,
    throughput, MFU (of `xt`'s ranks)."""
    mem_total = np.where(x.active, memory.total(), -np.inf)
    mem_index = np.argmax(mem_total, axis=0)

    def on_peak(a):
        return np.take_along_axis(np.broadcast_to(a, mem_total.shape), mem_index[None], 0)[0]

    peak = on_peak(mem_total)
    cap = cluster.gpu.hbm_bytes
    m, mb = x.microbatches, step.per_microbatch
    pace = step.at_pace(step.time_per_microbatch)
    gbs = x.table.global_batch_size.astype(float)
    s = x.seq_len
    flops = model_flops_per_step(model, gbs, s, x.tp)
    hw_extra = (np.max(recompute_flops, axis=0) * x.tp * x.cp * x.pp * x.dp * m) if len(x.table) else 0
    n_gpus = x.table.num_gpus.astype(float)
    peak_bf16 = cluster.gpu.bf16_tflops * 1e12
    out: dict[str, np.ndarray] = {
        "peak_memory_bytes": peak,
        "memory_capacity_bytes": np.full(len(x.table), cap),
        "memory_rank": np.take_along_axis(x.rank, mem_index[None], 0)[0],
        "step_time_s": step.step,
        "time_compute": m * step.at_pace(mb.compute),
        "time_tp": m * step.at_pace(mb.tp) + step.at_tail(step.tp_step),
        "time_tp_per_step": step.at_tail(step.tp_step),
        "time_cp": m * step.at_pace(mb.cp),
        "time_ep": m * step.at_pace(mb.ep),
        "time_pp": m * step.at_pace(mb.pp),
        "time_dp": step.at_tail(step.dp_exposed),
        "time_bubble": step.pipeline - m * pace,
        "time_optimizer": step.at_tail(step.optimizer),
        "time_offload": step.at_tail(step.offload),
        "time_act_offload": m * step.at_pace(mb.act_offload),
        "pace_rank": np.take_along_axis(xt.rank, step.pace_index[None], 0)[0],
        "tokens_per_s": gbs * s / step.step,
        "tokens_per_s_per_gpu": gbs * s / step.step / n_gpus,
        "model_tflops_per_gpu": flops / step.step / n_gpus / 1e12,
        "mfu": flops / step.step / n_gpus / peak_bf16,
        "hfu": (flops + hw_extra) / step.step / n_gpus / peak_bf16,
        "bubble_fraction": step.bubble_fraction,
        "num_microbatches": x.table.num_microbatches,
        "params_per_gpu": np.max(np.where(xt.active, params, 0.0), axis=0),
        "params_total": np.full(len(x.table), float(model.params_total)),
        "model_flops_per_step": flops,
        "stage_imbalance": x.stages.imbalance,
    }
    for name, arr in memory._asdict().items():
        out[f"mem_{name}"] = on_peak(arr)
    set_validity(out, rules.codes(), headroom_gib)
    return out


def set_validity(est: dict, codes: np.ndarray, headroom_gib: float = 0.0) -> None:
    """The one place that decides whether a plan fits: valid, fits, rejected_code and
    memory_miss_gib of estimate columns from the rows' rule bitmasks (autopar.spec.rules). A valid
    plan whose peak exceeds the GPU's memory less `headroom_gib` (a search space's
    memory_headroom_gib) gets the memory bit."""
    peak = est["peak_memory_bytes"]
    limit = est["memory_capacity_bytes"] - max(headroom_gib, 0.0) * GIB
    valid = codes == 0
    over = valid & (peak > limit)
    est["valid"] = valid
    est["fits"] = valid & ~over
    est["rejected_code"] = np.where(over, np.uint64(1 << MEMORY_BIT), codes)
    est["memory_miss_gib"] = np.where(over, (peak - limit) / GIB, 0.0)


def _per_rank_bytes(x: PlanArrays, comm: CommTerms) -> dict[str, np.ndarray | float]:
    """Payload bytes per step of each costed rank, per axis (0 when not counted)."""
    m = x.microbatches
    return {
        "tp": comm.tp.bytes * m + comm.tp_step.bytes,
        "cp": (comm.cp.bytes + comm.cp_grad.bytes) * m,
        "ep": comm.ep.bytes * m,
        "pp": comm.pp.bytes * m,
        "dp": comm.dp_reduce.bytes + comm.dp_gather.bytes,
    }


def comm_columns(x: PlanArrays, comm: CommTerms) -> dict[str, np.ndarray]:
    """comm_bytes_<axis>: the payload bytes per step of the plan's busiest costed rank, per axis."""
    shape = x.active.shape
    return {
        f"comm_bytes_{axis}": np.max(np.where(x.active, np.broadcast_to(arr, shape), 0.0), axis=0)
        for axis, arr in _per_rank_bytes(x, comm).items()
    }


def stage_columns(x: PlanArrays, memory: MemoryTerms, step: StepTerms, params, comm: CommTerms) -> dict:
    """Per costed rank ((C, n) arrays, ranks a plan does not have masked), for the per-stage
    breakdown and the tests."""
    a = x.active
    out = {
        "stage_rank": x.rank,
        "stage_active": a,
        "stage_memory_bytes": np.where(a, memory.total(), 0.0),
        "stage_time_per_mb": np.where(a, step.time_per_microbatch, 0.0),
        "stage_params": np.where(a, params, 0.0),
        "stage_layers": np.where(a, x.layers, 0.0),
    }
    for axis, arr in _per_rank_bytes(x, comm).items():
        out[f"stage_comm_bytes_{axis}"] = np.where(a, np.broadcast_to(arr, a.shape), 0.0)
    return out
