"""Prepare plans once, price them many times: `prepare` does what no cost constant changes (the
plans' shapes, pipeline ranks, rules, parameters and activation bytes), `price` turns that into the
estimate columns for a priced cluster's constants (a fit prices the same prepared plans many times)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autopar.cost.activation_offload import offloaded_bytes
from autopar.cost.columns import comm_columns, plan_columns, ranking_columns, stage_columns
from autopar.cost.comm_terms import CommTerms, comm_terms
from autopar.cost.compute import RawCompute, module_recompute, raw_compute
from autopar.cost.memory_terms import LayerActivations, in_flight, layer_activations, memory_terms
from autopar.cost.offload import host_bytes
from autopar.cost.params import RankParams, rank_params
from autopar.cost.plan_arrays import PlanArrays, plan_arrays
from autopar.cost.step import step_terms
from autopar.figures import FITS, HOST_MEMORY_BYTES, LAYOUT_TEXT, REJECTED_BY, VALID
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.recompute_modules import MODULE_BITS
from autopar.spec.rules import RuleResult, check_rules
from autopar.spec.stages import costed_and_run_starts, stage_profiles
from autopar.spec.table import PlanTable


@dataclass(frozen=True)
class Prepared:
    """What an estimate needs that no cost constant changes: the plans' shapes, pipeline ranks,
    rules, parameters and activation bytes. `price` turns it into the estimate for given constants
    (a fit prices the same prepared plans many times)."""

    x: PlanArrays
    model: ModelSpec
    rules: RuleResult
    params: RankParams
    layer_act: LayerActivations
    #: the same on the ranks that decide the time (`time_ranks`), or None: time on `x`'s ranks
    x_time: PlanArrays | None = None
    params_time: RankParams | None = None
    layer_act_time: LayerActivations | None = None

    @property
    def timed(self) -> tuple[PlanArrays, RankParams, LayerActivations]:
        if self.x_time is None:
            return self.x, self.params, self.layer_act
        assert self.params_time is not None and self.layer_act_time is not None  # set with x_time
        return self.x_time, self.params_time, self.layer_act_time


def prepare(
    table: PlanTable,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    num_gpus: int | None = None,
    seq_len: int | None = None,
    every_rank: bool = False,
    trainer_capabilities: bool = True,
    time_ranks: bool = False,
    recipes: frozenset[str] = frozenset(),
) -> Prepared:
    """`time_ranks` prices the time on the first rank of each run of equal ranks only (fewer than
    the memory needs; autopar.spec.stages), which gives the same step time: for a search, whose
    per-rank columns are not kept."""
    s = seq_len or model.seq_len
    timed = None
    if time_ranks and not every_rank:
        stages, timed = costed_and_run_starts(table, model)
    else:
        stages = stage_profiles(table, model, every_rank=every_rank)
    rules = check_rules(
        table,
        model,
        num_gpus=num_gpus,
        cluster=cluster,
        seq_len=s,
        stages=stages,
        trainer_capabilities=trainer_capabilities,
        recipes=recipes,
    )
    x, prm, act_bytes = _on_ranks(table, model, s, stages)
    if timed is None:
        return Prepared(x, model, rules, prm, act_bytes)
    return Prepared(x, model, rules, prm, act_bytes, *_on_ranks(table, model, s, timed))


def _on_ranks(table: PlanTable, model: ModelSpec, seq_len: int, stages) -> tuple:
    x = plan_arrays(table, model, seq_len, stages)
    prm = rank_params(model, x.dense_layers, x.moe_layers, x.has_embedding, x.has_head, x.tp, x.pp, x.ep, x.etp)
    return x, prm, layer_activations(x, model)


#: the modules whose recomputed forward `module_recompute` prices (core_attn is the attention's)
_PRICED_MODULES = (
    MODULE_BITS["mlp"]
    | MODULE_BITS["mla_up_proj"]
    | MODULE_BITS["moe"]
    | MODULE_BITS["shared_experts"]
    | MODULE_BITS["layernorm"]
    | MODULE_BITS["moe_act"]
)


def with_recompute_modules(
    x: PlanArrays,
    model: ModelSpec,
    cluster: ClusterSpec,
    prm: RankParams,
    raw: RawCompute,
    comm: CommTerms,
    with_bytes: bool = False,
) -> tuple[RawCompute, CommTerms]:
    """Compute and communication with Megatron-Core's selective recompute modules added
    (autopar.cost.compute.module_recompute): a recomputed MoE layer ("moe") also runs its
    dispatch, combine and count exchange once more (moe/moe_layer.py checkpoints them together).
    Plans that list no such module keep their figures exactly."""
    modules = np.asarray(x.recompute_modules)
    if not (modules & _PRICED_MODULES).any():
        return raw, comm
    raw = module_recompute(x, model, cluster, raw, modules)
    moe = (modules & MODULE_BITS["moe"]) > 0
    if moe.any():
        again = comm_terms(replace(x, recompute_share=x.recompute_share + 1.0), model, cluster, prm, with_bytes)
        comm = comm._replace(ep=again.ep._replace(seconds=np.where(moe, again.ep.seconds, comm.ep.seconds)))
    return raw, comm


def price(
    p: Prepared, cluster: ClusterSpec, routing_imbalance: float = 1.0, search: bool = False, headroom_gib: float = 0.0
) -> dict[str, np.ndarray]:
    """The estimate columns of prepared plans on a priced cluster (its constants are the profile's);
    a plan fits with `headroom_gib` to spare (autopar.cost.columns.set_validity)."""
    with np.errstate(divide="ignore", invalid="ignore"):  # invalid plans (e.g. FP8 on A100) are marked, not warned
        x, model = replace(p.x, routing_imbalance=routing_imbalance), p.model
        xt, prm_t, act_t = p.timed
        xt = replace(xt, routing_imbalance=routing_imbalance)
        memory = memory_terms(x, model, cluster, p.params, p.layer_act)
        raw = raw_compute(xt, model, cluster, act_t.rank_layers)
        comm = comm_terms(xt, model, cluster, prm_t, with_bytes=not search)
        raw, comm = with_recompute_modules(xt, model, cluster, prm_t, raw, comm, with_bytes=not search)
        step = step_terms(xt, model, cluster, prm_t, raw, comm)
        if search:
            return ranking_columns(x, model, cluster, p.rules, memory, step, headroom_gib)
        out = plan_columns(
            x, xt, model, cluster, p.rules, memory, step, step.recompute_flops, prm_t.total, headroom_gib
        )
        out.update(comm_columns(xt, comm))
        # host memory of the optimizer share and the activations offloaded (checked against nothing: no
        # host capacity is stated); the activations of every microbatch in flight at the rank's peak
        deepspeed = cluster.training_stack == "megatron-deepspeed"
        host = host_bytes(x, p.params, deepspeed) + offloaded_bytes(x, model, cluster) * in_flight(x)
        out[HOST_MEMORY_BYTES] = np.max(np.where(x.active, host, 0.0), axis=0)
        out[REJECTED_BY] = np.where(out[VALID], np.where(out[FITS], "", "memory"), p.rules.short_reasons())
        out[LAYOUT_TEXT] = x.stages.layout_text
        out.update(stage_columns(x, memory, step, p.params.total, comm))
        return out
