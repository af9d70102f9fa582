"""The estimate: memory, time and throughput of every plan in a PlanTable, in one vectorised pass,
with each figure's 80 % interval and support from the published runs (autopar.calibration.uncertainty).

`estimate_table` is the single source of truth; `estimate` (one plan) runs it on a one-row table.
Contract: pure and deterministic; never raises on an infeasible or invalid plan: it returns
`valid`/`fits` and the reasons.

It is a sum of named terms, each a function of its own module returning a named tuple of arrays:
memory (autopar.cost.memory_terms), compute (autopar.cost.compute), communication
(autopar.cost.comm_terms) and the step (autopar.cost.step). Memory is checked on the most loaded
costed rank, the step runs at the pace of the slowest stage. The plans are prepared and priced in
autopar.cost.price, the terms turned into columns in autopar.cost.columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar.calibration.uncertainty import interval_columns, interval_fields, support_text
from autopar.cost.columns import RANKING_COLUMNS, set_validity
from autopar.cost.price import prepare, price
from autopar.cost.profiles import priced_cluster
from autopar.figures import (
    AXES,
    BUBBLE_FRACTION,
    COMM_BYTES,
    COMM_BYTES_PER_GPU,
    ENERGY_KWH_PER_STEP,
    FITS,
    HFU,
    HOST_MEMORY_BYTES,
    HOST_MEMORY_BYTES_PER_GPU,
    HOST_MEMORY_BYTES_PER_NODE,
    LAYOUT_TEXT,
    MEM,
    MEMORY_BYTES,
    MEMORY_CAPACITY_BYTES,
    MEMORY_MISS_GIB,
    MEMORY_RANK,
    MEMORY_TERMS,
    MFU,
    MODEL_FLOPS_PER_STEP,
    MODEL_TFLOPS_PER_GPU,
    NUM_MICROBATCHES,
    PACE_RANK,
    PARAMS_PER_GPU,
    PARAMS_TOTAL,
    PEAK_MEMORY_BYTES,
    POWER_W_PER_GPU,
    STAGE_COMM_BYTES,
    STAGE_IMBALANCE,
    STAGE_LAYERS,
    STAGE_MEMORY_BYTES,
    STAGE_PARAMS,
    STAGE_TIME_PER_MB,
    STEP_TIME_S,
    SUPPORT_GAPS,
    TIME,
    TIME_S,
    TIME_TERMS,
    TIME_TP_PER_STEP,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    VALID,
)
from autopar.spec.fp8_recipes import fp8_defaults
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.rules import capability_codes, check_rules
from autopar.spec.stages import stage_profiles
from autopar.spec.table import TRAINER, PlanTable
from autopar.spec.trainers import ALL_TRAINERS, DEFAULT_TRAINER, get_trainer


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
    headroom_gib: float = 0.0,
    recipes: frozenset[str] = frozenset(),
) -> dict[str, np.ndarray]:
    """Every estimate column for every plan of the table, each plan priced with its trainer's
    performance profile (autopar.cost.profiles). `every_rank` costs every pipeline rank (for the
    per-stage breakdown); otherwise only the ranks that can differ (autopar.spec.stages), which
    gives the same peak and pace. `search` leaves out what a search of millions of plans does not
    need per plan: the per-rank columns and the text ones (`rejected_by`, `layout_text`; `rejected_code`
    and `layout_id` say the same). A plan fits with `headroom_gib` of its GPU's memory to spare (a
    search space's memory_headroom_gib). `recipes`: the trainers whose recipe the question names
    (autopar.spec.rules.Context)."""
    kw = dict(
        num_gpus=num_gpus,
        seq_len=seq_len,
        routing_imbalance=routing_imbalance,
        every_rank=every_rank,
        search=search,
        headroom_gib=headroom_gib,
        recipes=recipes,
    )
    groups = _profile_groups(table)
    if len(groups) == 1:
        out = _estimate_priced(table, model, priced_cluster(cluster, groups[0][0]), **kw)
    else:
        parts = [
            (rows, _estimate_priced(table.take(rows), model, priced_cluster(cluster, t), **kw)) for t, rows in groups
        ]
        out = _merge(parts, len(table))
    out.update(interval_columns(table, out, model, cluster, seq_len or model.seq_len))
    return out


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
    headroom_gib,
    recipes,
) -> dict[str, np.ndarray]:
    """The estimate of plans that share one priced cluster (one performance profile)."""
    return price(
        prepare(
            table,
            model,
            cluster,
            num_gpus=num_gpus,
            seq_len=seq_len,
            every_rank=every_rank,
            trainer_capabilities=True,
            recipes=recipes,
        ),
        cluster,
        routing_imbalance,
        search,
        headroom_gib,
    )


def estimate_per_trainer(
    table: PlanTable,
    model: ModelSpec,
    cluster: ClusterSpec,
    trainers: tuple[str, ...],
    *,
    num_gpus: int | None = None,
    seq_len: int | None = None,
    headroom_gib: float = 0.0,
    recipes: frozenset[str] = frozenset(),
    routing_imbalance: float = 1.0,
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
        recipes=recipes,
    )
    model_codes = rules.codes()
    codes = {t: model_codes | capability_codes(table.with_columns(trainer=TRAINER[t]), rules.context) for t in trainers}
    # the trainers priced alike: one profile, and the same meaning of a plan's "default" FP8 choices
    # (Megatron-Bridge's FP8 recipes gather FP8 parameters, Megatron-LM's default does not)
    by_profile: dict[tuple, list[str]] = {}
    for t in trainers:
        by_profile.setdefault((get_trainer(t).profile, fp8_defaults(t)), []).append(t)
    n = len(table)
    figures: dict[str, dict[str, np.ndarray]] = {t: {c: np.full(n, np.nan) for c in RANKING_COLUMNS} for t in trainers}
    for mine in by_profile.values():
        rows = np.flatnonzero(np.logical_or.reduce([codes[t] == 0 for t in mine]))
        if not len(rows):
            continue
        # the rows priced as the group's first trainer's: the group shares a profile, its stack and
        # its FP8 defaults
        for part in _by_pipeline_depth(np.asarray(table.pp)[rows]):
            sub = table.take(rows[part]).with_columns(trainer=TRAINER[mine[0]])
            p = prepare(sub, model, cluster, num_gpus=num_gpus, seq_len=s, trainer_capabilities=False, time_ranks=True)
            priced = price(p, priced_cluster(cluster, mine[0]), routing_imbalance, search=True)
            for t in mine:
                for c in RANKING_COLUMNS:
                    figures[t][c][rows[part]] = priced[c]
    out = []
    for t in trainers:
        est = figures[t]
        est[MEMORY_CAPACITY_BYTES] = np.full(n, cluster.gpu.hbm_bytes)
        set_validity(est, codes[t], headroom_gib)
        est.update(interval_columns(table, est, model, cluster, s, trainer=t))
        out.append(est)
    return out


#: pipeline depths priced apart: a plan's ranks are costed on a (ranks, plans) grid as deep as the
#: deepest plan's costed ranks (autopar.spec.stages), so shallow plans priced beside deep ones fill
#: most of it with copies of their few ranks; a band of fewer plans than `_MIN_BAND` is priced with
#: the next, where one more pricing pass would cost more than the grid saves
_DEPTH_EDGES = (1, 2, 4, 8)
_MIN_BAND = 4096


def _by_pipeline_depth(pp: np.ndarray) -> list[np.ndarray]:
    """Positions of the plans in each band of pipeline depth (1, 2, 3-4, 5-8, deeper), small bands
    joined to the next deeper one (the last to the one before), the empty left out."""
    band = np.searchsorted(np.asarray(_DEPTH_EDGES), pp, side="left")
    parts: list[np.ndarray] = []
    pending = np.zeros(0, dtype=np.int64)
    for b in range(len(_DEPTH_EDGES) + 1):
        pending = np.concatenate([pending, np.flatnonzero(band == b)])
        if len(pending) >= _MIN_BAND:
            parts.append(pending)
            pending = np.zeros(0, dtype=np.int64)
    if len(pending):
        if parts:
            parts[-1] = np.concatenate([parts[-1], pending])
        else:
            parts.append(pending)
    return parts


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
                FITS,
                VALID,
                "reasons",
                PEAK_MEMORY_BYTES,
                MEMORY_BYTES,
                STEP_TIME_S,
                TIME_S,
                COMM_BYTES_PER_GPU,
                TOKENS_PER_S,
                TOKENS_PER_S_PER_GPU,
                MODEL_TFLOPS_PER_GPU,
                MFU,
                HFU,
                BUBBLE_FRACTION,
                PARAMS_TOTAL,
                PARAMS_PER_GPU,
                MEMORY_CAPACITY_BYTES,
                "layout",
                NUM_MICROBATCHES,
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
    row = {k: v[0] for k, v in cols.items() if not k.startswith("stage_") or k == STAGE_IMBALANCE}
    reasons = plan.problems(model, num_gpus=num_gpus, cluster=cluster, seq_len=seq_len)
    if row[VALID] and not row[FITS]:
        reasons.append(
            f"needs {row[PEAK_MEMORY_BYTES] / GIB:.1f} GiB on pipeline rank {int(row[MEMORY_RANK])} "
            f"but the {cluster.gpu.key} has {row[MEMORY_CAPACITY_BYTES] / GIB:.1f} GiB "
            f"({row[MEMORY_MISS_GIB]:.1f} GiB short)"
        )
    extra = {
        k: (v.item() if hasattr(v, "item") else v)
        for k, v in row.items()
        if k in (MEMORY_RANK, PACE_RANK, STAGE_IMBALANCE, MODEL_FLOPS_PER_STEP, TIME_TP_PER_STEP)
    }
    if plan.optimizer_offload > 0 or plan.offload_modules:  # what is offloaded, per GPU and per node
        extra[HOST_MEMORY_BYTES_PER_GPU] = float(row[HOST_MEMORY_BYTES])
        extra[HOST_MEMORY_BYTES_PER_NODE] = float(row[HOST_MEMORY_BYTES]) * cluster.gpus_per_node
    power = cluster.operating_gpu.power_w
    if power is not None:  # the GPUs at their power limit (dense training holds them there), GPUs only
        extra[POWER_W_PER_GPU] = float(power)
        extra[ENERGY_KWH_PER_STEP] = float(row[STEP_TIME_S]) * plan.num_gpus * power / 3.6e6
    _, reason = support_text(int(row[SUPPORT_GAPS]), plan, model, cluster, seq_len or model.seq_len)
    extra.update(interval_fields(row, reason))
    extra["stages"] = [
        {
            "rank": r,
            "layers": int(cols[STAGE_LAYERS][r, 0]),
            MEMORY_BYTES: float(cols[STAGE_MEMORY_BYTES][r, 0]),
            "time_per_mb_s": float(cols[STAGE_TIME_PER_MB][r, 0]),
            "params": float(cols[STAGE_PARAMS][r, 0]),
            "comm_bytes": {a: float(cols[STAGE_COMM_BYTES[a]][r, 0]) for a in AXES},
        }
        for r in range(plan.pp)
    ]
    return Estimate(
        plan=plan,
        fits=bool(row[FITS]),
        valid=bool(row[VALID]),
        reasons=reasons,
        peak_memory_bytes=float(row[PEAK_MEMORY_BYTES]),
        memory_bytes={n: float(row[MEM[n]]) for n in MEMORY_TERMS},
        step_time_s=float(row[STEP_TIME_S]),
        time_s={n: float(row[TIME[n]]) for n in TIME_TERMS},
        comm_bytes_per_gpu={a: float(row[COMM_BYTES[a]]) for a in AXES},
        tokens_per_s=float(row[TOKENS_PER_S]),
        tokens_per_s_per_gpu=float(row[TOKENS_PER_S_PER_GPU]),
        model_tflops_per_gpu=float(row[MODEL_TFLOPS_PER_GPU]),
        mfu=float(row[MFU]),
        hfu=float(row[HFU]),
        bubble_fraction=float(row[BUBBLE_FRACTION]),
        params_total=float(row[PARAMS_TOTAL]),
        params_per_gpu=float(row[PARAMS_PER_GPU]),
        memory_capacity_bytes=float(row[MEMORY_CAPACITY_BYTES]),
        layout=str(row[LAYOUT_TEXT]),
        num_microbatches=int(row[NUM_MICROBATCHES]),
        extra=extra,
    )
