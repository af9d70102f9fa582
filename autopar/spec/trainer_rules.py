"""The trainers' capability tables (autopar.spec.trainers) as vectorised validity rules.

One rule per capability kind: a mask of the plans of trainer T that need more than T's entry
allows, and a sentence naming T's limit, its source and what to use instead. `check_rules` runs
them with the model rules, so the search never offers a plan its trainer cannot run; the exporters
refuse with the same sentences (autopar.export.base), so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from autopar.spec.plan import RECOMPUTE, SCHEDULES
from autopar.spec.table import DISPATCH, DISPATCHER, DTYPE, RECOMP, SCHED, TRAINER, PlanTable
from autopar.spec.trainers import Capability, Trainer, trainers


@dataclass(frozen=True)
class Kind:
    """How one capability kind reads a plan: which rows break it, and what they need."""

    violated: Callable[[PlanTable, object, object], np.ndarray]  # (table, context, value) -> mask
    needs: Callable[[dict, object], str]  # (row, context) -> what the plan asks for
    verb: str = "cannot run"


def _names(codes, values) -> set[int]:
    return {codes[v] for v in values}


def _dp_ranks(t: PlanTable) -> np.ndarray:
    return t.dp * t.cp


def _moe(c) -> bool:
    return c.model.moe is not None


KINDS: dict[str, Kind] = {
    "pp_schedules": Kind(
        lambda t, c, v: (t.pp > 1) & ~np.isin(t.schedule, list(_names(SCHED, v))),
        lambda r, c: f"the {SCHEDULES[r['schedule']]} pipeline schedule"),
    "uneven_stages": Kind(
        lambda t, c, v: (t.pp > 1) & c.stages.uneven & (not v),
        lambda r, c: f"uneven pipeline stages ({c.stages.layout_text[r['_i']]})"),
    "zero_stages": Kind(
        lambda t, c, v: (t.pp == 1) & (_dp_ranks(t) > 1) & ~np.isin(t.zero_stage, v),
        lambda r, c: f"ZeRO-{r['zero_stage']}"),
    "zero_stages_with_pp": Kind(
        lambda t, c, v: (t.pp > 1) & (_dp_ranks(t) > 1) & ~np.isin(t.zero_stage, v),
        lambda r, c: f"ZeRO-{r['zero_stage']} with pipeline parallelism"),
    "zero0_with_cp": Kind(
        lambda t, c, v: (t.zero_stage == 0) & (t.cp > 1) & (not v),
        lambda r, c: "ZeRO-0 (DDP) with context parallelism"),
    "cp": Kind(lambda t, c, v: (t.cp > 1) & (not v), lambda r, c: f"context parallelism (cp = {r['cp']})"),
    "moe": Kind(lambda t, c, v: np.full(len(t), _moe(c) and not v), lambda r, c: f"the MoE layers of {c.model.name}"),
    "moe_dispatch": Kind(
        lambda t, c, v: np.isin(t.moe_dispatch, [DISPATCH[x] for x in DISPATCH if x not in v]) & _moe(c),
        lambda r, c: f"{'capacity' if r['moe_dispatch'] else 'dropless'} MoE dispatch"),
    "moe_dispatcher": Kind(
        lambda t, c, v: np.isin(t.moe_dispatcher, [DISPATCHER[x] for x in DISPATCHER if x not in v]) & _moe(c),
        lambda r, c: f"the {'deepep' if r['moe_dispatcher'] else 'alltoall'} MoE dispatcher"),
    "ep_comm_overlap": Kind(
        lambda t, c, v: t.ep_comm_overlap & (t.ep > 1) & _moe(c) & (
            (v is False) | ((v == "interleaved-16bit-no-full-recompute")
                            & (((t.pp > 1) & (t.vpp == 1)) | (t.recompute == RECOMP["full"]) | (t.dtype == DTYPE["fp32"])))),
        lambda r, c: "EP communication overlap" + _overlap_detail(r)),
    "deepep_capacity": Kind(
        lambda t, c, v: (t.moe_dispatcher == DISPATCHER["deepep"]) & (t.moe_dispatch == DISPATCH["capacity"]) & (not v)
        & _moe(c),
        lambda r, c: "capacity dispatch (padded to capacity) with the DeepEP dispatcher"),
    "etp": Kind(
        lambda t, c, v: _moe(c) & (((v == "tp-or-1") & np.where(t.ep > 1, t.etp != 1, t.etp != t.tp))
                                   | ((v == "tp-or-1-any-ep") & (t.etp != 1) & (t.etp != t.tp))),
        lambda r, c: f"etp = {r['etp']} with ep = {r['ep']} (tp = {r['tp']})"),
    "ep_in_fsdp": Kind(
        lambda t, c, v: (_moe(c) & bool(v)) & (t.ep > 1)
        & (np.where(t.zero_stage >= 2, t.dp, 1) * t.cp * t.tp % (t.ep * np.where(t.ep > 1, 1, t.etp)) != 0),
        lambda r, c: f"ep = {r['ep']} beside dp_shard*cp*tp = "
                     f"{(r['dp'] if r['zero_stage'] >= 2 else 1) * r['cp'] * r['tp']} FSDP x CP x TP ranks"),
    "moe_bias_etp1": Kind(
        lambda t, c, v: (_moe(c) and bool(v) and c.model.linear_bias) & (t.etp > 1),
        lambda r, c: f"etp = {r['etp']} with MoE biases"),
    "fp8": Kind(lambda t, c, v: (t.dtype == DTYPE["fp8"]) & (not v), lambda r, c: "FP8 training"),
    "fp32": Kind(lambda t, c, v: (t.dtype == DTYPE["fp32"]) & (not v), lambda r, c: "fp32 training"),
    "tp_comm_overlap": Kind(
        lambda t, c, v: t.tp_comm_overlap & (t.tp > 1) & ((v == "no") | ((v == "with-sp") & ~t.sequence_parallel)),
        lambda r, c: "TP communication overlap" + ("" if r["sequence_parallel"] else " without sequence parallelism")),
    "sp_off": Kind(
        lambda t, c, v: (t.tp > 1) & ~t.sequence_parallel & (not v),
        lambda r, c: "tensor parallelism without sequence parallelism"),
    "recompute": Kind(
        lambda t, c, v: ~np.isin(t.recompute, list(_names(RECOMP, v))),
        lambda r, c: f"{RECOMPUTE[r['recompute']]} recompute"),
    "partial_recompute": Kind(
        lambda t, c, v: (t.recompute == RECOMP["full"]) & (t.recompute_layers >= 0)
        & ((v == "no") | ((v == "without-pp") & ((t.pp > 1) | (t.recompute_layers == 0)))
           | ((v == "multiple-of-vpp") & ((t.recompute_layers % t.vpp != 0) | (t.recompute_layers == 0)))),
        lambda r, c: f"full recompute of {r['recompute_layers']} layers per stage"
                     + (f" with vpp = {r['vpp']}" if r["vpp"] > 1 else "")),
    "bf16_main_grads": Kind(lambda t, c, v: ~t.main_grads_fp32 & (not v), lambda r, c: "bf16 main gradients"),
    "zero_bubble_rounds": Kind(
        lambda t, c, v: (t.schedule == SCHED["zero-bubble"]) & (t.pp > 1) & bool(v)
        & (t.num_microbatches % np.maximum(t.num_microbatches // t.pp, 1) != 0),
        lambda r, c: f"zero-bubble with {r['_m']} microbatches (not a multiple of microbatches // pp = "
                     f"{max(r['_m'] // r['pp'], 1)})"),
    "attention_variants": Kind(
        lambda t, c, v: np.full(len(t), (not v) and (c.model.mla is not None or c.model.qk_norm
                                                     or (c.model.qkv_bias and not c.model.linear_bias))),
        lambda r, c: f"the attention of {c.model.name} (MLA, QK-norm or QKV-only biases)"),
}


def _overlap_detail(r: dict) -> str:
    if r["pp"] > 1 and r["vpp"] == 1:
        return " with pp > 1 and no interleaving"
    if r["recompute"] == RECOMP["full"]:
        return " with full recompute"
    return " in fp32" if r["dtype"] == DTYPE["fp32"] else ""


def _recipe_kind() -> Kind:
    return Kind(lambda t, c, v: np.full(len(t), c.model.name not in v), lambda r, c: f"recipe for {c.model.name}",
                verb="has no")


@dataclass(frozen=True)
class TrainerRule:
    """One capability line of one trainer as a validity rule (the shape autopar.spec.rules uses)."""

    name: str
    trainer: Trainer
    capability: Capability
    kind: Kind

    def violated(self, table: PlanTable, ctx) -> np.ndarray:
        mine = table.trainer == TRAINER[self.trainer.key]
        if not mine.any():
            return np.zeros(len(table), bool)
        return mine & np.broadcast_to(np.asarray(self.kind.violated(table, ctx, self.capability.value), bool),
                                      (len(table),))

    def explain(self, row: dict, ctx) -> str:
        cap = self.capability
        instead = f"; {cap.instead}" if cap.instead else ""
        return f"{self.trainer.title} {self.kind.verb} {self.kind.needs(row, ctx)} ({cap.source}){instead}"


@cache
def trainer_rules() -> tuple[TrainerRule, ...]:
    """Every capability line of every trainer; rule names are `<trainer>:<kind>`."""
    out = []
    for tr in trainers().values():
        for kind, cap in tr.capabilities.items():
            out.append(TrainerRule(f"{tr.key}:{kind}", tr, cap, KINDS[kind]))
        if tr.recipes is not None:
            out.append(TrainerRule(f"{tr.key}:recipes", tr, tr.recipes, _recipe_kind()))
    return tuple(out)
