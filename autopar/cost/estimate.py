"""The estimate: memory, time and throughput of every plan in a PlanTable, in one vectorised pass.

`estimate_table` is the single source of truth; `estimate` (one plan) runs it on a one-row table.
Contract: pure and deterministic; never raises on an infeasible or invalid plan: it returns
`valid`/`fits` and the reasons.

It is a sum of named terms, each a function of its own module returning a named tuple of arrays:
memory (autopar.cost.memory_terms), compute (autopar.cost.compute), communication
(autopar.cost.comm_terms) and the step (autopar.cost.step). Memory is checked on the most loaded
costed rank, the step runs at the pace of the slowest stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from autopar.cost.comm_terms import CommTerms, comm_terms
from autopar.cost.compute import compute_terms
from autopar.cost.flops import model_flops_per_step
from autopar.cost.memory_terms import LayerActivations, MemoryTerms, layer_activations, memory_terms
from autopar.cost.params import RankParams, rank_params
from autopar.cost.plan_arrays import PlanArrays, plan_arrays
from autopar.cost.profiles import priced_cluster
from autopar.cost.step import StepTerms, step_terms
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.rules import RuleResult, capability_codes, check_rules
from autopar.spec.stages import costed_and_run_starts, stage_profiles
from autopar.spec.table import TRAINER, PlanTable
from autopar.spec.trainers import ALL_TRAINERS, DEFAULT_TRAINER, get_trainer

AXES = ("tp", "cp", "ep", "pp", "dp")
#: the bit of `rejected_code` for "valid, but does not fit in memory" (rule bits count from 0)
MEMORY_BIT = 63
TIME_TERMS = ("compute", "tp", "cp", "ep", "pp", "dp", "bubble", "optimizer")
MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "other")
#: how the terms read in the terminal, the report and the why line (communication terms are what
#: overlap leaves exposed)
TIME_LABELS = {
    "compute": "compute",
    "tp": "TP comm (exposed)",
    "cp": "CP comm (exposed)",
    "ep": "EP all-to-all (exposed)",
    "pp": "PP send/recv (exposed)",
    "dp": "DP comm (exposed)",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
}
MEMORY_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "other": "other (runtime, buffers)",
}


def estimate_table(
    table: PlanTable,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    num_gpus: int | None = None,
    seq_len: int | None = None,
    routing_imbalance: float = 1.0,
    every_rank: bool = False,
    search: bool = False,
) -> dict[str, np.ndarray]:
    """Every estimate column for every plan of the table, each plan priced with its trainer's
    performance profile (autopar.cost.profiles). `every_rank` costs every pipeline rank (for the
    per-stage breakdown); otherwise only the ranks that can differ (autopar.spec.stages), which
    gives the same peak and pace. `search` leaves out what a search of millions of plans does not
    need per plan: the per-rank columns and the text ones (`rejected_by`, `layout`; `rejected_code`
    and `layout_id` say the same)."""
    kw = dict(
        num_gpus=num_gpus, seq_len=seq_len, routing_imbalance=routing_imbalance, every_rank=every_rank, search=search
    )
    groups = _profile_groups(table)
    if len(groups) == 1:
        return _estimate_priced(table, model, priced_cluster(cluster, groups[0][0]), **kw)
    parts = [(rows, _estimate_priced(table.take(rows), model, priced_cluster(cluster, t), **kw)) for t, rows in groups]
    return _merge(parts, len(table))


def _profile_groups(table: PlanTable) -> list[tuple[str, np.ndarray]]:
    """(a trainer, the rows priced with its profile) for each profile the table's trainers use."""
    codes = np.unique(table.trainer) if len(table) else np.array([TRAINER[DEFAULT_TRAINER]])
    by_profile: dict[str, list[int]] = {}
    for c in codes:
        by_profile.setdefault(get_trainer(ALL_TRAINERS[c]).profile, []).append(int(c))
    if len(by_profile) == 1:
        return [(ALL_TRAINERS[codes[0]], np.arange(len(table)))]
    return [(ALL_TRAINERS[cs[0]], np.flatnonzero(np.isin(table.trainer, cs))) for cs in by_profile.values()]


