"""Activation recomputation (activation checkpointing) of the built-in model, the torchtitan way.

Sources: Chen et al. 2016 (gradient checkpointing); Korthikanti et al. 2022 section 5 (full
recomputation keeps each layer's input; selective recomputes only the attention core, whose stored
activations are large and cheap to recompute); torchtitan `apply_ac`
(torchtitan/models/llama3/infra/parallelize.py: after TP, before compile and FSDP; non-reentrant
torch.utils.checkpoint per transformer block).

Modes (`plan.recompute`):
- full: each transformer block's forward runs under non-reentrant `torch.utils.checkpoint`: only its
  input is kept and the block is run again in the backward, its TP collectives, CP ring exchange and
  EP all-to-alls included (Megatron `--recompute-granularity full --recompute-method block`). With
  `plan.recompute_layers = n` only the first n of this pipeline rank's layers are recomputed, as the
  cost model's `recompute_share` = min(1, n / layers of the rank) counts them.
- selective: `Attention.core` (the GQA K/V repeat and softmax(QK^T/sqrt(d))V) is checkpointed: q, k
  and v are kept; the repeated K/V and SDPA's saved output and log-sum-exp are dropped and
  recomputed. Under context parallelism the core is the ring attention, which like flash attention
  stores nothing quadratic; it is left as it is, so its P2P exchange is not re-run (the cost model
  counts recomputed ring traffic only under full recomputation: autopar.cost.comm.cp_calls).

The checkpoint replaces `forward` (or `core`) on the instance, so the module tree and parameter
names stay those of the plain model (torchtitan's checkpoint_wrapper would insert
`_checkpoint_wrapped_module` into every name). TP hooks live on the submodules, so a recomputed block
re-issues its collectives; FSDP2's hooks live on the block itself and are not re-run: its backward
pre-hook has gathered the parameters before the recomputation starts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from torch.utils.checkpoint import checkpoint

from autopar.spec.plan import ParallelPlan
from autopar.trial.model import Transformer
from autopar.trial.parallel.pipeline import virtual_stages

MODES = ("none", "selective", "full")


def checkpointed(fn: Callable) -> Callable:
    """`fn` run under non-reentrant activation checkpointing (its inputs kept, its inside recomputed).
    The recomputation runs the whole of `fn`, as Megatron's CheckpointFunction does: torch's default
    early stop would skip the ops after the last saved tensor (a block's final reduce-scatter and
    residual add), whose collectives the cost model counts (autopar.cost.comm.tp_calls)."""

    def run(*args, **kwargs):
        return checkpoint(fn, *args, use_reentrant=False, early_stop=False, **kwargs)

    return run


def recomputed_layers(plan: ParallelPlan, num_layers: int, pp_rank: int) -> list[int]:
    """Global indices of the layers pipeline rank `pp_rank` recomputes under full recomputation:
    all of its layers, or the first `plan.recompute_layers` of them in layer order."""
    mine = sorted(i for _, layers in virtual_stages(plan, num_layers, pp_rank) for i in layers)
    return mine if plan.recompute_layers is None else mine[: plan.recompute_layers]


def apply_ac(model: Transformer, mode: str, layers: Collection[int] | None = None) -> None:
    """Recompute activations of `model` (the whole model, before the pipeline cut: stages share its
    blocks) by `mode`; `layers` limits full recomputation to those global layer indices."""
    if mode not in MODES:
        raise ValueError(f"recompute must be one of {MODES}, got {mode!r}")
    if mode == "none":
        return
    # the wrapped methods are set on the instances (the checker reports a method assignment)
    for key, block in model.blocks():
        if mode == "full" and (layers is None or int(key) in layers):
            block.forward = checkpointed(block.forward)  # type: ignore[method-assign]
        elif mode == "selective" and not getattr(block.attention.core, "ring", False):
            block.attention.core = checkpointed(block.attention.core)  # type: ignore[method-assign]
