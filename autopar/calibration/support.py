"""Where the cost model has been checked: the published runs as calibration points (their regime,
their layout, their held-out residual), how far the runs of one profile go (Reach), and the support
gaps of a plan against them, in bits and in words, with the nearest published run. The intervals
built on them are autopar.calibration.uncertainty's."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from autopar.cost.collectives import place
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import DTYPES

#: gaps counted in the widening: beyond three the plan is far from anything measured anyway
MAX_GAPS = 3


#: sequence length from which a run counts as long-context (the validation's categories)
LONG_CONTEXT = 32768


#: what a plan may do beyond every published run of its profile, one bit each
GAP_NAMES = (
    "profile",
    "workload",
    "long_context",
    "dtype",
    "generation",
    "tp",
    "pp",
    "cp",
    "ep",
    "ep_cross_node",
    "sharded_dp",
    "gpus",
)


GAP_BIT = {name: 1 << i for i, name in enumerate(GAP_NAMES)}


@dataclass(frozen=True)
class CalibrationPoint:
    """One published run as the support of the cost model: its regime, its layout and its held-out
    residual ln(published / predicted)."""

    row_id: str
    source: str
    profile: str
    workload: str  # "dense" | "moe"
    long_context: bool
    dtype: str
    generation: str
    gpu: str
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    zero_stage: int
    num_gpus: int
    ep_cross_node: bool
    residual: float
    params: float = 0.0  # the model's parameters
    categories: tuple[str, ...] = ()  # the validation's categories it counts in
    layout: str = ""
    model: str = ""
    #: the knobs a pair of runs of one source can differ in beyond the sizes above
    #: (autopar.calibration.margin.PAIR_KNOBS)
    vpp: int = 1
    micro_batch_size: int = 1
    recompute: str = ""
    seq_len: int = 0

    def regime(self, level: Sequence[str]) -> tuple:
        return tuple(getattr(self, f) for f in level)

    def to_dict(self) -> dict:
        return asdict(self)


def calibration_point(case, error: float) -> CalibrationPoint:
    """A published run (autopar.calibration.run_cases.RunCase) and its held-out relative error on
    throughput, as a calibration point."""
    p, g = case.plan, case.cluster
    ep_nodes = int(place(p.ep, p.etp, g.gpus_per_node).nodes) if case.model.moe else 1
    return CalibrationPoint(
        row_id=case.row_id,
        source=case.source,
        profile=case.profile,
        workload=case.workload,
        long_context=case.seq_len >= LONG_CONTEXT,
        dtype=p.dtype,
        generation=g.gpu.generation,
        gpu=g.gpu.key,
        tp=p.tp,
        pp=p.pp,
        cp=p.cp,
        ep=p.ep,
        dp=p.dp,
        zero_stage=p.zero_stage,
        num_gpus=p.num_gpus,
        ep_cross_node=ep_nodes > 1,
        residual=-math.log1p(error),
        params=float(case.model.params_total),
        categories=tuple(case.categories()),
        layout=p.describe(),
        model=case.name,
        vpp=p.vpp,
        micro_batch_size=p.micro_batch_size,
        recompute=_recompute_text(p),
        seq_len=case.seq_len,
    )


def _recompute_text(plan) -> str:
    """What a plan recomputes, as one comparable string ("none", "selective:core_attn",
    "full:8")."""
    if plan.recompute == "full":
        return f"full:{plan.recompute_layers or 0}"
    if plan.recompute == "selective":
        return "selective:" + "+".join(plan.recompute_modules or ())
    return str(plan.recompute)


@dataclass(frozen=True)
class Reach:
    """How far the published runs of one profile go (the support a plan is checked against)."""

    profile: str
    runs: int
    workloads: frozenset  # (workload, long_context) pairs
    dtypes: frozenset
    generations: frozenset
    tp: int
    pp: int
    cp: int
    ep: int
    ep_cross_node: bool
    sharded_dp: int  # largest dp with sharded states (ZeRO-3 / FSDP); 0: none
    gpus: int

    @classmethod
    def of(cls, profile: str, points: Sequence[CalibrationPoint]) -> "Reach":
        mine = [p for p in points if p.profile == profile]
        moe = [p for p in mine if p.workload == "moe"]
        sharded = [p.dp for p in mine if p.zero_stage >= 3]
        return cls(
            profile=profile,
            runs=len(mine),
            workloads=frozenset((p.workload, p.long_context) for p in mine),
            dtypes=frozenset(p.dtype for p in mine),
            generations=frozenset(p.generation for p in mine),
            tp=max((p.tp for p in mine), default=0),
            pp=max((p.pp for p in mine), default=0),
            cp=max((p.cp for p in mine), default=0),
            ep=max((p.ep for p in moe), default=0),
            ep_cross_node=any(p.ep_cross_node for p in moe),
            sharded_dp=max(sharded, default=0),
            gpus=max((p.num_gpus for p in mine), default=0),
        )


@lru_cache(maxsize=256)  # a search asks for each trainer's reach once per chunk of plans
def reach_of(profile: str, support) -> Reach:
    """Reach.of the points of a (hashable) autopar.calibration.uncertainty.Support."""
    return Reach.of(profile, support.points)


def support_gaps(
    columns: dict, model: ModelSpec, cluster: ClusterSpec, seq_len: int, reach: Reach, dtype: np.ndarray, rows
) -> np.ndarray:
    """Per plan of a table's `columns` picked by `rows` (indices, or slice(None) for all), the
    bitmask of GAP_NAMES it has against `reach` (0: calibrated); `dtype`: the plans' DTYPES codes."""

    def col(name):
        return np.asarray(columns[name])[rows]

    tp, pp, cp, dp = col("tp"), col("pp"), col("cp"), col("dp")
    ep = col("ep") if model.moe else None  # only MoE plans have expert-parallel gaps
    crosses = place(ep, col("etp"), cluster.gpus_per_node).nodes > 1 if ep is not None else None
    return layout_gaps(
        reach,
        "moe" if model.moe else "dense",
        seq_len >= LONG_CONTEXT,
        cluster.gpu.generation,
        np.asarray(dtype)[rows],
        tp,
        pp,
        cp,
        ep,
        crosses,
        col("zero_stage"),
        dp,
        tp * pp * cp * dp,  # PlanTable.num_gpus
    )


