"""Sharding plans as data: how tensor parallelism splits each module of a transformer block.

The same tables drive both sides, so they cannot drift apart:
- the built-in model (autopar/trial/parallel/tensor.py) turns each style into a PyTorch DTensor
  ParallelStyle (colwise -> ColwiseParallel, rowwise -> RowwiseParallel, ...);
- the cost model (autopar/cost/comm.py) counts the TP collectives from them: every rowwise module
  ends a "sync point" (an all-reduce, or a reduce-scatter with sequence parallelism, in the forward
  pass; the column-parallel entry of its region all-gathers / all-reduces in the backward).

Module names follow the built-in model (autopar/trial/model.py): per block `attention.{wq,wk,wv,wo}`
and `feed_forward.{w1,w2,w3}` (SwiGLU: w1 gate, w3 up, w2 down), or `moe` with `moe.router`,
`moe.experts` and `moe.shared_expert.{w1,w2,w3}`; the model has `tok_embeddings`, `norm` and `output`.

Styles: `colwise` / `rowwise` (Megatron's split), `sequence` (parameters replicated over tp, the
input split on the sequence: each rank's gradient is a partial sum over its tokens, all-reduced
over tp under SP), `sequence-tokens` (the same on a flattened [tokens, hidden] input: the router),
`local` (a region that runs on this rank's own sequence shard with no TP collective: the routed
experts, whose parallelism is EP, folded over the tp ranks: Megatron-Core's MoE parallel folding
with expert-tensor-parallel size 1).
"""

from __future__ import annotations

from types import MappingProxyType

#: Megatron's column/row split (Shoeybi et al. 2019): Q/K/V and gate/up column-parallel, the output
#: projection and the down projection row-parallel; norms sequence-parallel when SP is on.
ATTENTION_PLAN = MappingProxyType(
    {"attention.wq": "colwise", "attention.wk": "colwise", "attention.wv": "colwise", "attention.wo": "rowwise"}
)
DENSE_MLP_PLAN = MappingProxyType(
    {"feed_forward.w1": "colwise", "feed_forward.w3": "colwise", "feed_forward.w2": "rowwise"}
)
#: shared experts of an MoE block are a dense MLP on the TP group (routed experts use EP)
SHARED_EXPERT_PLAN = MappingProxyType(
    {"moe.shared_expert.w1": "colwise", "moe.shared_expert.w3": "colwise", "moe.shared_expert.w2": "rowwise"}
)
#: routed experts under TP with etp = 1: the MoE region keeps each rank's sequence shard (SP) and
#: dispatches it over EP; the router is replicated, its gradient reduced over tp like a norm's
#: (Megatron-Core marks the router weight `sequence_parallel`)
ROUTED_EXPERTS_PLAN = MappingProxyType({"moe": "local", "moe.router": "sequence-tokens"})
NORM_PLAN = MappingProxyType({"attention_norm": "sequence", "ffn_norm": "sequence"})
#: vocab-parallel embedding (rowwise over the vocabulary rows) and LM head (colwise over the
#: vocabulary, output left sharded for vocab-parallel cross-entropy); the final norm under SP
MODEL_PLAN = MappingProxyType({"tok_embeddings": "rowwise", "norm": "sequence", "output": "colwise"})


def sync_points(plan) -> int:
    """TP sync points of a module plan: one per row-parallel module (its region's exit)."""
    return sum(1 for style in plan.values() if style == "rowwise")


def block_plan(moe_layer: bool, shared_experts: bool) -> dict[str, str]:
    """The TP plan of one transformer block."""
    plan = dict(ATTENTION_PLAN) | dict(NORM_PLAN)
    if not moe_layer:
        plan |= DENSE_MLP_PLAN
        return plan
    plan |= ROUTED_EXPERTS_PLAN
    if shared_experts:
        plan |= SHARED_EXPERT_PLAN
    return plan


#: styles whose parameters are replicated over tp with partial (per-token-shard) gradients under SP
SEQUENCE_STYLES = frozenset({"sequence", "sequence-tokens"})
