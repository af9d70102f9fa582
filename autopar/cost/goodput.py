"""From the step to the whole run: time to train, GPU-hours, cost, and the goodput left after
checkpoints and failures (vectorised over plans).

A run of `tokens` tokens takes tokens / (tokens/s) seconds of training. At scale the job also
stops to write checkpoints and loses work to interruptions: with a checkpoint written every T
seconds of training, taking delta to write, and interruptions arriving every M seconds of wall time
on average (the job's mean time between failures), each interruption costs the restart R, the
checkpoint read and, on average, half a checkpoint period of work done again. To first order (Daly
2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", eq. 1-3):

    goodput = T / (T + delta) x (1 - ((T + delta) / 2 + R + read) / M)

maximised near Young's interval T = sqrt(2 delta M) (Young 1974, "A first order approximation to
the optimum checkpoint interval"). The effective time to train is the training time / goodput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.cost.memory import precision_bytes
from autopar.figures import (
    CHECKPOINT_GIB,
    CHECKPOINT_INTERVAL_MIN,
    COST,
    DAYS,
    ENERGY_MWH,
    GOODPUT,
    GPU_HOURS,
    LOST_TO_CHECKPOINTS,
    LOST_TO_RESTARTS,
    LOST_TO_REWORK,
    MEETS_DEADLINE,
    TRAIN_DAYS,
    WITHIN_BUDGET,
)
from autopar.spec.hardware import GIB
from autopar.spec.training_run import Reliability


@dataclass(frozen=True)
class RunTime:
    """Time, GPU-hours and cost of training `tokens` tokens with plans, and their goodput terms
    ((n,) arrays, or floats for one plan). Fractions are of the wall time."""

    train_s: np.ndarray  # tokens / throughput: the run without checkpoints or failures
    checkpoint_bytes: np.ndarray  # one checkpoint of the whole job (every rank's shard)
    write_s: np.ndarray  # one checkpoint written (= read) at the storage's bandwidth
    mtbf_s: np.ndarray  # mean time between interruptions of the job (all its GPUs)
    interval_s: np.ndarray  # training between checkpoints (Young / Daly)
    lost_to_checkpoints: np.ndarray
    lost_to_rework: np.ndarray  # work done again after an interruption
    lost_to_restarts: np.ndarray  # restart and checkpoint read
    goodput: np.ndarray
    wall_s: np.ndarray  # train_s / goodput
    gpu_hours: np.ndarray
    cost: np.ndarray | None  # gpu_hours x the price per GPU-hour, when one is given
    #: the GPUs' energy (MWh): gpu_hours x their power draw, when it is known (GPUs only: not the
    #: hosts, the network or the cooling)
    energy_mwh: np.ndarray | None = None

    @property
    def days(self) -> np.ndarray:
        return self.wall_s / 86_400.0

    def to_dict(self) -> dict:
        """One plan's figures as plain floats (estimate --json, the report); a figure that is
        infinite by the cluster's inputs is null, and `why_null` says why."""
        out: dict = {k: float(v) for k, v in vars(self).items() if v is not None}
        out |= {DAYS: out["wall_s"] / 86_400.0, TRAIN_DAYS: out["train_s"] / 86_400.0}
        return with_null_reasons(out)


#: why a figure of RunTime.to_dict is null
NEVER_INTERRUPTED = (
    "reliability: interruptions_per_gpu_hour is 0 (or too small for a finite MTBF): the job is never "
    "interrupted, so no mean time between failures and no checkpoint interval"
)
NEVER_FINISHES = "the run never finishes: its goodput is 0 (checkpoints, rework and restarts take all the time)"
NOT_PRICED = "not priced: give --price-per-gpu-hour"
#: the figures that are infinite when the job is never interrupted
_INTERRUPTION_FIGURES = ("mtbf_s", "interval_s", CHECKPOINT_INTERVAL_MIN)


