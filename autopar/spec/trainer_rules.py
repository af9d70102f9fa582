"""The trainers' capability tables (autopar.spec.trainers) as vectorised validity rules.

One rule per capability kind, evaluated once for a whole table whatever trainers its rows name:
each trainer's value of the kind becomes a lookup by the rows' trainer codes (a flag, a mode, or an
allowed-set matrix), so the cost of the rules does not grow with the number of trainers. A violating
row gets a sentence naming its trainer's limit, the line's source and what to use instead.
`check_rules` runs them with the model rules, so the search never offers a plan its trainer cannot
run; the exporters refuse with the same sentences (autopar.export), so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from autopar.spec.fp8_recipes import (
    PARAM_GATHER_CODE,
    RECIPE_CHOICES,
    RECIPE_CODE,
    default_param_gather,
    param_gather,
    recipe_codes,
)
from autopar.spec.plan_fields import (
    DISPATCH,
    DISPATCHER,
    DTYPE,
    MOE_DISPATCH,
    MOE_DISPATCHERS,
    RECOMP,
    RECOMPUTE,
    SCHED,
    SCHEDULES,
    PlanColumns,
)
from autopar.spec.recompute_modules import modules_mask, parse_modules
from autopar.spec.trainers import ALL_TRAINERS, trainers
from autopar.spec.trainers import KINDS as TABLE_KINDS


@dataclass(frozen=True)
class Values:
    """One kind's value for every trainer, indexed by trainer code (autopar.spec.plan_fields.TRAINER)."""

    kind: str
    values: tuple
    arrays: dict = field(default_factory=dict, compare=False, repr=False)  # lookups built (`_lookup`)

    def flag(self, t: PlanColumns) -> np.ndarray:
        """Per row: the row's trainer has this (boolean) capability."""
        return self._lookup("flag", None)[t.trainer]

    def mode(self, t: PlanColumns, mode) -> np.ndarray:
        """Per row: the row's trainer's value is `mode` (string kinds)."""
        return self._lookup("mode", mode)[t.trainer]

    def allows(self, t: PlanColumns, names: tuple, codes: np.ndarray) -> np.ndarray:
        """Per row: the row's trainer's list admits the row's option (`names[code]`)."""
        return self._lookup("allows", names)[t.trainer, codes]

    def _lookup(self, how: str, arg) -> np.ndarray:
        """The values as an array indexed by trainer code (and option code), built once per question."""
        key = (how, arg)
        if key not in self.arrays:
            v = self.values
            self.arrays[key] = (
                np.array([bool(x) for x in v])
                if how == "flag"
                else np.array([x == arg for x in v])
                if how == "mode"
                else np.array([[n in (x or ()) for n in arg] for x in v])
            )
        return self.arrays[key]


@dataclass(frozen=True)
class Kind:
    """How one capability kind reads a plan: which rows break it, and what they ask for."""

    # the context is autopar.spec.rules.Context (typed Any: rules imports this module)
    violated: Callable[[PlanColumns, Any, Values], np.ndarray]  # (table, context, values) -> mask
    needs: Callable[[dict, Any], str]  # (row, context) -> what the plan asks for
    verb: str = "cannot run"


def _dp_ranks(t: PlanColumns) -> np.ndarray:
    return t.dp * t.cp


def _moe(c) -> bool:
    return c.model.moe is not None


def _overlap_detail(r: dict) -> str:
    if r["pp"] > 1 and r["vpp"] == 1:
        return " with pp > 1 and no interleaving"
    if r["recompute"] == RECOMP["full"]:
        return " with full recompute"
    return " in fp32" if r["dtype"] == DTYPE["fp32"] else ""


def _overlap_needs(r: dict) -> str:
    """What a refused TP overlap lacks, by its trainer's mode: sequence parallelism (Megatron) or
    torch.compile (torchtitan async TP)."""
    mode = trainers()[ALL_TRAINERS[r["trainer"]]].cap("tp_comm_overlap").value
    if mode == "with-sp" and r["tp"] == 1:
        return " without tensor parallelism (at TP 1 there is no sequence parallelism to overlap)"
    if mode == "with-sp" and not r["sequence_parallel"]:
        return " without sequence parallelism"
    return " without torch.compile (--compile)" if mode == "with-compile" and not r["compile"] else ""


def _partial(t: PlanColumns, v: Values) -> np.ndarray:
    partial = (t.recompute == RECOMP["full"]) & (t.recompute_layers >= 0)
    never = v.mode(t, "no")
    without_pp = v.mode(t, "without-pp") & ((t.pp > 1) | (t.recompute_layers == 0))
    per_chunk = v.mode(t, "multiple-of-vpp") & ((t.recompute_layers % t.vpp != 0) | (t.recompute_layers == 0))
    return partial & (never | without_pp | per_chunk)


