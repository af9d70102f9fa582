"""What a GPU's memory holds beyond the tensors a step allocates (vectorised): the caching
allocator's reserve, the CUDA context and NCCL's buffers. Sizes per MemoryStack
(autopar.cost.memory_stacks), each with its source there.

Three quantities, and what each published figure measures (autopar.calibration.memory_published):
- allocated: the live tensors at the peak (torch.cuda.max_memory_allocated);
- reserved: what the caching allocator holds (torch.cuda.max_memory_reserved), the allocated peak
  plus fragmentation of the memory that churns within a step;
- device: what nvidia-smi shows and what must fit: reserved + CUDA context + NCCL buffers. The
  estimate's peak memory is this one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost.memory_stacks import MemoryStack
from autopar.spec.hardware import GIB

#: the context and NCCL of a 2022 run (torch 1.10-1.11, NCCL 2.10-2.12): eager CUDA module loading,
#: 1.78 GiB (ml-engineering, torch 1.10.2 on A100); NCCL connects every channel of every
#: communicator at its first collective, so each costs what the first does
ERA_2022_CONTEXT_GIB = 1.78


class Runtime(NamedTuple):
    cuda_context: np.ndarray
    nccl: np.ndarray


def communicators(x, family: str) -> np.ndarray:
    """NCCL communicators a rank uses (PyTorch creates each at its first collective): tensor,
    context, data (the dp x cp gradient group), pipeline and expert groups of size > 1; Megatron
    also all-reduces gradient norms over the model-parallel group (tp x pp) and tied embedding
    gradients over the first and last stages (megatron/core/parallel_state.py)."""
    t = x.table
    count = (
        (t.tp > 1).astype(float)
        + (t.cp > 1)
        + (x.dp_shard > 1)
        + (x.dp_replicas > 1)  # hybrid sharding: the shard group and the replica group
        + (t.pp > 1)
        + (t.ep > 1)
        + ((x.expert_dp > 1) & (t.ep > 1))
    )
    if family == "megatron":
        count = count + ((t.tp * t.pp > 1) & (t.tp > 1) & (t.pp > 1))
        count = count + (t.pp > 1) * (x.has_embedding + x.has_head > 0)
    return np.broadcast_to(count, x.has_head.shape) + 0.0 * x.has_head


def runtime(x, stack: MemoryStack, era_2022: bool, on_gpu: bool) -> Runtime:
    """CUDA context and NCCL buffers per rank, bytes ((C, n) arrays; zero off GPU)."""
    zero = 0.0 * x.has_head
    if not on_gpu:
        return Runtime(zero, zero)
    context = (ERA_2022_CONTEXT_GIB if era_2022 else stack.cuda_context_gib) * GIB + zero
    n = communicators(x, stack.family)
    more = stack.nccl_first_gib if era_2022 else stack.nccl_more_gib
    nccl = np.where(n > 0, stack.nccl_first_gib + (n - 1) * more, 0.0) * GIB
    return Runtime(context, nccl)


def fragmentation(stack: MemoryStack, churn: np.ndarray, on_gpu: bool) -> np.ndarray:
    """The caching allocator's reserve beyond the allocated peak: `stack.fragmentation` of the
    bytes that are allocated and freed within a step (zero off GPU: CPU trials count live
    tensors)."""
    return stack.fragmentation * churn if on_gpu else 0.0 * churn