def with_null_reasons(figures: dict) -> dict:
    """A run's figures (RunTime.to_dict, a plan's run columns) with each number that is not finite
    as None, and `why_null` saying why (JSON has no infinity: autopar.json_out)."""
    bad = [k for k, v in figures.items() if isinstance(v, float) and not math.isfinite(v)]
    never = any(k in _INTERRUPTION_FIGURES for k in bad)
    why = {
        k: NOT_PRICED
        if k == COST and math.isnan(figures[k])
        else NEVER_INTERRUPTED
        if never and k in _INTERRUPTION_FIGURES
        else NEVER_FINISHES
        for k in bad
    }
    return figures | {k: None for k in why} | ({"why_null": why} if why else {})


def _duration(s: float) -> str:
    """31.6 s, 14.1 min, 2.5 h, 7.0 days."""
    for unit, div in ((DAYS.unit, 86_400.0), ("h", 3600.0), ("min", 60.0)):
        if s >= 3 * div:
            return f"{s / div:,.1f} {unit}"
    return f"{s:,.3g} s"


def finish_problem(rel: Reliability, num_gpus: int, params_total: float, fp32: bool = False) -> str | None:
    """Why no plan of `num_gpus` GPUs can ever finish on a cluster of this reliability (its goodput
    is 0 whatever the plan's speed: the module docstring's formula), or None. The checkpoint write
    and the MTBF both scale as 1 / GPUs, so the plan's layout does not matter, only its size."""
    r = run_time(1.0, 1.0, num_gpus, params_total, fp32=fp32, rel=rel)
    if float(r.goodput) > 0:
        return None
    write, mtbf = float(r.write_s), float(r.mtbf_s)
    where = f"the cluster's MTBF {_duration(mtbf)} (on {num_gpus:,} GPUs)"
    if write >= mtbf:
        why = f"{where} is shorter than one checkpoint write, {_duration(write)}"
    elif rel.restart_s + write >= mtbf:
        why = (
            f"{where} is shorter than a restart ({_duration(rel.restart_s)}) and a checkpoint read ({_duration(write)})"
        )
    else:
        lost = float(r.interval_s + write) / 2 + rel.restart_s + write
        why = f"{where} is shorter than what each interruption costs: {_duration(lost)} of restart, read and rework"
    return (
        f"{why}: training can never finish; fix the cluster file's reliability (fewer "
        f"interruptions_per_gpu_hour, more checkpoint_gbps_per_gpu, a shorter restart_s) or use fewer GPUs"
    )


def checkpoint_bytes(params_total, fp32) -> np.ndarray:
    """Bytes of one checkpoint: each parameter's weight and optimizer state once, whatever the
    sharding (torch.distributed.checkpoint and Megatron's distributed checkpoints write every shard
    once): 2 + 12 bytes in mixed precision (bf16 weights, fp32 master and Adam m, v), 4 + 8 in fp32
    (autopar.cost.memory.precision_bytes)."""
    weight, optimizer = precision_bytes(np.asarray(fp32))
    return np.asarray(params_total, dtype=float) * (weight + optimizer)


def young_daly_interval(write_s, mtbf_s) -> np.ndarray:
    """The checkpoint interval that maximises the goodput to first order: sqrt(2 delta M) (Young
    1974; Daly 2006 eq. 3 for delta << M)."""
    # as sqrt(2 delta) x sqrt(M): the product overflows for an MTBF near the largest float
    return np.sqrt(2.0 * np.asarray(write_s, dtype=float)) * np.sqrt(np.asarray(mtbf_s, dtype=float))