#: the modules Megatron-Core refuses under FP8 with delayed scaling (transformer_config.py: "Delayed
#: scaling does not support moe_act and layernorm recompute for fp8"); the other recipes take them
_NOT_UNDER_DELAYED_FP8 = modules_mask(("moe_act", "layernorm"))


def _delayed_norm_act(t: PlanColumns) -> np.ndarray:
    """Per row: delayed-scaling FP8 (the plan's recipe or its trainer's default) with moe_act or
    layernorm recomputed."""
    delayed = recipe_codes(t) == RECIPE_CODE["delayed"]
    return delayed & ((t.recompute_modules & _NOT_UNDER_DELAYED_FP8) > 0)


def _modules(t: PlanColumns, v: Values) -> np.ndarray:
    listed = (t.recompute == RECOMP["selective"]) & (t.recompute_modules > 0)
    return listed & (v.mode(t, "no") | (v.mode(t, "megatron-core") & _delayed_norm_act(t)))


def _modules_needed(r: dict) -> str:
    names = ",".join(parse_modules(int(r["recompute_modules"])))
    delayed = bool(_delayed_norm_act(_one_row(r))[0])
    return f"selective recompute of {names}" + (" under FP8 delayed scaling" if delayed else "")


def _one_row(r: dict):
    """A violating row (column -> value) as a table of one row, for a rule's own masks."""
    return type("Row", (), {k: np.asarray([v]) for k, v in r.items() if not k.startswith("_")})


def _fp8_needed(r: dict) -> str:
    """What a refused FP8 plan asks for: FP8 at all, or its recipe."""
    if not trainers()[ALL_TRAINERS[r["trainer"]]].cap("fp8").value:
        return "FP8 training"
    return f"FP8 with the {RECIPE_CHOICES[int(recipe_codes(_one_row(r))[0])]} recipe"


def _param_gather(t: PlanColumns, v: Values) -> np.ndarray:
    """Per row: an FP8 plan whose parameter gather its trainer cannot run as asked: none at all
    ("no"), not the FP8 recipe's ("by-recipe"), or without the distributed optimizer."""
    fp8 = t.dtype == DTYPE["fp8"]
    chosen = t.fp8_param_gather != PARAM_GATHER_CODE["default"]
    on = param_gather(t)
    never = v.mode(t, "no") & on
    fixed = v.mode(t, "by-recipe") & chosen & (on != default_param_gather(t))
    no_dist_opt = v.mode(t, "with-distributed-optimizer") & on & (t.zero_stage == 0)
    return fp8 & (never | fixed | no_dist_opt)


def _param_gather_needed(r: dict) -> str:
    row = _one_row(r)
    on = bool(param_gather(row)[0])
    recipe = RECIPE_CHOICES[int(recipe_codes(row)[0])]
    if trainers()[ALL_TRAINERS[r["trainer"]]].cap("fp8_param_gather").value == "by-recipe":
        return f"FP8 {'with' if on else 'without'} FP8 parameter gather under the {recipe} recipe"
    return "FP8 parameter gather" + (" without the distributed optimizer (ZeRO-0)" if r["zero_stage"] == 0 else "")


def _ep_overlap(t: PlanColumns, v: Values) -> np.ndarray:
    on = t.ep_comm_overlap & (t.ep > 1)
    conditions = ((t.pp > 1) & (t.vpp == 1)) | (t.recompute == RECOMP["full"]) | (t.dtype == DTYPE["fp32"])
    return on & (~v.flag(t) | (v.mode(t, "interleaved-16bit-no-full-recompute") & conditions))


def _etp(t: PlanColumns, v: Values) -> np.ndarray:
    tp_or_1 = v.mode(t, "tp-or-1") & np.where(t.ep > 1, t.etp != 1, t.etp != t.tp)
    any_ep = v.mode(t, "tp-or-1-any-ep") & (t.etp != 1) & (t.etp != t.tp)
    return tp_or_1 | any_ep


def _ep_in_fsdp(t: PlanColumns, v: Values) -> np.ndarray:
    shard = np.where(t.zero_stage >= 2, t.dp, 1) * t.cp * t.tp
    return v.flag(t) & (t.ep > 1) & (shard % (t.ep * np.where(t.ep > 1, 1, t.etp)) != 0)


def _attention_variant(c) -> bool:
    m = c.model
    return m.mla is not None or m.qk_norm or (m.qkv_bias and not m.linear_bias)


