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

#: the Llama 3 paper (Dubey et al. 2024, sec. 3.3.4): 419 unexpected interruptions in a 54-day
#: snapshot of pre-training on 16,384 H100 GPUs
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
#: interruptions per GPU-hour of a large H100 cluster (the Llama 3 figures above)
DEFAULT_INTERRUPTIONS_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
#: checkpoint storage bandwidth per GPU, GB/s: Meta's Tectonic sustains 2 TB/s for the 16,384-GPU
#: Llama 3 cluster (Dubey et al. 2024, sec. 3.3.1), so each GPU's share of a write or read
DEFAULT_CHECKPOINT_GBPS_PER_GPU = 2000.0 / LLAMA3_GPUS
#: [assumed] seconds from an interruption to training again, before the checkpoint read: the
#: scheduler restarting the job and NCCL and the data loaders starting up on thousands of GPUs
#: (the Llama 3 paper gives no figure; ten minutes is the order its operators describe)
DEFAULT_RESTART_S = 600.0


@dataclass(frozen=True)
class Reliability:
    """How often a cluster's jobs are interrupted and how fast they checkpoint and restart (the
    `reliability:` mapping of a cluster file)."""

    interruptions_per_gpu_hour: float = DEFAULT_INTERRUPTIONS_PER_GPU_HOUR
    checkpoint_gbps_per_gpu: float = DEFAULT_CHECKPOINT_GBPS_PER_GPU
    restart_s: float = DEFAULT_RESTART_S


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

    @property
    def days(self) -> np.ndarray:
        return self.wall_s / 86_400.0


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
    return np.sqrt(2.0 * np.asarray(write_s, dtype=float) * np.asarray(mtbf_s, dtype=float))


def run_time(tokens: float, tokens_per_s, num_gpus, params_total, fp32=False, rel: Reliability = Reliability(),
             price_per_gpu_hour: float | None = None) -> RunTime:
    """Time to train `tokens` tokens at `tokens_per_s` on `num_gpus` GPUs, with checkpoints every
    Young/Daly interval and the cluster's interruptions (module docstring), its GPU-hours and cost."""
    tps = np.asarray(tokens_per_s, dtype=float)
    gpus = np.asarray(num_gpus, dtype=float)
    train = tokens / tps
    ckpt = checkpoint_bytes(params_total, fp32)
    write = ckpt / (rel.checkpoint_gbps_per_gpu * 1e9 * gpus)
    mtbf = 3600.0 / (rel.interruptions_per_gpu_hour * gpus) if rel.interruptions_per_gpu_hour > 0 else \
        np.full_like(gpus, math.inf)
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
    return RunTime(train_s=train, checkpoint_bytes=ckpt, write_s=write, mtbf_s=mtbf, interval_s=interval,
                   lost_to_checkpoints=ckpt_share, lost_to_rework=rework * (1 - ckpt_share),
                   lost_to_restarts=restarts * (1 - ckpt_share), goodput=good, wall_s=wall, gpu_hours=hours,
                   cost=None if price_per_gpu_hour is None else hours * price_per_gpu_hour)
