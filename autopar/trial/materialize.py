"""Give a meta-built (stage) module its values, and count what a process holds.

Each parameter's full initial value is a pure function of seed and name
(autopar.trial.model.initial_value); a sharded parameter keeps only its DTensor slice of it, so a
parallel run starts from exactly the single-process model's values.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from autopar.trial.model import Transformer, initial_value


def count_params(module: nn.Module) -> int:
    """Parameters this process holds (the local shard of a DTensor), each shared tensor once."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())


def materialize(module: Transformer, seed: int, device: torch.device) -> None:
    """Give a meta-built (stage) module its initial values on `device`: each parameter's full
    value sliced to this rank's shard (DTensor layout), then the RoPE buffers."""
    module.to_empty(device=device)
    if isinstance(module, Transformer):
        module.tie_weights()
    config = module.config
    with torch.no_grad():
        for name, p in module.named_parameters():
            if isinstance(p, DTensor):
                full = initial_value(config, name, tuple(p.shape), seed).to(device)
                local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                p.to_local().copy_(local)
            else:
                p.copy_(initial_value(config, name, tuple(p.shape), seed))
        module.reset_buffers()