def _merge(parts: list[tuple[np.ndarray, dict]], n: int) -> dict[str, np.ndarray]:
    """Estimate columns of row subsets back into one table's columns ((C, n) ones padded)."""
    out: dict[str, np.ndarray] = {}
    for key in parts[0][1]:
        arrays = [(rows, np.asarray(cols[key])) for rows, cols in parts]
        first = arrays[0][1]
        shape = (n,) if first.ndim == 1 else (max(a.shape[0] for _, a in arrays), n)
        merged = np.zeros(shape, dtype=first.dtype if first.dtype != object else object)
        for rows, a in arrays:
            merged[..., rows] = a if a.ndim == 1 else np.pad(a, ((0, shape[0] - a.shape[0]), (0, 0)), mode="edge")
        out[key] = merged
    return out


def _estimate_priced(
    table: PlanTable,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    num_gpus,
    seq_len,
    routing_imbalance,
    every_rank,
    search,
) -> dict[str, np.ndarray]:
    """The estimate of plans that share one priced cluster (one performance profile)."""
    return price(
        prepare(
            table, model, cluster, num_gpus=num_gpus, seq_len=seq_len, every_rank=every_rank, trainer_capabilities=True
        ),
        cluster,
        routing_imbalance,
        search,
    )


@dataclass(frozen=True)
class Prepared:
    """What an estimate needs that no cost constant changes: the plans' shapes, pipeline ranks,
    rules, parameters and activation bytes. `price` turns it into the estimate for given constants
    (a fit prices the same prepared plans many times)."""

    x: PlanArrays
    model: ModelSpec
    rules: RuleResult
    params: RankParams
    layer_act: LayerActivations
    #: the same on the ranks that decide the time (`time_ranks`), or None: time on `x`'s ranks
    x_time: PlanArrays | None = None
    params_time: RankParams | None = None
    layer_act_time: LayerActivations | None = None

    @property
    def timed(self) -> tuple[PlanArrays, RankParams, LayerActivations]:
        if self.x_time is None:
            return self.x, self.params, self.layer_act
        return self.x_time, self.params_time, self.layer_act_time


def prepare(
    table: PlanTable,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    num_gpus: int | None = None,
    seq_len: int | None = None,
    every_rank: bool = False,
    trainer_capabilities: bool = True,
    time_ranks: bool = False,
) -> Prepared:
    """`time_ranks` prices the time on the first rank of each run of equal ranks only (fewer than
    the memory needs; autopar.spec.stages), which gives the same step time: for a search, whose
    per-rank columns are not kept."""
    s = seq_len or model.seq_len
    timed = None
    if time_ranks and not every_rank:
        stages, timed = costed_and_run_starts(table, model)
    else:
        stages = stage_profiles(table, model, every_rank=every_rank)
    rules = check_rules(
        table,
        model,
        num_gpus=num_gpus,
        cluster=cluster,
        seq_len=s,
        stages=stages,
        trainer_capabilities=trainer_capabilities,
    )
    x, prm, act_bytes = _on_ranks(table, model, s, stages)
    if timed is None:
        return Prepared(x, model, rules, prm, act_bytes)
    return Prepared(x, model, rules, prm, act_bytes, *_on_ranks(table, model, s, timed))


def _on_ranks(table: PlanTable, model: ModelSpec, seq_len: int, stages) -> tuple:
    x = plan_arrays(table, model, seq_len, stages)
    prm = rank_params(model, x.dense_layers, x.moe_layers, x.has_embedding, x.has_head, x.tp, x.pp, x.ep, x.etp)
    return x, prm, layer_activations(x, model)


def price(
    p: Prepared, cluster: ClusterSpec, routing_imbalance: float = 1.0, search: bool = False
) -> dict[str, np.ndarray]:
    """The estimate columns of prepared plans on a priced cluster (its constants are the profile's)."""
    with np.errstate(divide="ignore", invalid="ignore"):  # invalid plans (e.g. FP8 on A100) are marked, not warned
        x, model = replace(p.x, routing_imbalance=routing_imbalance), p.model
        xt, prm_t, act_t = p.timed
        xt = replace(xt, routing_imbalance=routing_imbalance)
        memory = memory_terms(x, model, cluster, p.params, p.layer_act)
        compute = compute_terms(xt, model, cluster, act_t.rank_layers)
        comm = comm_terms(xt, model, cluster, prm_t, with_bytes=not search)
        step = step_terms(xt, cluster, prm_t, compute, comm)
        if search:
            return _ranking_columns(x, model, cluster, p.rules, memory, step)
        out = _columns(x, xt, model, cluster, p.rules, memory, step, compute.recompute_flops, prm_t.total)
        out.update(_comm_columns(xt, comm))
        out["rejected_by"] = np.where(out["valid"], np.where(out["fits"], "", "memory"), p.rules.short_reasons())
        out["layout"] = x.stages.layout_text
        out.update(_stage_columns(x, memory, step, p.params.total, comm))
        return out


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


