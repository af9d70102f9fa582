"""Data parallelism by ZeRO stage: DDP, or FSDP2 `fully_shard` with the stage's resharding rules.

The plan's `zero_stage` maps to (Rajbhandari et al. 2020 ZeRO; torch FSDP2 `fully_shard`):

| stage | wrapper | parameters | gradients | optimizer state | collectives per step (m microbatches) |
|---|---|---|---|---|---|
| 0 | DDP | replicated | replicated, all-reduced once, after the last microbatch (no_sync before) | replicated | 1 all-reduce |
| 1 | FSDP2, reshard_after_forward=False | sharded at rest, gathered once per step and kept for every microbatch | accumulated unsharded, reduce-scattered once after the last microbatch | sharded | 1 all-gather + 1 reduce-scatter |
| 2 | FSDP2, reshard_after_forward=False | as stage 1 | reduce-scattered after every microbatch, accumulated sharded | sharded | 1 all-gather + m reduce-scatters |
| 3 | FSDP2, reshard_after_forward=True | gathered for each forward and again for each backward | reduce-scattered after every microbatch | sharded | 2m all-gathers + m reduce-scatters |

Stage 1 is Megatron's distributed optimizer in communication (one reduce-scatter of the gradients
and one all-gather of the parameters per step); torch has no "shard only the optimizer" wrapper
with that traffic (ZeroRedundancyOptimizer all-reduces, then broadcasts), so FSDP2 is used with
gradient sync deferred to the last microbatch. Under pipeline parallelism torch.distributed.pipelining
drives the FSDP2 flags itself: it defers the reduce-scatter to the end of the step for every stage
(so stages 2 and 3 keep unsharded gradients across microbatches there) and keeps parameters
gathered after each backward (stage 3 gathers m + 1 times, not 2m).

FSDP2 units: the embedding, each transformer block, and the final norm with the LM head; the root
(a stage module) then holds no parameter of its own, so every unit follows the stage's resharding
rule (FSDP2 never reshards a root after forward). A tied embedding stays in the root unit.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
from torch.nn.parallel import DistributedDataParallel

from autopar.trial.model import Transformer


def apply_dp(module: Transformer, dp_mesh: DeviceMesh, *, zero_stage: int, bf16: bool) -> nn.Module:
    """Wrap one (stage) module for data parallelism over `dp_mesh` by ZeRO stage (table above)."""
    if zero_stage == 0:
        if any(hasattr(p, "device_mesh") for p in module.parameters()):
            _pre_dp_module_transform(module)  # DDP reduces local tensors; DTensor params are unwrapped
        # buffers are the RoPE table, identical everywhere: no per-forward broadcast
        no_sync_buffers = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                           else {"broadcast_buffers": False})
        return DistributedDataParallel(module, process_group=dp_mesh.get_group(), **no_sync_buffers)
    if zero_stage not in (1, 2, 3):
        raise ValueError(f"zero stage must be 0..3, got {zero_stage}")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    reshard = zero_stage == 3
    tied = module.config.spec.tied_embeddings
    units: list[nn.Module] = []
    if module.tok_embeddings is not None and not tied:
        units.append(module.tok_embeddings)
    units.extend(module.layers.values())
    units.extend(m for m in (module.norm, None if tied else module.output) if m is not None)
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    return module


@contextlib.contextmanager
def microbatch_context(module: nn.Module, zero_stage: int, last: bool) -> Iterator[None]:
    """Gradient-sync rules of one microbatch's forward + backward outside a pipeline schedule."""
    if isinstance(module, DistributedDataParallel):
        with (contextlib.nullcontext() if last else module.no_sync()):
            yield
        return
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(last or zero_stage >= 2)
        module.set_reshard_after_backward(last or zero_stage == 3)
    yield
