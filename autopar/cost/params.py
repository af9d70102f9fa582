"""Parameters held by one GPU (vectorised; arrays shaped like the stage candidates).

Source: Megatron `theoretical_memory_usage.py` (HEAD): TP-sharded parameters are
divided by tp, replicated ones (norms, router, row-parallel biases) are not, routed experts are
divided by ep*etp; the input embedding sits on the first stage, the output layer on the last (a
second copy of a tied embedding when pp > 1, as Megatron keeps it for the tied gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost.flops import padded_vocab
from autopar.spec.model import ModelSpec


@dataclass
class RankParams:
    dense: np.ndarray  # parameters reduced over the dp x cp group
    expert: np.ndarray  # routed-expert parameters, reduced over the expert-dp group
    dense_layer_max: np.ndarray  # the largest single layer's dense params (FSDP gather unit)
    #: the embedding and LM-head rows among `dense` (no FP8 GEMM reads them: they stay in BF16)
    vocab: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.dense + self.expert


def rank_params(model: ModelSpec, dense_layers, moe_layers, has_embedding, has_head, tp, pp, ep, etp) -> RankParams:
    """Parameters on one GPU of a pipeline rank holding the given layers."""
    d = model.layer_params(False)
    m = model.layer_params(True) if model.moe else d
    tp = np.asarray(tp, dtype=float)
    vocab_rows = padded_vocab(model, tp.astype(np.int64)) * model.hidden_size
    head_copy = (not model.tied_embeddings) | (np.asarray(pp) > 1)
    tp_sharded = (
        dense_layers * d.tp_sharded
        + moe_layers * m.tp_sharded
        + has_embedding * vocab_rows
        + has_head * head_copy * vocab_rows
    )
    replicated = (
        dense_layers * d.replicated
        + moe_layers * m.replicated
        + has_head * model.norm_params
        + has_embedding * model.position_embedding_params
    )
    expert = moe_layers * m.expert / (np.asarray(ep, dtype=float) * np.asarray(etp, dtype=float))
    layer_max = np.maximum(
        d.tp_sharded / tp + d.replicated,
        (m.tp_sharded / tp + m.replicated + m.expert / (np.asarray(ep) * np.asarray(etp))) if model.moe else 0.0,
    )
    vocab = (has_embedding + has_head * head_copy) * vocab_rows / tp
    return RankParams(dense=tp_sharded / tp + replicated, expert=expert, dense_layer_max=layer_max, vocab=vocab)
