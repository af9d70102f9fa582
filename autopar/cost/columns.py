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
from autopar.figures import (
    BUBBLE_FRACTION,
    COMM_BYTES,
    FITS,
    HFU,
    MEM,
    MEMORY_CAPACITY_BYTES,
    MEMORY_MISS_GIB,
    MEMORY_RANK,
    MFU,
    MODEL_FLOPS_PER_STEP,
    MODEL_TFLOPS_PER_GPU,
    NUM_MICROBATCHES,
    PACE_RANK,
    PARAMS_PER_GPU,
    PARAMS_TOTAL,
    PEAK_MEMORY_BYTES,
    REJECTED_CODE,
    STAGE_ACTIVE,
    STAGE_COMM_BYTES,
    STAGE_IMBALANCE,
    STAGE_LAYERS,
    STAGE_MEMORY_BYTES,
    STAGE_PARAMS,
    STAGE_RANK,
    STAGE_TIME_PER_MB,
    STEP_TIME_S,
    TIME,
    TIME_TP_PER_STEP,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    VALID,
)
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.rules import RuleResult

#: the bit of `rejected_code` for "valid, but does not fit in memory" (rule bits count from 0)
MEMORY_BIT = 63

#: what a search ranks and filters every plan by (autopar.search.streaming; plans.parquet)
RANKING_COLUMNS = (
    VALID,
    FITS,
    REJECTED_CODE,
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    MFU,
    PEAK_MEMORY_BYTES,
    MEMORY_CAPACITY_BYTES,
    MEMORY_MISS_GIB,
    BUBBLE_FRACTION,
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
    out: dict[str, np.ndarray] = {
        PEAK_MEMORY_BYTES: np.max(np.where(x.active, memory.total(), -np.inf), axis=0),
        MEMORY_CAPACITY_BYTES: np.full(len(x.table), cluster.gpu.hbm_bytes),
        STEP_TIME_S: step.step,
        TOKENS_PER_S: gbs * x.seq_len / step.step,
        TOKENS_PER_S_PER_GPU: gbs * x.seq_len / step.step / n_gpus,
        MFU: flops / step.step / n_gpus / (cluster.gpu.bf16_tflops * 1e12),
        BUBBLE_FRACTION: step.bubble_fraction,
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
        PEAK_MEMORY_BYTES: peak,
        MEMORY_CAPACITY_BYTES: np.full(len(x.table), cap),
        MEMORY_RANK: np.take_along_axis(x.rank, mem_index[None], 0)[0],
        STEP_TIME_S: step.step,
        TIME["compute"]: m * step.at_pace(mb.compute),
        TIME["tp"]: m * step.at_pace(mb.tp) + step.at_tail(step.tp_step),
        TIME_TP_PER_STEP: step.at_tail(step.tp_step),
        TIME["cp"]: m * step.at_pace(mb.cp),
        TIME["ep"]: m * step.at_pace(mb.ep),
        TIME["pp"]: m * step.at_pace(mb.pp),
        TIME["dp"]: step.at_tail(step.dp_exposed),
        TIME["bubble"]: step.pipeline - m * pace,
        TIME["optimizer"]: step.at_tail(step.optimizer),
        TIME["offload"]: step.at_tail(step.offload),
        TIME["act_offload"]: m * step.at_pace(mb.act_offload),
        PACE_RANK: np.take_along_axis(xt.rank, step.pace_index[None], 0)[0],
        TOKENS_PER_S: gbs * s / step.step,
        TOKENS_PER_S_PER_GPU: gbs * s / step.step / n_gpus,
        MODEL_TFLOPS_PER_GPU: flops / step.step / n_gpus / 1e12,
        MFU: flops / step.step / n_gpus / peak_bf16,
        HFU: (flops + hw_extra) / step.step / n_gpus / peak_bf16,
        BUBBLE_FRACTION: step.bubble_fraction,
        NUM_MICROBATCHES: x.table.num_microbatches,
        PARAMS_PER_GPU: np.max(np.where(xt.active, params, 0.0), axis=0),
        PARAMS_TOTAL: np.full(len(x.table), float(model.params_total)),
        MODEL_FLOPS_PER_STEP: flops,
        STAGE_IMBALANCE: x.stages.imbalance,
    }
    for name, arr in memory._asdict().items():
        out[MEM[name]] = on_peak(arr)
    set_validity(out, rules.codes(), headroom_gib)
    return out


def set_validity(est: dict, codes: np.ndarray, headroom_gib: float = 0.0) -> None:
    """The one place that decides whether a plan fits: valid, fits, rejected_code and
    memory_miss_gib of estimate columns from the rows' rule bitmasks (autopar.spec.rules). A valid
    plan whose peak exceeds the GPU's memory less `headroom_gib` (a search space's
    memory_headroom_gib) gets the memory bit."""
    peak = est[PEAK_MEMORY_BYTES]
    limit = est[MEMORY_CAPACITY_BYTES] - max(headroom_gib, 0.0) * GIB
    valid = codes == 0
    over = valid & (peak > limit)
    est[VALID] = valid
    est[FITS] = valid & ~over
    est[REJECTED_CODE] = np.where(over, np.uint64(1 << MEMORY_BIT), codes)
    est[MEMORY_MISS_GIB] = np.where(over, (peak - limit) / GIB, 0.0)


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
        COMM_BYTES[axis]: np.max(np.where(x.active, np.broadcast_to(arr, shape), 0.0), axis=0)
        for axis, arr in _per_rank_bytes(x, comm).items()
    }


def stage_columns(x: PlanArrays, memory: MemoryTerms, step: StepTerms, params, comm: CommTerms) -> dict:
    """Per costed rank ((C, n) arrays, ranks a plan does not have masked), for the per-stage
    breakdown and the tests."""
    a = x.active
    out = {
        STAGE_RANK: x.rank,
        STAGE_ACTIVE: a,
        STAGE_MEMORY_BYTES: np.where(a, memory.total(), 0.0),
        STAGE_TIME_PER_MB: np.where(a, step.time_per_microbatch, 0.0),
        STAGE_PARAMS: np.where(a, params, 0.0),
        STAGE_LAYERS: np.where(a, x.layers, 0.0),
    }
    for axis, arr in _per_rank_bytes(x, comm).items():
        out[STAGE_COMM_BYTES[axis]] = np.where(a, np.broadcast_to(arr, a.shape), 0.0)
    return out