def run_time(
    tokens: float,
    tokens_per_s,
    num_gpus,
    params_total,
    fp32=False,
    rel: Reliability = Reliability(),
    price_per_gpu_hour: float | None = None,
    power_w: float | None = None,
) -> RunTime:
    """Time to train `tokens` tokens at `tokens_per_s` on `num_gpus` GPUs, with checkpoints every
    Young/Daly interval and the cluster's interruptions (module docstring), its GPU-hours, cost and,
    where the GPUs' power draw `power_w` is known, energy."""
    tps = np.asarray(tokens_per_s, dtype=float)
    gpus = np.asarray(num_gpus, dtype=float)
    train = tokens / tps
    ckpt = checkpoint_bytes(params_total, fp32)
    write = ckpt / (rel.checkpoint_gbps_per_gpu * 1e9 * gpus)
    with np.errstate(over="ignore", divide="ignore"):  # a rate so small the MTBF overflows: never interrupted
        mtbf = (
            3600.0 / (rel.interruptions_per_gpu_hour * gpus)
            if rel.interruptions_per_gpu_hour > 0
            else np.full_like(gpus, math.inf)
        )
        interval = young_daly_interval(write, mtbf)
    period = interval + write
    with np.errstate(divide="ignore", invalid="ignore"):
        ckpt_share = np.where(np.isfinite(mtbf), write / period, 0.0)
        rework = np.where(np.isfinite(mtbf), period / 2.0 / mtbf, 0.0)
        restarts = np.where(np.isfinite(mtbf), (rel.restart_s + write) / mtbf, 0.0)
    good = (1.0 - ckpt_share) * np.maximum(1.0 - rework - restarts, 0.0)
    with np.errstate(divide="ignore"):
        wall = train / good
    hours = wall / 3600.0 * gpus
    return RunTime(
        train_s=train,
        checkpoint_bytes=ckpt,
        write_s=write,
        mtbf_s=mtbf,
        interval_s=interval,
        lost_to_checkpoints=ckpt_share,
        lost_to_rework=rework * (1 - ckpt_share),
        lost_to_restarts=restarts * (1 - ckpt_share),
        goodput=good,
        wall_s=wall,
        gpu_hours=hours,
        cost=None if price_per_gpu_hour is None else hours * price_per_gpu_hour,
        energy_mwh=None if power_w is None else hours * power_w / 1e6,
    )


#: the run figures of a plan (run_time_columns), in the order tables show them
RUN_COLUMNS = (
    DAYS,
    TRAIN_DAYS,
    GOODPUT,
    GPU_HOURS,
    COST,
    CHECKPOINT_GIB,
    CHECKPOINT_INTERVAL_MIN,
    LOST_TO_CHECKPOINTS,
    LOST_TO_REWORK,
    LOST_TO_RESTARTS,
    ENERGY_MWH,
)


def run_time_columns(
    tokens_per_s,
    dtype,
    num_gpus: int,
    params_total: float,
    tokens: float,
    rel: Reliability,
    price_per_gpu_hour: float | None,
    deadline_s: float | None = None,
    budget: float | None = None,
    power_w: float | None = None,
) -> dict[str, np.ndarray]:
    """run_time over plans as named columns (days, GPU-hours, cost, goodput and its terms), with
    `meets_deadline` and `within_budget` when a deadline or budget is given."""
    fp32 = np.asarray(dtype, dtype=object) == "fp32"
    r = run_time(
        tokens,
        tokens_per_s,
        num_gpus,
        params_total,
        fp32=fp32,
        rel=rel,
        price_per_gpu_hour=price_per_gpu_hour,
        power_w=power_w,
    )
    n = len(fp32)
    cols: dict[str, np.ndarray] = {
        DAYS: r.days,
        TRAIN_DAYS: r.train_s / 86_400.0,
        GOODPUT: r.goodput,
        GPU_HOURS: r.gpu_hours,
        COST: r.cost if r.cost is not None else np.full(n, np.nan),
        CHECKPOINT_GIB: r.checkpoint_bytes / GIB,
        CHECKPOINT_INTERVAL_MIN: r.interval_s / 60.0,
        LOST_TO_CHECKPOINTS: r.lost_to_checkpoints,
        LOST_TO_REWORK: r.lost_to_rework,
        LOST_TO_RESTARTS: r.lost_to_restarts,
        ENERGY_MWH: r.energy_mwh if r.energy_mwh is not None else np.full(n, np.nan),
    }
    cols = {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy() for k, v in cols.items()}
    if deadline_s is not None:
        cols[MEETS_DEADLINE] = cols[DAYS] * 86_400.0 <= deadline_s
    if budget is not None and r.cost is not None:
        cols[WITHIN_BUDGET] = cols[COST] <= budget
    return cols