KINDS: dict[str, Kind] = {
    "pp_schedules": Kind(
        lambda t, c, v: (t.pp > 1) & ~v.allows(t, SCHEDULES, t.pp_schedule),
        lambda r, c: f"the {SCHEDULES[r['pp_schedule']]} pipeline schedule",
    ),
    "uneven_stages": Kind(
        lambda t, c, v: (t.pp > 1) & c.stages.uneven & ~v.flag(t),
        lambda r, c: f"uneven pipeline stages ({c.stages.layout_text[r['_i']]})",
    ),
    "zero_stages": Kind(
        lambda t, c, v: (t.pp == 1) & (_dp_ranks(t) > 1) & ~v.allows(t, (0, 1, 2, 3), t.zero_stage),
        lambda r, c: f"ZeRO-{r['zero_stage']}",
    ),
    "zero_stages_with_pp": Kind(
        lambda t, c, v: (t.pp > 1) & (_dp_ranks(t) > 1) & ~v.allows(t, (0, 1, 2, 3), t.zero_stage),
        lambda r, c: f"ZeRO-{r['zero_stage']} with pipeline parallelism",
    ),
    "zero0_with_cp": Kind(
        lambda t, c, v: (t.zero_stage == 0) & (t.cp > 1) & ~v.flag(t),
        lambda r, c: "ZeRO-0 (DDP) with context parallelism",
    ),
    "cp": Kind(lambda t, c, v: (t.cp > 1) & ~v.flag(t), lambda r, c: f"context parallelism (cp = {r['cp']})"),
    "moe": Kind(lambda t, c, v: _moe(c) & ~v.flag(t), lambda r, c: f"the MoE layers of {c.model.name}"),
    "moe_dispatch": Kind(
        lambda t, c, v: _moe(c) & ~v.allows(t, MOE_DISPATCH, t.moe_dispatch),
        lambda r, c: f"{MOE_DISPATCH[r['moe_dispatch']]} MoE dispatch",
    ),
    "moe_dispatcher": Kind(
        lambda t, c, v: _moe(c) & ~v.allows(t, MOE_DISPATCHERS, t.moe_dispatcher),
        lambda r, c: f"the {MOE_DISPATCHERS[r['moe_dispatcher']]} MoE dispatcher",
    ),
    "ep_comm_overlap": Kind(
        lambda t, c, v: _moe(c) & _ep_overlap(t, v), lambda r, c: "EP communication overlap" + _overlap_detail(r)
    ),
    "deepep_capacity": Kind(
        lambda t, c, v: (
            _moe(c) & (t.moe_dispatcher == DISPATCHER["deepep"]) & (t.moe_dispatch == DISPATCH["capacity"]) & ~v.flag(t)
        ),
        lambda r, c: "capacity dispatch (padded to capacity) with the DeepEP dispatcher",
    ),
    "etp": Kind(
        lambda t, c, v: _moe(c) & _etp(t, v), lambda r, c: f"etp = {r['etp']} with ep = {r['ep']} (tp = {r['tp']})"
    ),
    "ep_in_fsdp": Kind(
        lambda t, c, v: _moe(c) & _ep_in_fsdp(t, v),
        lambda r, c: (
            f"ep = {r['ep']} beside dp_shard*cp*tp = "
            f"{(r['dp'] if r['zero_stage'] >= 2 else 1) * r['cp'] * r['tp']} FSDP x CP x TP ranks"
        ),
    ),
    "moe_bias_etp1": Kind(
        lambda t, c, v: (_moe(c) and c.model.linear_bias) & v.flag(t) & (t.etp > 1),
        lambda r, c: f"etp = {r['etp']} with MoE biases",
    ),
    "fp8": Kind(
        lambda t, c, v: (t.dtype == DTYPE["fp8"]) & ~v.allows(t, RECIPE_CHOICES, recipe_codes(t)),
        lambda r, c: _fp8_needed(r),
    ),
    "fp8_param_gather": Kind(lambda t, c, v: _param_gather(t, v), lambda r, c: _param_gather_needed(r)),
    "fp32": Kind(lambda t, c, v: (t.dtype == DTYPE["fp32"]) & ~v.flag(t), lambda r, c: "fp32 training"),
    # at TP 1 Megatron turns sequence parallelism off (megatron/training/arguments.py; megatron-core
    # model_parallel_config.py __post_init__ refuses SP without TP) and then refuses the overlap:
    # "with-sp" holds at every TP; a trainer without the overlap refuses it at every TP too
    "tp_comm_overlap": Kind(
        lambda t, c, v: (
            t.tp_comm_overlap
            & (
                v.mode(t, "no")
                | (v.mode(t, "with-sp") & ~(t.sequence_parallel & (t.tp > 1)))
                | (v.mode(t, "with-compile") & (t.tp > 1) & ~t.compile)
            )
        ),
        lambda r, c: "TP communication overlap" + _overlap_needs(r),
    ),
    "compile": Kind(lambda t, c, v: t.compile & ~v.flag(t), lambda r, c: "torch.compile of the model (--compile)"),
    "sp_off": Kind(
        lambda t, c, v: (t.tp > 1) & ~t.sequence_parallel & ~v.flag(t),
        lambda r, c: "tensor parallelism without sequence parallelism",
    ),
    "recompute": Kind(
        lambda t, c, v: ~v.allows(t, RECOMPUTE, t.recompute), lambda r, c: f"{RECOMPUTE[r['recompute']]} recompute"
    ),
    "partial_recompute": Kind(
        lambda t, c, v: _partial(t, v),
        lambda r, c: (
            f"full recompute of {r['recompute_layers']} layers per stage"
            + (f" with vpp = {r['vpp']}" if r["vpp"] > 1 else "")
        ),
    ),
    "bf16_main_grads": Kind(lambda t, c, v: ~t.main_grads_fp32 & ~v.flag(t), lambda r, c: "bf16 main gradients"),
    "hsdp": Kind(
        lambda t, c, v: (t.dp_shard > 0) & (t.dp_shard < t.dp * t.cp) & ~v.allows(t, (0, 1, 2, 3), t.zero_stage),
        lambda r, c: f"hybrid sharding (--dp-shard {r['dp_shard']}) with ZeRO-{r['zero_stage']}",
    ),
    "recompute_modules": Kind(lambda t, c, v: _modules(t, v), lambda r, c: _modules_needed(r)),
    "optimizer_offload": Kind(
        lambda t, c, v: (t.optimizer_offload > 0) & ~v.allows(t, (0, 1, 2, 3), t.zero_stage),
        lambda r, c: f"optimizer offload to host memory with ZeRO-{r['zero_stage']}",
    ),
    "partial_optimizer_offload": Kind(
        lambda t, c, v: (
            (t.optimizer_offload > 0) & (t.optimizer_offload < 1) & ~v.allows(t, (0, 1, 2, 3), t.zero_stage)
        ),
        lambda r, c: f"offloading a share {r['optimizer_offload']:g} of the optimizer with ZeRO-{r['zero_stage']}",
    ),
    "activation_offload": Kind(
        lambda t, c, v: (t.offload_modules > 0) & ~v.flag(t),
        lambda r, c: "fine-grained activation offloading to host memory (--offload-modules)",
    ),
    "zero_bubble_rounds": Kind(
        lambda t, c, v: (
            (t.pp_schedule == SCHED["zero-bubble"])
            & (t.pp > 1)
            & v.flag(t)
            & (t.num_microbatches % np.maximum(t.num_microbatches // t.pp, 1) != 0)
        ),
        lambda r, c: (
            f"zero-bubble with {r['_m']} microbatches (not a multiple of microbatches // pp = "
            f"{max(r['_m'] // r['pp'], 1)})"
        ),
    ),
    "attention_variants": Kind(
        lambda t, c, v: _attention_variant(c) & ~v.flag(t),
        lambda r, c: f"the attention of {c.model.name} (MLA, QK-norm or QKV-only biases)",
    ),
    "recipes": Kind(
        lambda t, c, v: np.array(
            [r is not None and c.model.name not in r and n not in c.recipes for n, r in zip(ALL_TRAINERS, v.values)]
        )[t.trainer],
        lambda r, c: f"recipe for {c.model.name}",
        verb="has no",
    ),
}


@dataclass(frozen=True)
class TrainerRule:
    """One capability kind over every trainer, in the shape autopar.spec.rules uses (`name`,
    `violated`, `explain`)."""

    name: str
    kind: str
    rule: Kind
    values: Values

    def violated(self, table: PlanColumns, ctx) -> np.ndarray:
        return np.broadcast_to(np.asarray(self.rule.violated(table, ctx, self.values), bool), (len(table),))

    def explain(self, row: dict, ctx) -> str:
        tr = trainers()[ALL_TRAINERS[row["trainer"]]]
        cap = tr.recipes if self.kind == "recipes" else tr.cap(self.kind)
        assert cap is not None, "a rule's kind is a capability every trainer lists"
        instead = f"; {cap.instead}" if cap.instead else ""
        return f"{tr.title} {self.rule.verb} {self.rule.needs(row, ctx)} ({cap.source}){instead}"

    def label(self, trainer_code: int) -> str:
        """The short reason of a row of this trainer, e.g. 'deepspeed:cp'."""
        return f"{ALL_TRAINERS[trainer_code]}:{self.kind}"


@cache
def trainer_rules() -> tuple[TrainerRule, ...]:
    """One rule per capability kind (and the recipes line); rule names are `trainer:<kind>`."""
    table = trainers()
    out = []
    for kind in TABLE_KINDS + ("recipes",):
        if kind == "recipes":
            values = tuple(r.value if (r := table[t].recipes) else None for t in ALL_TRAINERS)
        else:
            values = tuple(table[t].cap(kind).value for t in ALL_TRAINERS)
        out.append(TrainerRule(f"trainer:{kind}", kind, KINDS[kind], Values(kind, values)))
    return tuple(out)