def layout_gaps(reach: Reach, workload, long_context, generation, dtype, tp, pp, cp, ep, ep_cross, zero, dp, gpus):
    """The gap bitmask of layouts (arrays) of one workload, context and GPU generation; `dtype`:
    DTYPES codes."""
    n = len(tp)
    gaps = np.zeros(n, dtype=np.int64)
    if reach.runs == 0:
        return gaps | GAP_BIT["profile"]
    if (workload, long_context) not in reach.workloads:
        kind = "long_context" if long_context and any(w == workload for w, _ in reach.workloads) else "workload"
        gaps |= GAP_BIT[kind]
    measured = np.array([d in reach.dtypes for d in DTYPES])
    gaps |= np.where(measured[np.asarray(dtype, dtype=np.int64)], 0, GAP_BIT["dtype"])
    if not generation or generation not in reach.generations:
        gaps |= GAP_BIT["generation"]
    for name, size in (("tp", tp), ("pp", pp), ("cp", cp)):
        gaps |= np.where(np.asarray(size) > getattr(reach, name), GAP_BIT[name], 0)
    if workload == "moe":
        gaps |= np.where(np.asarray(ep) > reach.ep, GAP_BIT["ep"], 0)
        if not reach.ep_cross_node:
            gaps |= np.where(ep_cross, GAP_BIT["ep_cross_node"], 0)
    sharded = np.asarray(zero) >= 3
    gaps |= np.where(sharded & (np.asarray(dp) > reach.sharded_dp), GAP_BIT["sharded_dp"], 0)
    gaps |= np.where(np.asarray(gpus) > reach.gpus, GAP_BIT["gpus"], 0)
    return gaps


def gap_count(gaps: np.ndarray) -> np.ndarray:
    """Support gaps per plan (bits set), at most MAX_GAPS."""
    g = np.asarray(gaps, dtype=np.int64)
    count = np.zeros(g.shape, dtype=np.int64)
    for bit in GAP_BIT.values():
        count += (g & bit) > 0
    return np.minimum(count, MAX_GAPS)


