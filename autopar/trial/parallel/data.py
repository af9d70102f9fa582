"""Data parallelism by ZeRO stage: DDP, or FSDP2 `fully_shard` with the stage's resharding rules.

The plan's `zero_stage` maps to (Rajbhandari et al. 2020 ZeRO; torch FSDP2 `fully_shard`):

- **stage 0**: DDP (FSDP2 `replicate` with TP). Parameters replicated; gradients replicated,
  all-reduced once, after the last microbatch (no_sync before); optimizer state replicated.
  Collectives per step (m microbatches): 1 all-reduce.
- **stage 1**: FSDP2, reshard_after_forward=False. Parameters sharded at rest, gathered once per
  step and kept for every microbatch; gradients accumulated unsharded, reduce-scattered once after
  the last microbatch; optimizer state sharded. Collectives: 1 all-gather + 1 reduce-scatter.
- **stage 2**: FSDP2, reshard_after_forward=False. Parameters as stage 1; gradients
  reduce-scattered after every microbatch, accumulated sharded; optimizer state sharded.
  Collectives: 1 all-gather + m reduce-scatters.
- **stage 3**: FSDP2, reshard_after_forward=True. Parameters gathered for each forward and again
  for each backward; gradients reduce-scattered after every microbatch; optimizer state sharded.
  Collectives: 2m all-gathers + m reduce-scatters.

Stage 0 with tensor parallelism uses FSDP2's `replicate` (the same gradient all-reduce, per unit):
DDP cannot hold DTensor parameters, and its `_pre_dp_module_transform` workaround re-reduces the
sequence-parallel norm gradients every microbatch and broke under pipelining.

Stage 1 is Megatron's distributed optimizer in communication (one reduce-scatter of the gradients
and one all-gather of the parameters per step); torch has no "shard only the optimizer" wrapper
with that traffic (ZeroRedundancyOptimizer all-reduces, then broadcasts), so FSDP2 is used with
gradient sync deferred to the last microbatch. Under pipeline parallelism torch.distributed.pipelining
drives the FSDP2 flags itself: it defers the reduce-scatter to the end of the step for every stage
(so stages 2 and 3 keep unsharded gradients across microbatches there) and keeps parameters
gathered after each backward (stage 3 gathers m + 1 times, not 2m).

FSDP2 units: the embedding, each transformer block, the final norm and the LM head; the root (a
stage module) then holds no parameter of its own, so every unit follows the stage's resharding rule
(FSDP2 never reshards a root after forward). A tied embedding stays in the root unit. Gradient-sync
flags are set on the root per microbatch (`microbatch_context`); `set_is_last_backward(False)` is
deliberately not used: it makes FSDP2 re-gather the embedding once more per step.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from autopar.trial.model import Transformer


def apply_dp(
    module: Transformer,
    dp_mesh: DeviceMesh,
    *,
    zero_stage: int,
    bf16: bool,
    expert_mesh: DeviceMesh | None = None,
    experts: bool = False,
) -> nn.Module:
    """Wrap one (stage) module for data parallelism over `dp_mesh` (dp x cp) by ZeRO stage (table
    above). Under expert parallelism (`experts`), the routed-expert stacks are not reduced over
    `dp_mesh`: each is its own unit on the expert-dp mesh `expert_mesh` (None when expert-dp is 1:
    they are left out of every unit); the 1/ep share of their gradient is applied in the experts'
    backward (GroupedExperts.grad_scale; FSDP2's own divide factor needs PREMUL_SUM, which gloo
    lacks). DDP cannot hold two reduction groups, so ZeRO-0 uses FSDP2's replicate then."""
    tensor_parallel = any(isinstance(p, DTensor) for p in module.parameters())
    if experts:
        if zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero stage must be 0..3, got {zero_stage}")
        reshard = zero_stage == 3

        def make(unit, mesh, ignored):
            if zero_stage == 0:
                return replicate(unit, mesh=mesh, mp_policy=_mp(bf16), ignored_params=ignored)
            return fully_shard(
                unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=_mp(bf16), ignored_params=ignored
            )

        stacks = [b.moe.experts for _, b in module.blocks() if b.moe is not None]
        ignored = None
        if expert_mesh is not None:
            for unit in stacks:
                make(unit, expert_mesh, None)
        else:
            ignored = {p for unit in stacks for p in unit.parameters()} or None
        return _wrap_units(module, lambda unit: make(unit, dp_mesh, ignored))
    if zero_stage == 0 and tensor_parallel:
        # DDP cannot hold DTensor parameters: FSDP2's replicate (all-reduce, DTensor-aware)
        return _wrap_units(module, lambda unit: replicate(unit, mesh=dp_mesh, mp_policy=_mp(bf16)))
    if zero_stage == 0:
        # buffers are the RoPE table, identical everywhere: no per-forward broadcast
        no_sync_buffers: dict[str, Any] = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else {"broadcast_buffers": False}
        )
        return DistributedDataParallel(module, process_group=dp_mesh.get_group(), **no_sync_buffers)
    if zero_stage not in (1, 2, 3):
        raise ValueError(f"zero stage must be 0..3, got {zero_stage}")
    reshard = zero_stage == 3
    return _wrap_units(
        module, lambda unit: fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=_mp(bf16))
    )


def _mp(bf16: bool) -> MixedPrecisionPolicy:
    """bf16 compute copies of the parameters, fp32 gradient reduction (Megatron's main grads)."""
    if not bf16:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _wrap_units(module: Transformer, wrap: Callable[[nn.Module], object]) -> nn.Module:
    """Apply an FSDP2-style wrapper to each unit (embedding, blocks, norm, head), then the root."""
    tied = module.config.spec.tied_embeddings
    units: list[nn.Module] = []
    if module.tok_embeddings is not None and not tied:
        units.append(module.tok_embeddings)
    units.extend(module.layers.values())
    units.extend(m for m in (module.norm, None if tied else module.output) if m is not None)
    for unit in units:
        wrap(unit)
    wrap(module)
    return module


@contextlib.contextmanager
def microbatch_context(module: nn.Module, zero_stage: int, last: bool) -> Iterator[None]:
    """Gradient-sync rules of one microbatch's forward + backward outside a pipeline schedule."""
    if isinstance(module, DistributedDataParallel):
        with contextlib.nullcontext() if last else module.no_sync():
            yield
        return
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(last or zero_stage >= 2)
        module.set_reshard_after_backward(last or zero_stage == 3)
    yield
