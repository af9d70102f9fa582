"""Tensor + sequence parallelism from the sharding tables (autopar/spec/sharding.py), with DTensor.

Each table style becomes a DTensor ParallelStyle (Megatron's split, Shoeybi et al. 2019; SP,
Korthikanti et al. 2022; torchtitan `apply_tp`):
- block `colwise` -> ColwiseParallel (Q/K/V, gate/up), `rowwise` -> RowwiseParallel (O, down) whose
  output is reduce-scattered over the sequence (SP) or all-reduced (no SP);
- model `rowwise` (tok_embeddings) -> vocab-parallel embedding (rows sharded, replicated token ids);
- model `colwise` (output) -> vocab-parallel LM head whose logits stay sharded on the vocabulary
  (a DTensor), for `loss_parallel` cross-entropy: [tokens, vocab] logits are never gathered;
- `sequence` (norms) -> SequenceParallel when SP is on, else nothing (the norm runs replicated);
  `sequence-tokens` (the MoE router, fed flattened [tokens, hidden]) -> SequenceParallel on dim 0;
- `local` (the MoE region) -> its input becomes this rank's plain sequence shard: the routed experts
  are not split over tp but folded into EP (each tp rank dispatches its own tokens, Megatron-Core's
  MoE parallel folding, etp = 1); the router's gradient is reduced over tp like a norm's, and the
  shared expert inside is an ordinary column/row-parallel region.
The entry of every column-parallel region (the parent of its colwise modules: `attention`,
`feed_forward`) gets a PrepareModuleInput that makes its input one replicated DTensor (an
all-gather of the sequence under SP), so the backward reduces the region's input gradient once.

KV heads: wk/wv are column-sharded like wq, so each rank holds kv_heads/tp KV heads and the
kv_heads/tp * (heads/kv_heads) query heads that use them. This needs tp to divide kv_heads (and
heads); otherwise apply_tp refuses, as Megatron-Core and the plan rules (`kv_heads%tp`) do:
replicating KV heads across tp would break the cost model's parameter and FLOP split.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autopar.spec.sharding import MODEL_PLAN, block_plan
from autopar.trial.model import Transformer

#: number of tensor arguments of each region's forward: Attention(x, cos, sin), FeedForward(x)
_REGION_ARITY = {"attention": 3, "feed_forward": 1, "moe.shared_expert": 1}


def tp_problems(model: Transformer, tp: int) -> list[str]:
    """Why this model cannot be split over tp ranks (empty if it can)."""
    spec = model.config.spec
    out = []
    for what, n in (
        ("attention heads", spec.num_attention_heads),
        ("KV heads", spec.num_kv_heads),
        ("FFN hidden size", spec.ffn_hidden_size),
        ("padded vocabulary", model.config.vocab_rows),
    ):
        if n % tp:
            out.append(f"{what} ({n}) do not divide by tp={tp}")
    return out


def block_styles(table: Mapping[str, str], sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """DTensor styles of one transformer block from its sharding table."""
    seq = Shard(1) if sequence_parallel else Replicate()
    styles: dict[str, ParallelStyle] = {}
    for name, style in table.items():
        if style == "colwise":
            styles[name] = ColwiseParallel()
        elif style == "rowwise":
            styles[name] = RowwiseParallel(output_layouts=seq)
        elif style == "sequence":
            if sequence_parallel:
                styles[name] = SequenceParallel()
        elif style == "sequence-tokens":
            if not sequence_parallel:
                raise ValueError(f"{name} needs sequence parallelism under tp > 1 (MoE layers)")
            styles[name] = SequenceParallel(sequence_dim=0, use_local_output=True)
        elif style == "local":
            if not sequence_parallel:
                raise ValueError(f"{name} needs sequence parallelism under tp > 1 (MoE layers)")
            styles[name] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(seq,), use_local_output=True)
        else:
            raise ValueError(f"unknown sharding style {style!r} for {name}")
    # Each column-parallel region turns its input into one replicated DTensor at its entry
    # (Megatron's f operator): under SP that all-gathers the sequence; in the backward the partial
    # input gradients of its column-parallel modules add up first and are reduced once (one
    # reduce-scatter, or one all-reduce without SP), not once per module.
    for region in sorted({n.rsplit(".", 1)[0] for n, s in table.items() if s == "colwise"}):
        rest = (None,) * (_REGION_ARITY[region] - 1)
        styles[region] = PrepareModuleInput(input_layouts=(seq, *rest), desired_input_layouts=(Replicate(), *rest))
    return styles


def model_styles(table: Mapping[str, str], sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """DTensor styles of the embedding, final norm and LM head from the model table."""
    seq = Shard(1) if sequence_parallel else Replicate()
    translate = {
        ("tok_embeddings", "rowwise"): lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        ("output", "colwise"): lambda: ColwiseParallel(
            input_layouts=seq, output_layouts=Shard(-1), use_local_output=False
        ),
        ("norm", "sequence"): lambda: SequenceParallel() if sequence_parallel else None,
    }
    styles = {}
    for name, style in table.items():
        make = translate.get((name, style))
        if make is None:
            raise ValueError(f"no DTensor translation for {name}: {style}")
        made = make()
        if made is not None:
            styles[name] = made
    return styles


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Shard `model` (or a pipeline stage of it: absent parts are skipped) over `tp_mesh` in place."""
    problems = tp_problems(model, tp_mesh.size())
    if problems:
        raise ValueError("cannot apply tensor parallelism: " + "; ".join(problems))
    spec = model.config.spec
    present = {
        name: style
        for name, style in model_styles(MODEL_PLAN, sequence_parallel).items()
        if getattr(model, name) is not None
    }
    # every rank builds the same full model, so each slices its own shard: no broadcast needed
    parallelize_module(model, tp_mesh, present, src_data_rank=None)
    for key, block in model.layers.items():
        moe_layer = spec.is_moe_layer(int(key))
        table = block_plan(moe_layer, shared_experts=bool(spec.moe and spec.moe.num_shared_experts))
        parallelize_module(block, tp_mesh, block_styles(table, sequence_parallel), src_data_rank=None)
    if isinstance(model, Transformer):
        model.tie_weights()  # both are row-sharded [vocab, hidden]: the same local shard