def gap_words(name: str, plan, model, cluster, seq_len: int, reach: Reach) -> str:
    who = reach.profile
    if name == "profile":
        return f"no published run on {who}'s profile"
    if name == "workload":
        return f"no {'MoE' if model.moe else 'dense'} run on {who}"
    if name == "long_context":
        return f"no run at {seq_len // 1024}K context on {who}"
    if name == "dtype":
        return f"no {plan.dtype} run on {who}"
    if name == "generation":
        if not cluster.gpu.generation:  # a GPU file that does not state its architecture
            return f"no {who} run on this GPU (its generation is not stated)"
        return f"no {who} run on a {cluster.gpu.generation} GPU"
    if name in ("tp", "pp", "cp", "ep"):
        return f"no {who} run with {name} beyond {getattr(reach, name)}"
    if name == "ep_cross_node":
        return f"no {who} run with EP across nodes"
    if name == "sharded_dp":
        what = "ZeRO-3" if who != "torchtitan" else "FSDP"
        limit = f"beyond dp {reach.sharded_dp}" if reach.sharded_dp else "at all"
        return f"no {who} run with {what} {limit}"
    if name == "gpus":
        return f"no {who} run beyond {reach.gpus} GPUs"
    raise KeyError(name)


def nearest_point(
    plan, model, cluster, points: Sequence[CalibrationPoint], profile: str, seq_len: int | None = None
) -> CalibrationPoint | None:
    """The published run of the profile (else of any) closest to the plan at `seq_len` (default the
    model's): the same workload, context, precision and generation first, then the nearest sizes in
    log2."""
    pool = [p for p in points if p.profile == profile] or list(points)
    if not pool:
        return None
    workload = "moe" if model.moe else "dense"
    long_context = (model.seq_len if seq_len is None else seq_len) >= LONG_CONTEXT

    family = model_family(model.name)

    def distance(p: CalibrationPoint) -> float:
        d = 4.0 * (p.workload != workload) + 2.0 * (p.long_context != long_context)
        d += 2.0 * (p.dtype != plan.dtype) + 1.0 * (p.generation != cluster.gpu.generation)
        d += 1.0 * (model_family(p.model) != family)
        d += 1.0 * ((p.zero_stage >= 3) != (plan.zero_stage >= 3))
        for a, b in ((p.tp, plan.tp), (p.pp, plan.pp), (p.cp, plan.cp), (p.ep, plan.ep), (p.dp, plan.dp)):
            d += 0.25 * abs(math.log2(a) - math.log2(b))
        if p.params > 0:
            d += 0.5 * abs(math.log2(p.params / model.params_total))
        return d

    return min(pool, key=lambda p: (distance(p), p.row_id))


#: model families by the start of a name (letters only), longest first where one prefixes another:
#: the nearest published run is of the plan's family where one is as close (its conventions: GQA,
#: SwiGLU and RoPE in Llama against GPT-3's MHA and GELU; Qwen's and DeepSeek's routers)
MODEL_FAMILIES = ("gptoss", "llama", "qwen", "deepseek", "mixtral", "mistral", "nemotron", "gpt", "mpt", "bloom")


def model_family(name: str) -> str:
    """The family of a model or published run's name ("llama3-70b", "LLAMA3_70B" and "Llama 3.1
    405B" are llama; "GPT-style 70B" gpt; "GPT OSS 120B" gptoss); else its letters."""
    key = re.sub(r"[^a-z]", "", name.lower())
    return next((f for f in MODEL_FAMILIES if key.startswith(f)), key)


def point_differences(p: CalibrationPoint, plan, cluster) -> list[str]:
    """What a plan does differently from a published run, in words ("tp 4 (the run: 8)", "on
    b200 (the run: h100-sxm)"): its parallel sizes, GPU count, GPU and precision."""
    out = [
        f"{name} {mine} (the run: {theirs})"
        for name, mine, theirs in (
            ("tp", plan.tp, p.tp),
            ("pp", plan.pp, p.pp),
            ("cp", plan.cp, p.cp),
            ("ep", plan.ep, p.ep),
            ("dp", plan.dp, p.dp),
        )
        if mine != theirs
    ]
    if plan.num_gpus != p.num_gpus:
        out.append(f"{plan.num_gpus} GPUs (the run: {p.num_gpus})")
    if cluster.gpu.key != p.gpu:
        out.append(f"on {cluster.gpu.key} (the run: {p.gpu})")
    if plan.dtype != p.dtype:
        out.append(f"{plan.dtype} (the run: {p.dtype})")
    return out


def point_gaps(p: CalibrationPoint, points: Sequence[CalibrationPoint]) -> int:
    """Support gaps of a published run against other points (as counted in the widening)."""
    one = (
        np.array([v])
        for v in (DTYPES.index(p.dtype), p.tp, p.pp, p.cp, p.ep, p.ep_cross_node, p.zero_stage, p.dp, p.num_gpus)
    )
    reach = Reach.of(p.profile, points)
    return int(gap_count(layout_gaps(reach, p.workload, p.long_context, p.generation, *one))[0])
