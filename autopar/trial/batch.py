"""Synthetic training data: a deterministic global batch per step, and this rank's share of it."""

from __future__ import annotations

import torch

from autopar.spec.plan import ParallelPlan


def synthetic_batch(
    seed: int, step: int, global_batch: int, seq_len: int, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, next-token targets), each [global_batch, seq_len], uniform over the real vocabulary;
    the same on every rank, drawn from its own stream (not the parameters')."""
    g = torch.Generator().manual_seed(1_000_000_007 * (seed + 1) + step)
    data = torch.randint(0, vocab, (global_batch, seq_len + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def dp_share(batch: torch.Tensor, plan: ParallelPlan, dp_rank: int) -> torch.Tensor:
    """The rows of the global batch that data-parallel rank `dp_rank` trains on (contiguous blocks)."""
    n = plan.global_batch_size // plan.dp
    return batch[dp_rank * n : (dp_rank + 1) * n]


def cp_share(batch: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """The sequence columns a context-parallel rank holds (autopar.trial.parallel.context.cp_positions)."""
    return batch if positions is None else batch[:, positions].contiguous()
