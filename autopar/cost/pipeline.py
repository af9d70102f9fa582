"""Pipeline schedules: bubble fraction and microbatches in flight per rank (vectorised)."""

from __future__ import annotations

import numpy as np

from autopar.spec.table import SCHED


def bubble_fraction(schedule: np.ndarray, p: np.ndarray, m: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Fraction of the step the pipeline idles.
    GPipe / 1F1B: (p-1)/(m+p-1) (GPipe, Huang et al. 2019, sec. 2.2).
    Interleaved 1F1B: the same divided by v (Narayanan et al. 2021, sec. 2.2.2).
    Zero-bubble: ZB-H1, a third of 1F1B's bubble at 1F1B's memory (Qi et al. 2024, §3: the
    backward's weight-gradient pass fills the bubble when T_F = T_B = T_W)."""
    p = np.asarray(p, dtype=float)
    m = np.asarray(m, dtype=float)
    base = (p - 1) / (m + p - 1)
    divisor = np.where(schedule == SCHED["interleaved-1f1b"], v, np.where(schedule == SCHED["zero-bubble"], 3.0, 1.0))
    return base / divisor


def microbatches_in_flight(
    schedule: np.ndarray, p: np.ndarray, rank: np.ndarray, m: np.ndarray, v: np.ndarray
) -> np.ndarray:
    """Microbatches whose activations pipeline rank `rank` holds at its peak, in units of the
    rank's whole set of layers.
    GPipe: all m (GPipe, Huang et al. 2019: every microbatch's forward runs before any backward).
    1F1B and ZB-H1: min(p - rank, m) (PipeDream-flush warm-up; Megatron A.2 uses p for rank 0).
    Interleaved: rank r warms up 2(p-r-1) + (v-1)p + 1 model chunks of 1/v of its layers, capped
    at m*v (Megatron schedules.py get_num_warmup_microbatches); for rank 0 this is
    p * (1 + (p-1)/(p*v)), the interleaved penalty of theoretical_memory_usage.py."""
    p, rank, m, v = (np.asarray(x, dtype=float) for x in (p, rank, m, v))
    one_f_one_b = np.minimum(p - rank, m)
    interleaved = np.minimum(2 * (p - rank - 1) + (v - 1) * p + 1, m * v) / v
    return np.where(
        schedule == SCHED["gpipe"], m, np.where(schedule == SCHED["interleaved-1f1b"], interleaved, one_f_one_b)
    )


def steady_fraction(schedule, p, m, v) -> np.ndarray:
    """Share of a rank's microbatch chunks that run in the 1F1B steady state, a forward beside a
    backward (what Megatron-Core's 1F1B all-to-all overlap pairs: overlap_moe_expert_parallel_comm):
    the first rank's warm-up forwards (p - 1, or 2(p - 1) + (v - 1)p interleaved: Megatron
    schedules.py get_num_warmup_microbatches) and as many cool-down backwards have no partner;
    without a pipeline, only the first microbatch's forward."""
    p, m, v = (np.asarray(a, dtype=float) for a in (p, m, v))
    warmup = np.where(schedule == SCHED["interleaved-1f1b"], 2 * (p - 1) + (v - 1) * p, p - 1)
    warmup = np.where(p > 1, warmup, 1.0)
    chunks = m * np.where(schedule == SCHED["interleaved-1f1b"], v, 1.0)
    return np.clip(1.0 - warmup / chunks, 0.0, 1.0)
