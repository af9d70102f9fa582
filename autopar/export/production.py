"""Production settings of the exports: the checkpoint interval the goodput model assumes, converted
to steps (every Megatron-LM-style export: Megatron-LM, Megatron-DeepSpeed), and the environment the
Megatron-Core trainers (Megatron-LM, NeMo 2, Megatron-Bridge) document for a run like the plan.

- Checkpoint interval: autopar.cost.goodput prices a checkpoint every Young/Daly interval
  sqrt(2 delta M) of training (delta: one write at the cluster's storage bandwidth, M: the job's
  mean time between interruptions, both from the cluster's `reliability`); the exports save every
  round(interval / predicted step time) steps, so the run checkpoints as often as it was priced.
- CUDA_DEVICE_MAX_CONNECTIONS: Megatron-Bridge's PerfEnvPlugin rule
  (megatron/bridge/recipes/run_plugins.py `_set_num_cuda_device_max_connections`, Megatron-Bridge
  0.3.1): on Hopper and older, 1 when TP or CP communicate and the EP all-to-all is not overlapped
  (so a communication kernel is queued before the GEMM it overlaps); on Blackwell, 32 when TP or CP
  meet DP or PP; 32 with the DeepEP dispatcher; else CUDA's default (8), i.e. unset. Megatron-FSDP
  plans leave it unset, as the Megatron-FSDP guide says (Megatron-LM docs, megatron_fsdp user guide:
  its parameter all-gathers and gradient reduce-scatters run on their own streams beside compute).
- NVTE_FWD/BWD_LAYERNORM_SM_MARGIN=16 (Transformer Engine keeps SMs free for the DP overlap) and
  TORCH_NCCL_HIGH_PRIORITY=1: NeMo 2.7.3's PerfEnvPlugin defaults (nemo/lightning/run/plugins.py,
  enable_layernorm_sm_margin=True, layernorm_sm_margin=16; high-priority NCCL streams always).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.export.base import Context
from autopar.export.header import ep_overlap

#: NeMo PerfEnvPlugin.layernorm_sm_margin (nemo/lightning/run/plugins.py, NeMo 2.7.3)
LAYERNORM_SM_MARGIN = 16
#: CUDA's default number of hardware work queues (CUDA C programming guide, CUDA_DEVICE_MAX_CONNECTIONS)
CUDA_DEFAULT_CONNECTIONS = 8


@dataclass(frozen=True)
class CheckpointInterval:
    """The goodput model's checkpoint interval, in seconds of training and in steps."""

    seconds: float  # Young/Daly sqrt(2 delta M); inf when the cluster is never interrupted
    steps: int | None  # round(seconds / step time), at least 1; None when `seconds` is infinite


def checkpoint_interval(ctx: Context) -> CheckpointInterval:
    """autopar.cost.goodput.run_time's interval for this plan on this cluster, in steps of the
    plan's predicted step time."""
    from autopar.cost.goodput import run_time

    e = ctx.estimate
    r = run_time(
        1.0,  # the interval does not depend on the tokens trained
        e.tokens_per_s,
        ctx.num_gpus,
        ctx.model.params_total,
        fp32=ctx.plan.dtype == "fp32",
        rel=ctx.cluster.reliability,
    )
    seconds = float(r.interval_s)
    if not math.isfinite(seconds):
        return CheckpointInterval(seconds, None)
    return CheckpointInterval(seconds, max(1, round(seconds / e.step_time_s)))


def uses_megatron_fsdp(ctx: Context) -> bool:
    """ZeRO-2/3 run as Megatron-FSDP on the Megatron-Core trainers (autopar.export.megatron_core)."""
    return ctx.plan.zero_stage >= 2 and ctx.plan.trainer in ("megatron", "nemo", "bridge")


def cuda_device_max_connections(ctx: Context) -> int | None:
    """CUDA_DEVICE_MAX_CONNECTIONS for the plan (module docstring); None = leave it unset."""
    p = ctx.plan
    if uses_megatron_fsdp(ctx):
        return None
    n = CUDA_DEFAULT_CONNECTIONS
    if ctx.model.moe is not None and p.moe_dispatcher == "deepep":
        n = 32
    if ctx.cluster.gpu.generation == "blackwell":
        if (p.tp > 1 or p.cp > 1) and (p.dp > 1 or p.pp > 1):
            n = 32
    elif (p.tp > 1 or p.cp > 1) and not ep_overlap(p):
        n = 1
    return None if n == CUDA_DEFAULT_CONNECTIONS else n


@dataclass(frozen=True)
class TrainerEnv:
    """Environment lines of a launch script: variables to export and variables to unset."""

    set: tuple[tuple[str, str], ...]
    unset: tuple[str, ...] = ()


def megatron_family_env(ctx: Context) -> TrainerEnv:
    """The documented NCCL / Transformer Engine environment of a Megatron-Core run (module docstring)."""
    out: list[tuple[str, str]] = []
    unset: list[str] = []
    conn = cuda_device_max_connections(ctx)
    if conn is None:
        unset.append("CUDA_DEVICE_MAX_CONNECTIONS")
    else:
        out.append(("CUDA_DEVICE_MAX_CONNECTIONS", str(conn)))
    out += [
        ("NVTE_FWD_LAYERNORM_SM_MARGIN", str(LAYERNORM_SM_MARGIN)),
        ("NVTE_BWD_LAYERNORM_SM_MARGIN", str(LAYERNORM_SM_MARGIN)),
        ("TORCH_NCCL_HIGH_PRIORITY", "1"),
    ]
    return TrainerEnv(tuple(out), tuple(unset))
