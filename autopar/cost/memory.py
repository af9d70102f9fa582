"""Static memory per GPU by ZeRO stage: weights, gradients, optimizer state (vectorised).

Default accounting is Megatron-Core's (docs dist_optimizer.md, theoretical_memory_usage.py): bf16
weights (2 B), fp32 main gradients (4 B), fp32 master weights + Adam m and v (12 B) = 18 B/param;
the distributed optimizer (ZeRO-1) shards the 12 optimizer bytes over the data-parallel group:
6 + 12/d. `main_grads_fp32=False` gives the ZeRO paper's 16 bytes/param (2 + 2 + 12; Rajbhandari
et al. 2020, sec. 3.1). ZeRO-2 also shards gradients, ZeRO-3/FSDP also weights (the same paper). The
data-parallel group of dense parameters is dp x cp (Megatron-Core reduces gradients over the dp-cp
group); routed experts use the expert-data-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WEIGHT_BYTES = 2.0  # bf16 (FP8 training keeps bf16 weights; TE's fp8 copies are transient)
OPTIMIZER_BYTES = 12.0  # fp32 master + Adam m + v
FP32_OPTIMIZER_BYTES = 8.0  # fp32 training: Adam m + v, no master copy


def grad_bytes(main_grads_fp32, fp32) -> np.ndarray:
    """Bytes per main-gradient element: fp32 main gradients (Megatron's default, and fp32 training)
    4, else the model's 16-bit 2."""
    return np.where(np.asarray(main_grads_fp32) | np.asarray(fp32), 4.0, 2.0)


def precision_bytes(fp32) -> tuple[np.ndarray, np.ndarray]:
    """(weight bytes, optimizer bytes) per parameter: mixed precision 2 and 12, fp32 4 and 8."""
    return np.where(fp32, 4.0, WEIGHT_BYTES), np.where(fp32, FP32_OPTIMIZER_BYTES, OPTIMIZER_BYTES)


@dataclass
class StateBytes:
    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray


def state_bytes(
    dense_params, expert_params, zero_stage, dense_dp, expert_dp, main_grads_fp32, fp32=False, pp=1
) -> StateBytes:
    """Weights, gradients and optimizer bytes of one GPU holding `dense_params` (sharded over
    `dense_dp`) and `expert_params` (sharded over `expert_dp`) under the ZeRO stage; `fp32` is
    full-precision training (4-byte weights and gradients, Adam m and v only). Under pipeline
    parallelism (pp > 1) gradients stay unsharded across the microbatches of a step (the
    reduce-scatter waits for the last one: torch.distributed.pipelining with FSDP2, measured on
    the built-in model), so ZeRO-2/3 shard them only without pipelining."""
    z = np.asarray(zero_stage)
    grad_b = grad_bytes(main_grads_fp32, fp32)
    weight_b, opt_b = precision_bytes(fp32)

    def sharded(params, group, from_stage, per_param, when=True):
        return params * per_param / np.where((z >= from_stage) & when, group, 1.0)

    grads_sharded = np.asarray(pp) == 1

    dense_dp = np.asarray(dense_dp, dtype=float)
    expert_dp = np.asarray(expert_dp, dtype=float)
    return StateBytes(
        weights=sharded(dense_params, dense_dp, 3, weight_b) + sharded(expert_params, expert_dp, 3, weight_b),
        gradients=(
            sharded(dense_params, dense_dp, 2, grad_b, grads_sharded)
            + sharded(expert_params, expert_dp, 2, grad_b, grads_sharded)
        ),
        optimizer=sharded(dense_params, dense_dp, 1, opt_b) + sharded(expert_params, expert_dp, 1, opt_b),
    )
