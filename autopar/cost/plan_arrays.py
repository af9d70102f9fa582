"""The plan columns the cost formulas read, derived once per evaluation (vectorised).

Per-plan quantities are (n,) arrays; per-pipeline-rank ones are (C, n) arrays over the ranks
costed (autopar.spec.stages: every rank for one plan, only the ranks that can differ for a search).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost.memory import grad_bytes as grad_precision_bytes
from autopar.cost.memory import precision_bytes
from autopar.spec.fp8_recipes import param_gather
from autopar.spec.model import ModelSpec
from autopar.spec.recompute_modules import DEFAULT_SELECTIVE, MODULE_BITS, modules_mask
from autopar.spec.stages import StageProfiles
from autopar.spec.table import DTYPE, RECOMP, PlanTable


@dataclass(frozen=True)
class PlanArrays:
    table: PlanTable
    stages: StageProfiles
    seq_len: int
    tp: np.ndarray
    tp_float: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vpp: np.ndarray
    sequence_parallel: np.ndarray  # bool
    micro_batch: np.ndarray  # sequences per microbatch (float)
    microbatches: np.ndarray  # per step per pipeline, at least 1 (float)
    tokens: np.ndarray  # tokens of one microbatch on one CP rank
    expert_dp: np.ndarray  # tp*cp*dp / (ep*etp)
    fp32: np.ndarray  # full-precision training (bool)
    act_bytes: np.ndarray  # bytes per activation element: 4 in fp32, else 2
    act_scale: np.ndarray  # act_bytes / 2: the activation formulas are for 2-byte activations
    weight_bytes: np.ndarray
    grad_bytes: np.ndarray  # bytes per main-gradient element
    fp8_gather: np.ndarray  # FP8 parameters, all-gathered in FP8 (autopar.spec.fp8_recipes param_gather)
    full: np.ndarray  # full recompute (bool)
    #: the attention core recomputed (bool): selective recompute with core_attn among its modules
    #: (Megatron's default; torchtitan's op-level SAC and the built-in model's selective)
    selective: np.ndarray
    #: Megatron-Core's selective recompute modules (autopar.spec.recompute_modules MODULE_BITS), the
    #: default core_attn filled in; 0 without selective recompute
    recompute_modules: np.ndarray
    recompute_share: np.ndarray  # (C, n): share of a rank's layers whose forward is recomputed
    dense_layers: np.ndarray  # (C, n) float
    moe_layers: np.ndarray  # (C, n) float
    layers: np.ndarray  # (C, n) float
    has_embedding: np.ndarray  # (C, n) float
    has_head: np.ndarray  # (C, n) float
    routing_imbalance: float = 1.0  # dropless MoE: busiest expert rank's tokens / the mean

    @property
    def rank(self) -> np.ndarray:
        return self.stages.rank

    @property
    def active(self) -> np.ndarray:
        return self.stages.active

    @property
    def dp_group(self) -> np.ndarray:
        """Ranks the dense gradients are reduced over: dp x cp (Megatron-Core's dp-cp group)."""
        return self.dp * self.cp

    @property
    def dp_shard(self) -> np.ndarray:
        """Ranks one ZeRO shard of the dense states spans: the dp x cp group, or fewer under hybrid
        sharding (--dp-shard: FSDP2 HSDP, Megatron --num-distributed-optimizer-instances)."""
        return np.where(self.table.dp_shard > 0, self.table.dp_shard, self.dp_group)

    @property
    def dp_replicas(self) -> np.ndarray:
        """Copies of each dense shard (1 without hybrid sharding): the gradients, reduce-scattered
        within a shard group, are then all-reduced across the replicas."""
        return self.dp_group // self.dp_shard


def selective_modules(table: PlanTable) -> np.ndarray:
    """The modules selective recompute checkpoints, as bitmasks: the plan's, or Megatron-Core's
    default ["core_attn"] where it gives none (transformer_config.py TransformerConfig.__post_init__);
    none without selective recompute."""
    listed = np.where(table.recompute_modules > 0, table.recompute_modules, modules_mask(DEFAULT_SELECTIVE))
    return np.where(table.recompute == RECOMP["selective"], listed, 0).astype(np.int64)


def plan_arrays(
    table: PlanTable, model: ModelSpec, seq_len: int, stages: StageProfiles, routing_imbalance: float = 1.0
) -> PlanArrays:
    t, c = table.tp, table.cp
    b = table.micro_batch_size.astype(float)
    dense_l, moe_l = stages.dense_layers.astype(float), stages.moe_layers.astype(float)
    layers = dense_l + moe_l
    full = table.recompute == RECOMP["full"]
    modules = selective_modules(table)
    rl = np.where(table.recompute_layers < 0, np.inf, table.recompute_layers)
    fp32 = table.dtype == DTYPE["fp32"]
    act_bytes = np.where(fp32, 4.0, 2.0)
    weight_bytes, _ = precision_bytes(fp32)
    return PlanArrays(
        table=table,
        stages=stages,
        seq_len=seq_len,
        tp=t,
        tp_float=t.astype(float),
        pp=table.pp,
        dp=table.dp,
        cp=c,
        ep=table.ep,
        etp=table.etp,
        vpp=table.vpp,
        sequence_parallel=table.sequence_parallel.astype(bool),
        micro_batch=b,
        microbatches=np.maximum(table.num_microbatches.astype(float), 1.0),
        tokens=b * seq_len / c,
        expert_dp=np.maximum(1, (t * c * table.dp) // np.maximum(table.ep * table.etp, 1)),
        fp32=fp32,
        act_bytes=act_bytes,
        act_scale=act_bytes / 2.0,
        weight_bytes=weight_bytes,
        grad_bytes=grad_precision_bytes(table.main_grads_fp32, fp32),
        fp8_gather=param_gather(table),
        full=full,
        selective=(modules & MODULE_BITS["core_attn"]) > 0,
        recompute_modules=modules,
        recompute_share=np.where(full, np.minimum(1.0, rl / np.maximum(layers, 1.0)), 0.0),
        dense_layers=dense_l,
        moe_layers=moe_l,
        layers=layers,
        has_embedding=stages.has_embedding.astype(float),
        has_head=stages.has_head.astype(float),
        routing_imbalance=routing_imbalance,
    )
