"""Communication of every costed pipeline rank, per axis: payload bytes and time (vectorised).

Which calls each axis issues is autopar.cost.comm (one call list gives both bytes and time); which
link a group runs on is autopar.cost.collectives (`place`, from the rank order tp, cp, dp, pp,
innermost first; experts etp, ep, edp).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost.collectives import Links, deduplicated_all_to_all_time, place
from autopar.cost.comm import (cp_calls, dp_calls, ep_calls, grad_reductions_per_step, moe_stat_calls, pp_calls,
                               tp_calls, tp_step_calls, traffic)
from autopar.cost.compute import expert_load
from autopar.cost.params import RankParams
from autopar.cost.plan_arrays import PlanArrays
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.table import DISPATCHER


class Traffic(NamedTuple):
    bytes: np.ndarray  # payload this GPU hands to the calls
    seconds: np.ndarray


class CommTerms(NamedTuple):
    """Per microbatch: tp, cp, ep, pp. Per step: tp_step (SP norm gradients), dp_reduce (gradient
    reduction), dp_gather (parameter gathering), dense and expert parameters together."""

    tp: Traffic
    cp: Traffic
    ep: Traffic
    pp: Traffic
    tp_step: Traffic
    dp_reduce: Traffic
    dp_gather: Traffic


def comm_terms(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, prm: RankParams) -> CommTerms:
    links = Links.of(cluster)
    gpn = cluster.gpus_per_node
    t, c, share, sp = x.tp, x.cp, x.recompute_share, x.sequence_parallel
    # MoE aux-loss statistics over the ranks holding a sequence's tokens (cp x tp under SP): booked
    # on cp when cp > 1, else on tp (the built-in model names its group so: autopar.trial.parallelize)
    stat_n = c * np.where(sp, t, 1)
    stats = traffic(moe_stat_calls(model, x.micro_batch, stat_n, x.moe_layers, share), stat_n, place(stat_n, 1, gpn),
                    links)
    on_cp = c > 1
    tp_bytes, tp_time = traffic(tp_calls(model, x.tokens, sp, x.dense_layers, x.moe_layers, x.has_embedding,
                                         x.has_head, share, x.etp, x.act_bytes), t, place(t, 1, gpn), links)
    cp_group = place(c, t, gpn)
    cp_bytes, cp_time = traffic(cp_calls(model, x.tokens, t, c, x.layers, share, x.act_bytes), c, cp_group, links,
                                crosses_node=cp_group.nodes > 1)
    load = expert_load(x, cluster) if model.moe else 1.0
    ep_group = place(x.ep, x.etp, gpn)
    ep_list = ep_calls(model, x.tokens, t, sp, x.moe_layers, load, x.act_bytes, share)
    ep_bytes, ep_time = traffic(ep_list, x.ep, ep_group, links)
    if model.moe:
        deepep = x.table.moe_dispatcher == DISPATCHER["deepep"]
        fused = sum((deduplicated_all_to_all_time(c.full_bytes, ep_group, links, model.moe.top_k) * c.count
                     for c in ep_list), np.zeros(()))
        k = cluster.constants
        ep_time = np.where(deepep, fused / k.deepep_efficiency, ep_time / k.ep_a2a_efficiency)
    # neighbouring stages are tp*cp*dp ranks apart: do two of them share a node?
    neighbours = place(2, t * c * x.dp, gpn)
    pp = traffic(pp_calls(model, x.tokens, t, sp, x.pp, x.vpp, x.rank, x.act_bytes), x.pp, None, links,
                 crosses_node=neighbours.nodes > 1)
    reductions = grad_reductions_per_step(x.table.zero_stage, x.microbatches, x.pp, x.dp_group)
    tp_step = traffic(tp_step_calls(model, sp, x.dense_layers, x.moe_layers, x.has_head, x.grad_bytes, reductions),
                      t, place(t, 1, gpn), links)
    dense = _dp_traffic(x, prm.dense, x.dp_group, place(x.dp_group, t, gpn), links)
    expert = _dp_traffic(x, prm.expert, x.expert_dp, place(x.expert_dp, x.ep * x.etp, gpn), links)
    return CommTerms(
        tp=Traffic(tp_bytes + np.where(on_cp, 0.0, stats[0]), tp_time + np.where(on_cp, 0.0, stats[1])),
        cp=Traffic(cp_bytes + np.where(on_cp, stats[0], 0.0), cp_time + np.where(on_cp, stats[1], 0.0)),
        ep=Traffic(ep_bytes, ep_time), pp=Traffic(*pp),
        tp_step=Traffic(*tp_step),
        dp_reduce=Traffic(dense[0].bytes + expert[0].bytes, dense[0].seconds + expert[0].seconds),
        dp_gather=Traffic(dense[1].bytes + expert[1].bytes, dense[1].seconds + expert[1].seconds))


def _dp_traffic(x: PlanArrays, params, group_size, group, links) -> tuple[Traffic, Traffic]:
    """(gradient reduction, parameter gathering) of `params` over one data-parallel group."""
    reduce, gather = dp_calls(params, x.table.zero_stage, x.grad_bytes, x.weight_bytes, x.microbatches, x.pp,
                              group_size)
    return Traffic(*traffic(reduce, group_size, group, links)), Traffic(*traffic(gather, group_size, group, links))
