"""Published memory figures of the calibration runs against the estimate of the same quantity, and
whether every published run is predicted to fit.

What each source's figure measures (parsed from the row's `notes`, or its `peak_memory_gib`):
- nanotron (rows 248-263, "memory X GB per GPU"): torch.cuda.max_memory_reserved of global rank 0
  (the first pipeline stage), in MiB / 1024: nanotron logs "Peak reserved: ...MiB" from rank 0
  (nanotron/logging.py `log_memory`), and the figure's two decimals are that value in GiB;
- BLOOM (rows 265-273, "max memory NNGB (first/last stage nodes)"): what nvidia-smi showed on the
  nodes of the first and last pipeline stages, i.e. reserved + CUDA context + NCCL, the larger of
  the two stages, GiB;
- Korthikanti et al. 2022 (rows 20-27, "params+opt X GiB; activations Y GiB (no SP/recompute) vs
  Z GiB (SP+selective)", Figure 1): analytic per-GPU terms of the first stage: the transformer
  layers' weights, gradients and optimizer state (18 bytes per parameter), and the activations
  the layers keep for the microbatches in flight, for the row's layout without sequence
  parallelism or recompute (Y) and with both (Z);
- a `peak_memory_gib` cell: torchtitan's sources log torch.cuda.max_memory_reserved of rank 0;
  any other source's is taken as the device total of the most loaded rank (assumed).

The predictions run the estimate's memory path (autopar.cost.price.prepare on every rank, then
autopar.cost.memory_terms.memory_breakdown) on the plan and program the source ran
(autopar.calibration.memory_facts); nothing is stored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from autopar.calibration.case_batch import case_cluster
from autopar.calibration.memory_facts import memory_plan, offloading_twins, row_memory_facts, with_twin_offloading
from autopar.calibration.run_cases import RunCase
from autopar.calibration.run_rows import load_runs
from autopar.cost.gpu_memory import in_flight, plan_shape
from autopar.cost.memory_stacks import STACKS
from autopar.cost.memory_terms import memory_breakdown
from autopar.cost.params import rank_params
from autopar.cost.price import prepare
from autopar.cost.stack_activations import stack_layers
from autopar.spec.hardware import GIB
from autopar.spec.table import PlanTable


@dataclass(frozen=True)
class PublishedMemory:
    quantity: str  # "reserved" | "device" | "layer states" | "layer activations"
    gib: float
    ranks: str  # "rank 0" | "first/last stage" | "most loaded rank"
    variant: str = ""  # "no SP, no recompute": the figure is of the row's layout without them


@dataclass(frozen=True)
class MemoryComparison:
    row_id: str
    source: str
    figure: PublishedMemory
    predicted_gib: float
    notes: tuple[str, ...] = ()

    @property
    def error(self) -> float:
        return self.predicted_gib / self.figure.gib - 1.0


@dataclass(frozen=True)
class FitCheck:
    row_id: str
    source: str
    required_gib: float  # allocated peak + CUDA context + NCCL on the most loaded rank
    capacity_gib: float
    assumed: str = ""  # the unstated option it was checked with (UNSTATED_OPTIONS), if any

    @property
    def fits(self) -> bool:
        return self.required_gib <= self.capacity_gib


@dataclass
class PublishedMemoryResult:
    comparisons: list[MemoryComparison]
    fit_checks: list[FitCheck] = field(default_factory=list)

    def mape(self, keep=lambda c: True) -> float:
        errors = [abs(c.error) for c in self.comparisons if keep(c)]
        return float(np.mean(errors)) if errors else math.nan

    def by_source(self) -> dict[str, dict]:
        out: dict[str, list[float]] = {}
        for c in self.comparisons:
            out.setdefault(c.source, []).append(abs(c.error))
        return {
            s: {"figures": len(e), "mape": float(np.mean(e)), "max_abs_error": float(max(e))} for s, e in out.items()
        }

    @property
    def not_fitting(self) -> list[FitCheck]:
        return [f for f in self.fit_checks if not f.fits]


#: a source -> (memory stack, words): an option its program offered that the rows do not state and
#: that decides whether a run fits. A published run ran, so its fit check takes the option where
#: the program's default would not fit, and says so: torchtitan's 2024 Llama configs picked the
#: norm kernel by `norm_type`, eager "rmsnorm" or the Triton "fused_rmsnorm"
#: (autopar.cost.memory_stacks TORCHTITAN_FUSED_NORM)
UNSTATED_OPTIONS = {
    "torchtitan-2024": ("torchtitan-fused-norm", "norm_type fused_rmsnorm (torchtitan 2024; the row does not state it)")
}

_KORTHIKANTI = re.compile(
    r"params\+opt ([\d.]+) GiB; activations ([\d.]+) GiB \((?:no SP/recompute|none)\) vs ([\d.]+) GiB \(SP\+selective\)"
)


def published_memory(row: dict, source: str) -> list[PublishedMemory]:
    """The memory figures a calibration row publishes (module docstring), GiB."""
    notes = row.get("notes", "") or ""
    if source == "nanotron" and (m := re.search(r"memory ([\d.]+) GB per GPU", notes)):
        return [PublishedMemory("reserved", float(m.group(1)), "rank 0")]
    if source == "bloom" and (m := re.search(r"max memory (\d+(?:\.\d+)?) ?GB \(first/last stage", notes)):
        return [PublishedMemory("device", float(m.group(1)), "first/last stage")]
    if source == "korthikanti-2022" and (m := _KORTHIKANTI.search(notes)):
        states, plain, sp_selective = (float(g) for g in m.groups())
        selective = (row.get("recompute", "") or "").startswith("selective")
        figures = [PublishedMemory("layer states", states, "rank 0")]
        if selective:
            figures.append(PublishedMemory("layer activations", sp_selective, "rank 0"))
        else:
            figures.append(PublishedMemory("layer activations", plain, "rank 0", "no SP, no recompute"))
        return figures
    peak = str(row.get("peak_memory_gib", "") or "").strip()
    if peak and source.startswith("torchtitan"):
        # torchtitan logs torch.cuda.max_memory_reserved of the logging rank, rank 0
        # (torchtitan components/metrics.py DeviceMemoryMonitor, LOG_RANK=0 in run_train.sh)
        return [PublishedMemory("reserved", float(peak), "rank 0")]
    if peak:
        return [PublishedMemory("device", float(peak), "most loaded rank")]
    return []


def _priced_memory(case: RunCase, row: dict, plan, model, stack: str | None = None):
    facts = row_memory_facts(row, case.source)
    if stack is not None:
        facts = replace(facts, stack=stack)
    return *_breakdown(plan, model, case.cluster, case_cluster(case), case.seq_len, facts), facts


@lru_cache(maxsize=1024)  # a prepared plan and its breakdown per entry: tens of KiB each
def _breakdown(plan, model, cluster, priced, seq_len: int, facts):
    """(prepared plan, memory breakdown) of every pipeline rank: one pricing per distinct run, however
    many rows of a table repeat it."""
    p = prepare(
        PlanTable.from_plans([plan]),
        model,
        cluster,
        num_gpus=plan.num_gpus,
        seq_len=seq_len,
        every_rank=True,
        trainer_capabilities=False,
    )
    return p, memory_breakdown(p.x, model, priced, p.params, facts)


def _required_gib(plan, model, cluster, priced, seq_len: int, facts) -> float:
    """The most loaded rank's required memory (GiB)."""
    p, b = _breakdown(plan, model, cluster, priced, seq_len, facts)
    return float(np.max(np.where(p.x.active, b.required, -np.inf))) / GIB


