"""The training loss: mean token cross-entropy, vocab-parallel under tensor parallelism.

Source: Megatron vocab-parallel cross-entropy (Shoeybi et al. 2019, Megatron-LM, sec. 3);
DTensor `loss_parallel` computes it on the vocab-sharded logits without gathering them.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy in fp32; vocab-parallel when the logits are a vocab-sharded DTensor
    and the step runs under `loss_parallel()` (the runner enters it whenever tp > 1)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def loss_context(tensor_parallel: bool) -> contextlib.AbstractContextManager:
    """`loss_parallel()` for the whole step (forward and backward) when logits are vocab-sharded."""
    return loss_parallel() if tensor_parallel else contextlib.nullcontext()
