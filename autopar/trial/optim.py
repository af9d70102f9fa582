"""The trial optimizer: AdamW (the realistic default) or plain SGD (linear in the gradient, for parity)."""

from __future__ import annotations

import torch


def make_optimizer(params: list[torch.nn.Parameter], name: str, lr: float) -> torch.optim.Optimizer:
    """AdamW without weight decay, or SGD without momentum; `foreach=False` keeps the update order
    identical between sharded (DTensor) and plain parameters."""
    params = [p for p in params if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=False)
    raise ValueError(f"optimizer must be adamw or sgd, got {name!r}")