def _predict(figure: PublishedMemory, case: RunCase, row: dict) -> tuple[float, tuple[str, ...]]:
    plan, model, notes = memory_plan(case, row)
    if figure.variant:
        plan = plan.with_(
            recompute="none",
            recompute_layers=None,
            recompute_modules=None,
            sequence_parallel=False,
            tp_comm_overlap=False,
        )
    p, b, facts = _priced_memory(case, row, plan, model)
    notes = tuple(notes) + facts.notes
    active = p.x.active[:, 0]
    pp = int(plan.pp)
    if figure.quantity == "reserved":
        return float(b.reserved[0, 0]) / GIB, notes
    if figure.quantity == "device" and figure.ranks == "first/last stage":
        return float(max(b.device[0, 0], b.device[pp - 1, 0])) / GIB, notes
    if figure.quantity == "device":
        return float(np.max(np.where(active, b.device[:, 0], -np.inf))) / GIB, notes
    x = p.x
    if figure.quantity == "layer states":
        # the layers' share of rank 0's weights, gradients and optimizer (bytes per parameter are
        # uniform on a dense model without the distributed optimizer, as the paper's 18)
        embedding = p.params.total[0, 0] - _layer_params(p)
        states = b.weights[0, 0] + b.gradients[0, 0] + b.optimizer[0, 0]
        return float(states * (1 - embedding / p.params.total[0, 0])) / GIB, notes
    # layer activations: what rank 0's layers keep for the microbatches in flight
    stack = STACKS[facts.stack]
    layers = stack_layers(stack, model, plan_shape(x, model, case_cluster(case)))
    per_mb = (x.dense_layers * layers.dense + x.moe_layers * layers.moe)[0, 0]
    return float(in_flight(x, stack)[0, 0] * per_mb) / GIB, notes


def _layer_params(p) -> float:
    """Rank 0's transformer-layer parameters (its parameters without the embedding and head)."""
    x = p.x
    zero = 0.0 * x.has_embedding
    prm = rank_params(p.model, x.dense_layers, x.moe_layers, zero, zero, x.tp, x.pp, x.ep, x.etp)
    return float(prm.total[0, 0])


def compare_published_memory(cases: list[RunCase], rows: list[dict] | None = None) -> PublishedMemoryResult:
    """Every published memory figure of the rows (default: the bundled tables) against its
    prediction, and the fit check of every case (dropless sub-cases repeat their row's layout and
    are skipped)."""
    rows = load_runs(None) if rows is None else rows
    by_id = {str(r.get("row_id")): r for r in rows}
    comparisons, fits = [], []
    twins = offloading_twins(rows)
    for case in cases:
        row = by_id.get(case.row_id)
        if row is None or case.dropless:
            continue
        row = with_twin_offloading(row, twins)
        for figure in published_memory(row, case.source):
            predicted, notes = _predict(figure, case, row)
            comparisons.append(MemoryComparison(case.row_id, case.source, figure, predicted, notes))
        fits.append(_fit_check(case, row))
    return PublishedMemoryResult(comparisons, fits)


def _fit_check(case: RunCase, row: dict) -> FitCheck:
    """The most loaded rank's required memory against the GPU's, with the source's unstated option
    where the program's default would not fit (UNSTATED_OPTIONS)."""
    plan, model, _ = memory_plan(case, row)
    capacity = case.cluster.gpu.hbm_bytes / GIB

    def required(stack: str | None) -> float:
        facts = row_memory_facts(row, case.source)
        facts = replace(facts, stack=stack or facts.stack)
        return _required_gib(plan, model, case.cluster, case_cluster(case), case.seq_len, facts)

    need = required(None)
    option = UNSTATED_OPTIONS.get(case.source)
    if need > capacity and option is not None and (lighter := required(option[0])) < need:
        return FitCheck(case.row_id, case.source, lighter, capacity, option[1])
    return FitCheck(case.row_id, case.source, need, capacity)