def _ranking_columns(
    x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, rules: RuleResult, memory: MemoryTerms, step: StepTerms
) -> dict[str, np.ndarray]:
    """RANKING_COLUMNS only, equal to `_columns`' (the search re-prices the plans it keeps in full)."""
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
    set_validity(out, rules.codes())
    return out


def _columns(
    x: PlanArrays,
    xt: PlanArrays,
    model: ModelSpec,
    cluster: ClusterSpec,
    rules: RuleResult,
    memory: MemoryTerms,
    step: StepTerms,
    recompute_flops,
    params,
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
    set_validity(out, rules.codes())
    return out


def set_validity(est: dict, codes: np.ndarray) -> None:
    """valid, fits, rejected_code and memory_miss_gib of estimate columns from the rows' rule
    bitmasks (autopar.spec.rules): a valid plan whose peak exceeds the GPU's memory gets the memory bit."""
    peak, cap = est["peak_memory_bytes"], est["memory_capacity_bytes"]
    valid = codes == 0
    over = valid & (peak > cap)
    est["valid"] = valid
    est["fits"] = valid & ~over
    est["rejected_code"] = np.where(over, np.uint64(1 << MEMORY_BIT), codes)
    est["memory_miss_gib"] = np.where(over, (peak - cap) / GIB, 0.0)


def estimate_per_trainer(
    table: PlanTable,
    model: ModelSpec,
    cluster: ClusterSpec,
    trainers: tuple[str, ...],
    *,
    num_gpus: int | None = None,
    seq_len: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """The search's RANKING_COLUMNS of the table's plans once per trainer (the table's own trainer
    column is ignored). The rules are checked first, each trainer's capability table on top of the
    model's; then each performance profile prices, once, the plans that at least one of its
    trainers can run (trainers that share a profile share the prices). A plan none of them can run
    gets no figures (NaN): it is rejected whatever they are. Otherwise equal to
    `estimate_table(..., search=True)` of the table with that trainer."""
    s = seq_len or model.seq_len
    rules = check_rules(
        table,
        model,
        num_gpus=num_gpus,
        cluster=cluster,
        seq_len=s,
        stages=stage_profiles(table, model, ranks=False),
        trainer_capabilities=False,
    )
    model_codes = rules.codes()
    codes = {t: model_codes | capability_codes(table.with_columns(trainer=TRAINER[t]), rules.context) for t in trainers}
    by_profile: dict[str, list[str]] = {}
    for t in trainers:
        by_profile.setdefault(get_trainer(t).profile, []).append(t)
    n = len(table)
    figures = {t: {c: np.full(n, np.nan) for c in RANKING_COLUMNS} for t in trainers}
    for profile, mine in by_profile.items():
        rows = np.flatnonzero(np.logical_or.reduce([codes[t] == 0 for t in mine]))
        if not len(rows):
            continue
        sub = table.take(rows)
        p = prepare(sub, model, cluster, num_gpus=num_gpus, seq_len=s, trainer_capabilities=False, time_ranks=True)
        priced = price(p, priced_cluster(cluster, mine[0]), search=True)
        for t in mine:
            for c in RANKING_COLUMNS:
                figures[t][c][rows] = priced[c]
    out = []
    for t in trainers:
        est = figures[t]
        est["memory_capacity_bytes"] = np.full(n, cluster.gpu.hbm_bytes)
        set_validity(est, codes[t])
        out.append(est)
    return out


def _per_rank_bytes(x: PlanArrays, comm: CommTerms) -> dict[str, np.ndarray]:
    """Payload bytes per step of each costed rank, per axis."""
    m = x.microbatches
    return {
        "tp": comm.tp.bytes * m + comm.tp_step.bytes,
        "cp": comm.cp.bytes * m,
        "ep": comm.ep.bytes * m,
        "pp": comm.pp.bytes * m,
        "dp": comm.dp_reduce.bytes + comm.dp_gather.bytes,
    }


def _comm_columns(x: PlanArrays, comm: CommTerms) -> dict[str, np.ndarray]:
    shape = x.active.shape
    return {
        f"comm_bytes_{axis}": np.max(np.where(x.active, np.broadcast_to(arr, shape), 0.0), axis=0)
        for axis, arr in _per_rank_bytes(x, comm).items()
    }


def _stage_columns(x: PlanArrays, memory: MemoryTerms, step: StepTerms, params, comm: CommTerms) -> dict:
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


@dataclass
class Estimate:
    """One plan's estimate (the `--json` schema of `autopar estimate`)."""

    plan: ParallelPlan
    fits: bool
    valid: bool
    reasons: list[str]
    peak_memory_bytes: float
    memory_bytes: dict[str, float]
    step_time_s: float
    time_s: dict[str, float]
    comm_bytes_per_gpu: dict[str, float]
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    params_total: float
    params_per_gpu: float
    memory_capacity_bytes: float
    layout: str
    num_microbatches: int
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {
            k: getattr(self, k)
            for k in (
                "fits",
                "valid",
                "reasons",
                "peak_memory_bytes",
                "memory_bytes",
                "step_time_s",
                "time_s",
                "comm_bytes_per_gpu",
                "tokens_per_s",
                "tokens_per_s_per_gpu",
                "model_tflops_per_gpu",
                "mfu",
                "hfu",
                "bubble_fraction",
                "params_total",
                "params_per_gpu",
                "memory_capacity_bytes",
                "layout",
                "num_microbatches",
            )
        }
        out["plan"] = self.plan.to_dict()
        out.update(self.extra)
        return out


def estimate(
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    num_gpus: int | None = None,
    seq_len: int | None = None,
    routing_imbalance: float = 1.0,
) -> Estimate:
    """One plan: `estimate_table` on a table of one row."""
    table = PlanTable.from_plans([plan])
    cols = estimate_table(
        table, model, cluster, num_gpus=num_gpus, seq_len=seq_len, routing_imbalance=routing_imbalance, every_rank=True
    )
    row = {k: v[0] for k, v in cols.items() if not k.startswith("stage_") or k == "stage_imbalance"}
    reasons = plan.problems(model, num_gpus=num_gpus, cluster=cluster, seq_len=seq_len)
    if row["valid"] and not row["fits"]:
        reasons.append(
            f"needs {row['peak_memory_bytes'] / GIB:.1f} GiB on pipeline rank {int(row['memory_rank'])} "
            f"but the {cluster.gpu.key} has {row['memory_capacity_bytes'] / GIB:.1f} GiB "
            f"({row['memory_miss_gib']:.1f} GiB short)"
        )
    extra = {
        k: (v.item() if hasattr(v, "item") else v)
        for k, v in row.items()
        if k in ("memory_rank", "pace_rank", "stage_imbalance", "model_flops_per_step", "time_tp_per_step")
    }
    extra["stages"] = [
        {
            "rank": r,
            "layers": int(cols["stage_layers"][r, 0]),
            "memory_bytes": float(cols["stage_memory_bytes"][r, 0]),
            "time_per_mb_s": float(cols["stage_time_per_mb"][r, 0]),
            "params": float(cols["stage_params"][r, 0]),
            "comm_bytes": {a: float(cols[f"stage_comm_bytes_{a}"][r, 0]) for a in AXES},
        }
        for r in range(plan.pp)
    ]
    return Estimate(
        plan=plan,
        fits=bool(row["fits"]),
        valid=bool(row["valid"]),
        reasons=reasons,
        peak_memory_bytes=float(row["peak_memory_bytes"]),
        memory_bytes={n: float(row[f"mem_{n}"]) for n in MEMORY_TERMS},
        step_time_s=float(row["step_time_s"]),
        time_s={n: float(row[f"time_{n}"]) for n in TIME_TERMS},
        comm_bytes_per_gpu={a: float(row[f"comm_bytes_{a}"]) for a in AXES},
        tokens_per_s=float(row["tokens_per_s"]),
        tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
        model_tflops_per_gpu=float(row["model_tflops_per_gpu"]),
        mfu=float(row["mfu"]),
        hfu=float(row["hfu"]),
        bubble_fraction=float(row["bubble_fraction"]),
        params_total=float(row["params_total"]),
        params_per_gpu=float(row["params_per_gpu"]),
        memory_capacity_bytes=float(row["memory_capacity_bytes"]),
        layout=str(row["layout"]),
        num_microbatches=int(row["num_microbatches"]),
        extra=extra,
    )
