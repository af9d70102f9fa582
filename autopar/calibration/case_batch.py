"""Published runs priced together: each case's step inputs (autopar.cost.step.StepInputs: raw
compute and communication seconds at the published hardware rates, with its trainer's kernel facts)
are computed once, stacked into one batch, and the step assembled for all of them at once with
per-case constants. A fit of the constants (autopar.calibration.profile_fit) re-runs only the assembly:
a few array operations over every case, so leave-one-source-out refits take seconds."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from autopar.calibration.run_cases import RunCase
from autopar.cost.comm_terms import comm_terms
from autopar.cost.compute import RawCompute, raw_compute
from autopar.cost.goodput import run_time
from autopar.cost.price import prepare, with_recompute_modules
from autopar.cost.profiles import profile_of, profiles
from autopar.cost.step import StepInputs, assemble_step, step_inputs
from autopar.spec.hardware import ClusterSpec, CostConstants
from autopar.spec.table import PlanTable


def case_profile(case: RunCase) -> str:
    return case.profile or profile_of(case.plan.trainer).name


def case_cluster(case: RunCase, constants: CostConstants | None = None) -> ClusterSpec:
    """The case's cluster priced with its profile's constants (or the given ones), its memory
    stack, and the kernel facts its source documents."""
    return _priced_case_cluster(
        case.cluster, case_profile(case), constants, tuple(sorted(case.kernel_overrides.items()))
    )


def forget_profiles() -> None:
    """Drop the clusters priced with the profiles as they were read (after they are rewritten)."""
    _priced_case_cluster.cache_clear()


@lru_cache(maxsize=4096)
def _priced_case_cluster(
    cluster: ClusterSpec, profile: str, constants: CostConstants | None, overrides: tuple
) -> ClusterSpec:
    prof = profiles()[profile]
    cluster = replace(cluster, constants=constants or prof.constants, training_stack=prof.memory_stack)
    if overrides:
        cluster = replace(cluster, constants=replace(cluster.constants, **dict(overrides)))
    return cluster


def _group_key(case: RunCase) -> tuple:
    """What the cases priced in one vectorised pass share: model, priced cluster, sequence length,
    GPU count and routing (their plans may differ)."""
    return (case.model, case_cluster(case), case.seq_len, case.plan.num_gpus, case.routing_imbalance)


def prime_inputs(cases: list[RunCase]) -> None:
    """Every case's step inputs, the cases that share a model, a cluster and a question priced in
    one vectorised pass over their plans (a user's table of thousands of runs has few of those)."""
    groups: dict[tuple, list[RunCase]] = {}
    for c in cases:
        if c.inputs is None:
            groups.setdefault(_group_key(c), []).append(c)
    for (model, cluster, seq_len, num_gpus, imbalance), members in groups.items():
        plans = list(dict.fromkeys(c.plan for c in members))  # a plan repeated by several rows: priced once
        p = prepare(
            PlanTable.from_plans(plans),
            model,
            members[0].cluster,
            num_gpus=num_gpus,
            seq_len=seq_len,
            trainer_capabilities=False,
            time_ranks=True,
        )
        x, prm, act = p.timed
        x = replace(x, routing_imbalance=imbalance)
        raw = raw_compute(x, model, cluster, act.rank_layers)
        comm = comm_terms(x, model, cluster, prm, with_bytes=False)
        raw, comm = with_recompute_modules(x, model, cluster, prm, raw, comm)
        inp = step_inputs(x, model, cluster, prm, raw, comm)
        shape = np.shape(inp.active)

        def per_rank(a):
            return np.broadcast_to(np.asarray(a, dtype=float), shape)

        raw_all = RawCompute(*(per_rank(a) for a in inp.raw))
        ranked = {f: per_rank(getattr(inp, f)) for f in _PER_RANK}
        per_plan = []
        for j in range(len(plans)):
            col = slice(j, j + 1)
            per_plan.append(
                StepInputs(
                    raw=RawCompute(*(a[:, col].copy() for a in raw_all)),
                    **{
                        f: (ranked[f][:, col].copy() if f in ranked else _column(getattr(inp, f), col)) for f in _FIELDS
                    },
                )
            )
        index = {plan: j for j, plan in enumerate(plans)}
        for c in members:
            c.inputs = per_plan[index[c.plan]]


def _column(a, col: slice):
    a = np.asarray(a)
    return a[:, col].copy() if a.ndim == 2 else a[col].copy()


#: StepInputs' fields besides `raw`
_FIELDS = tuple(f for f in StepInputs._fields if f != "raw")


#: the (C, n) fields of StepInputs besides `raw` and `active`
_PER_RANK = (
    "tp",
    "cp",
    "cp_grad",
    "ep",
    "pp",
    "tp_step",
    "dp_reduce",
    "dp_gather",
    "dp_reduce_tail",
    "dp_gather_tail",
    "optimizer",
    "zero1_gather_launches",
    "zero1_reduce_launches",
    "offload",
    "act_copies",
    "forward_share",
    "tp_backward_share",
)


def _stack(parts: list, rows: int):
    """Per-case arrays ((C_i, 1) or (1,)) side by side, (C, 1) ones padded to `rows` ranks."""
    first = np.asarray(parts[0])
    if first.ndim == 2:
        out = np.zeros((rows, len(parts)), dtype=first.dtype)
        for i, a in enumerate(parts):
            a = np.asarray(a)
            out[: a.shape[0], i] = a[:, 0]
        return out
    return np.concatenate([np.atleast_1d(np.asarray(a)) for a in parts])


@dataclass
class CaseBatch:
    cases: list[RunCase]
    inputs: StepInputs
    profile_index: np.ndarray  # (n,) index into `profile_names`
    profile_names: list[str]
    tokens_per_step: np.ndarray
    gpus: np.ndarray
    goodput: np.ndarray  # the whole-run rows' goodput (autopar.cost.goodput), 1 for benchmark steps

    @classmethod
    def of(cls, cases: list[RunCase]) -> "CaseBatch":
        prime_inputs(cases)
        per = cast("list[StepInputs]", [c.inputs for c in cases])  # every one set by prime_inputs
        rows = max(np.asarray(p.active).shape[0] for p in per)
        raw = RawCompute(*(_stack([getattr(p.raw, f) for p in per], rows) for f in RawCompute._fields))
        stacked: dict[str, Any] = {
            f: raw if f == "raw" else _stack([getattr(p, f) for p in per], rows) for f in StepInputs._fields
        }
        names = list(profiles())
        return cls(
            cases=cases,
            inputs=StepInputs(**stacked),
            profile_index=np.array([names.index(case_profile(c)) for c in cases]),
            profile_names=names,
            tokens_per_step=np.array([c.plan.global_batch_size * c.seq_len for c in cases], dtype=float),
            gpus=np.array([c.plan.num_gpus for c in cases], dtype=float),
            goodput=np.array([_goodput(c) for c in cases]),
        )

    def step_time(self, table: np.ndarray) -> np.ndarray:
        """Step seconds of every case; `table` is (profiles, constants) in CostConstants' field order."""
        per_case = table[self.profile_index]
        k = SimpleNamespace(**{f.name: per_case[:, i] for i, f in enumerate(fields(CostConstants))})
        return assemble_step(self.inputs, k).step

    def predicted(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predicted value in each row's metric, relative error on throughput)."""
        step = self.step_time(table)
        tok_gpu = self.tokens_per_step / step / self.gpus * self.goodput
        pred = np.empty(len(self.cases))
        err = np.empty(len(self.cases))
        for i, c in enumerate(self.cases):
            pred[i], err[i] = _in_metric(c, float(step[i]), float(tok_gpu[i]))
        return pred, err


def _goodput(case: RunCase) -> float:
    """A whole run's average throughput is its steps' times the goodput left after checkpoints,
    rework and restarts at the cluster's interruption rate (autopar.cost.goodput)."""
    if not case.whole_run:
        return 1.0
    r = run_time(1.0, 1.0, case.plan.num_gpus, case.model.params_total, rel=case.cluster.reliability)
    return float(r.goodput)


def _in_metric(case: RunCase, step: float, tok_gpu: float) -> tuple[float, float]:
    if case.metric == "tokens/s/GPU":
        return tok_gpu, tok_gpu / case.published - 1
    if case.metric == "step time s":
        return step, case.published / step - 1
    if case.metric == "TFLOP/s/GPU":
        pred = tok_gpu * case.flops_per_token / 1e12
        return pred, pred / case.published - 1
    pred = tok_gpu * case.flops_per_token / (case.cluster.gpu.bf16_tflops * 1e12)  # MFU
    return pred, pred / case.published - 1


def constants_table(by_profile: dict[str, CostConstants]) -> np.ndarray:
    """(profiles, constants) array of the given profiles' constants (the shipped ones for the rest)."""
    names = list(profiles())
    return np.array(
        [[getattr(by_profile.get(n, profiles()[n].constants), f.name) for f in fields(CostConstants)] for n in names]
    )
