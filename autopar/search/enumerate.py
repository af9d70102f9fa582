"""Enumerate every plan of a search space for a model on N GPUs, as one PlanTable (vectorised).

The product of the knob choices is built with numpy index grids, then made canonical so that no
plan appears twice (pp = 1 has one schedule; vpp > 1 means interleaved 1F1B; sequence parallelism
follows tp; expert knobs only for MoE models; layout variants only where they differ). Layouts whose
tp*pp*cp does not divide the GPU count are not plans at all and are not enumerated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.errors import InputError
from autopar.search.space import SearchSpace
from autopar.spec.fp8_recipes import PARAM_GATHER_CODE, default_codes, default_param_gather, param_gather
from autopar.spec.layout import auto_layout, balanced_layout
from autopar.spec.model import ModelSpec
from autopar.spec.offload_modules import lacking_offload
from autopar.spec.plan import FIELDS
from autopar.spec.plan_fields import PlanField
from autopar.spec.question import Question
from autopar.spec.recompute_modules import lacking_modules
from autopar.spec.table import DTYPE, RECOMP, SCHED, TRAINER, PlanTable

DEFAULT_EP_LIMIT = 64
#: most combinations of the outer (or inner) axes held at once: ~150 bytes each while walked, so
#: about 1.5 GB; beyond it the space is refused with one line instead of running out of memory
MAX_COMBINATIONS = 10_000_000


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _int_choices(space: SearchSpace, knob: str, default: list[int]) -> list[int]:
    v = space.knobs.get(knob, default)
    return sorted(set(v))


def ep_choices(space: SearchSpace, model: ModelSpec) -> list[int]:
    if model.moe is None:
        return [1]
    limit = space.constraints.get("ep_within", DEFAULT_EP_LIMIT)
    v = space.knobs.get("ep", "auto")
    if v == "auto":
        return [d for d in divisors(model.moe.num_experts) if d <= limit]
    return sorted(x for x in set(v) if x <= limit)


def space_size(space: SearchSpace, q: "Question") -> int:
    """Upper bound of the number of plans: the product of every axis's choices, before
    canonicalisation (what `run_search` compares with --max-exhaustive)."""
    return int(np.prod([len(v) for v in knob_choices(space, q).values()], dtype=np.float64))


#: the axes that decide whether a row is a plan at all (divisibility, schedules, layouts, expert and
#: TP knobs; `sched_vpp` pairs the schedule with vpp), and the rest, whose every combination is a
#: plan (but recompute layers without full recompute, and EP knobs without EP): every other knob of
#: the plan's declaration (autopar.spec.plan), in its order, the trainer innermost
OUTER = ("tp", "pp", "cp", "sched_vpp", "ep", "etp", "tp_comm_overlap", "sp", "pp_layout")
_IN_OUTER = OUTER + ("vpp", "pp_schedule")  # the knobs the outer axes stand for
INNER = tuple(f.space for f in FIELDS if f.space and f.space not in _IN_OUTER + ("trainer",)) + ("trainer",)
#: the product axes; values are what `knob_choices` returns for each
AXES = OUTER + INNER


def knob_choices(space: SearchSpace, q: Question) -> dict[str, list[Any]]:
    """The choices of every product axis after the space's constraints. `sched_vpp` holds
    (schedule code, vpp) pairs; `etp` 0 stands for "= tp"; `pp_layout` holds layout rule names."""
    model = q.model
    k = space.knobs
    cons = space.constraints
    tp = [t for t in _int_choices(space, "tp", [1]) if not cons.get("tp_within_node") or t <= q.cluster.gpus_per_node]
    sched_vpp = [(SCHED[s], 1) for s in dict.fromkeys(k.get("pp_schedule", ["1f1b"])) if s != "interleaved-1f1b"]
    sched_vpp += [(SCHED["interleaved-1f1b"], v) for v in _int_choices(space, "vpp", [1]) if v > 1]
    etp_raw = k.get("etp", ["tp"]) if model.moe else ["tp"]
    if etp_raw == "auto":  # Megatron's default (= tp) and expert-TP folding (1)
        etp_raw = ["tp", 1]
    sp_knob = k.get("sp", "auto")
    shaped: dict[str, list[Any]] = {
        "tp": [t for t in tp if t <= cons.get("max_tp", t)],
        "pp": [p for p in _int_choices(space, "pp", [1]) if p <= cons.get("max_pp", p)],
        "cp": [c for c in _int_choices(space, "cp", [1]) if c <= cons.get("max_cp", c)],
        "sched_vpp": sched_vpp or [(SCHED["1f1b"], 1)],
        "ep": ep_choices(space, model),
        "etp": sorted({0 if e == "tp" else int(e) for e in etp_raw}),
        "recompute_layers": [-1] + sorted(set(k.get("recompute_layers", []))),
        # hybrid sharding: "all" (-1: shards over the whole dp x cp group) and the listed shard sizes
        "dp_shard": [-1] + sorted({n for n in k.get("dp_shard", ["all"]) if n != "all"}),
        "sp": [True, False] if sp_knob == "auto" else sorted(set(sp_knob)),
        "pp_layout": ["auto"] + [x for x in dict.fromkeys(k.get("pp_layout", ["auto"])) if x != "auto"],
        "trainer": [TRAINER[t] for t in q.trainers if t in k.get("trainer", q.trainers)],
    }
    shaped["recompute_modules"] = _modules_of_the_model(_listed(RECOMPUTE_MODULES_FIELD, k, model), model)
    lacking = lacking_offload(model)  # the expert inputs of a dense model
    shaped["offload_modules"] = [m for m in _listed(OFFLOAD_MODULES_FIELD, k, model) if not m & lacking] or [0]
    return shaped | {f.space: _listed(f, k, model) for f in FIELDS if f.space in AXES and f.space not in shaped}


RECOMPUTE_MODULES_FIELD = next(f for f in FIELDS if f.name == "recompute_modules")
OFFLOAD_MODULES_FIELD = next(f for f in FIELDS if f.name == "offload_modules")


def _modules_of_the_model(masks: list, model: ModelSpec) -> list:
    """The space's recompute-module lists this model has every part of (mla_up_proj needs MLA, ...:
    autopar.spec.recompute_modules.lacking_modules), as the expert knobs only for MoE models; the
    default (0, core_attn) when none is left."""
    lacking = lacking_modules(model)
    return [m for m in masks if not m & lacking] or [0]


def _listed(f: PlanField, knobs: dict, model: ModelSpec) -> list:
    """A knob's choices as the space lists them (as table values: a category by its code), its
    default where the space names none; an MoE-only knob keeps its default on a dense model."""
    if f.moe and model.moe is None:
        return [f.encode(f.default)]
    return sorted({f.encode(v) for v in knobs.get(f.space, [f.default])})


assert set(OUTER) | set(INNER) == set(AXES) and not set(OUTER) & set(INNER)
#: the inner axes `canonical` reads together with outer axes or the trainer (the rules on the others
#: alone already filter the inner combinations: `Enumerator._combinations`)
MIXED_INNER = (
    "zero",
    "dp_shard",
    "dtype",
    "fp8_recipe",
    "fp8_param_gather",
    "moe_dispatcher",
    "ep_comm_overlap",
    "trainer",
)
assert set(MIXED_INNER) <= set(INNER)


class Enumerator:
    """The canonical plans of a space, in chunks, so that a search of any size holds one chunk at a
    time. The knob product is walked as (outer combination, inner combination) pairs over only the
    outer combinations that are plans and the inner ones that can be, so the walk is about as long
    as the plans; every chunk keeps only canonical rows (`canonical`), so the chunks together hold
    each plan once, in the same order as the one-shot enumeration."""

    def __init__(self, space: SearchSpace, q: Question):
        self.space, self.q = space, q
        self.choices = knob_choices(space, q)
        if not all(self.choices.values()):
            raise InputError("the search space is empty after its constraints; widen the knob choices")
        self.layouts, self._layout_index = _layout_registry(q.model, self.choices)
        self.inner = self._combinations(INNER)
        self.outer = self._combinations(OUTER)
        self.total = len(self.outer["tp"]) * len(self.inner["zero"])
        # the trainer is the innermost axis and no rule of the walk reads it, so the inner
        # combinations come in blocks of one per trainer: the folded walk keeps each block's first
        self.trainer_codes = [int(c) for c in self.choices["trainer"]]
        self.folded_inner = {a: v[:: len(self.trainer_codes)] for a, v in self.inner.items()}

    def _combinations(self, axes: tuple[str, ...]) -> dict[str, np.ndarray]:
        """The index combinations of `axes` that pass the rules decidable on them alone."""
        n = int(np.prod([len(self.choices[a]) for a in axes], dtype=np.float64))
        if n > MAX_COMBINATIONS:
            sizes = " x ".join(f"{a} {len(self.choices[a])}" for a in axes if len(self.choices[a]) > 1)
            raise InputError(
                f"the search space is too wide to walk on this machine: {n:,} combinations of "
                f"{sizes} (at most {MAX_COMBINATIONS:,}); shorten the longest knob lists in the space "
                f"file, or pin knobs with flags (--tp, --pp, ...)"
            )
        grids = np.meshgrid(*[np.arange(len(self.choices[a])) for a in axes], indexing="ij")
        values = {a: g.ravel() for a, g in zip(axes, grids)}
        if axes == INNER:
            rl = np.asarray(self.choices["recompute_layers"])[values["recompute_layers"]]
            rc = np.asarray(self.choices["recompute"])[values["recompute"]]
            rm = np.asarray(self.choices["recompute_modules"])[values["recompute_modules"]]
            om = np.asarray(self.choices["offload_modules"])[values["offload_modules"]]
            keep = ((rl < 0) | (rc == RECOMP["full"])) & ((rm == 0) | (rc == RECOMP["selective"]))
            keep &= (om == 0) | (rc != RECOMP["full"])
        else:  # an outer combination some inner one completes into a plan
            keep = np.zeros(len(values["tp"]), bool)
            # outer-only rules first (every inner axis at its first choice is as good as any for them)
            todo = self._keep(values | {a: np.zeros(len(values["tp"]), np.int64) for a in INNER}, outer_only=True)
            for row in self._inner_probes():
                rows = np.flatnonzero(todo & ~keep)
                if not len(rows):
                    break
                probe = {a: v[rows] for a, v in values.items()} | {a: np.full(len(rows), row[a]) for a in INNER}
                keep[rows] = self._keep(probe)
        return {a: v[keep] for a, v in values.items()}

    def _inner_probes(self) -> list[dict[str, int]]:
        """One inner combination per distinct value of the inner axes the rules read together with
        the outer ones or the trainer (`MIXED_INNER`): an outer combination is walked when one of
        them completes it, whichever choice each knob lists first."""
        mixed = np.stack([self.inner[a] for a in MIXED_INNER], axis=1)
        _, first = np.unique(mixed, axis=0, return_index=True)
        return [{a: int(self.inner[a][i]) for a in INNER} for i in np.sort(first)]

    def _keep(self, values: dict[str, np.ndarray], outer_only: bool = False) -> np.ndarray:
        col, sched, vpp, et, layout_id = _columns(self.choices, values, self)
        return canonical(self.space, self.q, self.choices, col, sched, vpp, et, layout_id, outer_only)

    def values(self, start: int, stop: int, inner: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Per-axis choice indices of the walk's rows [start, stop) (of the folded walk with
        `inner=self.folded_inner`)."""
        inner = self.inner if inner is None else inner
        idx = np.arange(start, stop, dtype=np.int64)
        n_inner = len(inner["zero"])
        o, i = idx // n_inner, idx % n_inner
        return {a: v[o] for a, v in self.outer.items()} | {a: v[i] for a, v in inner.items()}

    def chunk(self, start: int, stop: int) -> PlanTable:
        """The plans of the walk's rows [start, stop), with their place in the walk (`plan_index`)."""
        return build_table(self.space, self.q, self.values(start, stop), self.choices, self, index_base=start)

    def chunks(self, size: int):
        """(start, stop, table) for every chunk of `size` rows of the walk."""
        for start in range(0, self.total, size):
            stop = min(start + size, self.total)
            yield start, stop, self.chunk(start, stop)

    def folded_chunks(self, size: int):
        """(start, stop, table) over the walk with the trainer axis folded: each row of a table
        stands for one plan per trainer of `trainer_codes` (its trainer column is the first's), the
        j-th at `plan_index + j` of the full walk; start and stop count full-walk rows. The search
        prices such a row once per performance profile (autopar.calibration.estimate.estimate_per_trainer)."""
        n_trainers = len(self.trainer_codes)
        folded = self.total // n_trainers
        for start in range(0, folded, size):
            stop = min(start + size, folded)
            table = build_table(
                self.space,
                self.q,
                self.values(start, stop, self.folded_inner),
                self.choices,
                self,
                index_base=start,
                index_scale=n_trainers,
            )
            yield start * n_trainers, stop * n_trainers, table

    def require_plans(self) -> "Enumerator":
        """Itself, or one line when the space holds no plan for these GPUs."""
        if self.total == 0:
            raise InputError(
                f"no layout of the search space divides {self.q.num_gpus} GPUs (tp*pp*cp must "
                f"divide the GPU count); change --gpus or widen the space"
            )
        return self

    def layout_id(self, pp: np.ndarray, vpp: np.ndarray, choice: np.ndarray) -> np.ndarray:
        """-1 auto, an index into `layouts`, or -2 for a variant equal to auto or to an earlier one
        (looked up in a dense (pp, vpp, choice) table: one gather per row, not a pass per variant)."""
        out = np.full(len(pp), -1, dtype=np.int64)
        if not self._layout_index:
            return out
        keys = np.array(list(self._layout_index), dtype=np.int64)
        pps, vps = np.unique(keys[:, 0]), np.unique(keys[:, 1])
        ids = np.full((len(pps), len(vps), int(keys[:, 2].max()) + 1), -1, dtype=np.int64)
        ids[np.searchsorted(pps, keys[:, 0]), np.searchsorted(vps, keys[:, 1]), keys[:, 2]] = list(
            self._layout_index.values()
        )
        pp, vpp, choice = (np.asarray(a, dtype=np.int64) for a in (pp, vpp, choice))
        ip = np.minimum(np.searchsorted(pps, pp), len(pps) - 1)
        iv = np.minimum(np.searchsorted(vps, vpp), len(vps) - 1)
        known = (pps[ip] == pp) & (vps[iv] == vpp) & (choice >= 0) & (choice < ids.shape[2])
        out[known] = ids[ip[known], iv[known], choice[known]]
        return out


def _layout_registry(model: ModelSpec, choices: dict[str, list]) -> tuple[list, dict]:
    """Every layout variant of the space, once: (pp, vpp, variant choice) -> id into the list, or -2
    when the variant equals the auto layout or an earlier variant (a duplicate plan)."""
    layouts: list = []
    index: dict = {}
    vpps = sorted({v for _, v in choices["sched_vpp"]})
    for p in choices["pp"]:
        for v in vpps:
            seen = [auto_layout(model.num_layers, p, v).stages]
            for ci, name in enumerate(choices["pp_layout"]):
                if name == "auto":
                    continue
                if p == 1:  # one stage: every variant is the auto layout
                    index[(p, v, ci)] = -2
                    continue
                lay = balanced_layout(
                    model.num_layers,
                    p * v,
                    embedding_as_layer=name == "embedding+loss",
                    loss_as_layer=name == "embedding+loss",
                )
                if lay.stages in seen or min(lay.stages[1:-1] or [1]) <= 0:
                    index[(p, v, ci)] = -2
                    continue
                seen.append(lay.stages)
                layouts.append(lay)
                index[(p, v, ci)] = len(layouts) - 1
    return layouts, index


def canonical(
    space: SearchSpace, q: Question, choices: dict, col: dict, sched, vpp, et, layout_id, outer_only: bool = False
) -> np.ndarray:
    """Rows that are plans, each reached once: tp*pp*cp divides the GPUs; pp = 1 has one schedule
    and no layout variant; recompute layers only with full recompute, recompute modules only with
    selective; a hybrid-sharding size divides dp x cp, is fewer ranks, and needs ZeRO 1-3;
    activation offload not with full recompute (nothing left to offload); an FP8 recipe
    and an FP8 parameter gather only with FP8, and not the trainer's own choice named (that is the
    "default" plan); TP overlap needs TP; EP knobs need EP; SP follows tp (when 'auto'); an explicit
    etp equal to tp is the same plan as etp 'tp'; layout variants differ from the auto layout and
    from each other; expert knobs only for MoE. `outer_only`: the rules that read no inner axis."""
    t, p, c = col["tp"], col["pp"], col["cp"]
    keep = q.num_gpus % (t * p * c) == 0
    keep &= ~((p == 1) & ((sched != SCHED["1f1b"]) | (vpp > 1)))
    keep &= ~((t == 1) & col["tp_comm_overlap"].astype(bool))
    if space.knobs.get("sp", "auto") == "auto":
        keep &= col["sp"].astype(bool) == (t > 1)
    if not q.model.moe:
        keep &= et == t
    elif 0 in choices["etp"]:
        keep &= ~((col["etp"] != 0) & (col["etp"] == t))
    keep &= layout_id >= -1
    if outer_only:
        return keep
    keep &= (col["recompute_layers"] < 0) | (col["recompute"] == RECOMP["full"])
    # a shard size divides the dp x cp ranks and is fewer of them, with ZeRO sharding something
    shard, ranks = col["dp_shard"], q.num_gpus // (t * p * c) * c
    hybrid = (col["zero"] >= 1) & (ranks % np.maximum(shard, 1) == 0) & (shard < ranks)
    keep &= (shard < 0) | hybrid
    keep &= (col["recompute_modules"] == 0) | (col["recompute"] == RECOMP["selective"])
    keep &= (col["offload_modules"] == 0) | (col["recompute"] != RECOMP["full"])  # it keeps layer inputs only
    # an FP8 recipe only with FP8; where the space lists "default" too, the trainer's default recipe
    # named is the "default" plan again (a space that lists only named recipes searches them all)
    keep &= (col["fp8_recipe"] == 0) | (col["dtype"] == DTYPE["fp8"])
    if 0 in choices["fp8_recipe"]:
        named_default = np.where(default_codes() > 0, default_codes(), -1)  # -1: a trainer without FP8
        keep &= col["fp8_recipe"] != named_default[col["trainer"]]
    # FP8 parameter gather likewise: only with FP8, and not the trainer's own choice named
    gather = _Columns(col)
    named = col["fp8_param_gather"] != PARAM_GATHER_CODE["default"]
    keep &= ~named | (col["dtype"] == DTYPE["fp8"])
    if PARAM_GATHER_CODE["default"] in choices["fp8_param_gather"]:
        keep &= ~named | (param_gather(gather) != default_param_gather(gather))
    keep &= ~((col["ep"] == 1) & (col["ep_comm_overlap"].astype(bool) | (col["moe_dispatcher"] != 0)))
    return keep


class _Columns:
    """A walk's columns read as a table's (`t.dtype`, ...), for the spec's per-row functions."""

    def __init__(self, col: dict):
        self.__dict__.update(col)


def build_table(
    space: SearchSpace,
    q: Question,
    values: dict[str, np.ndarray],
    choices: dict[str, list],
    enumerator: "Enumerator | None" = None,
    index_base: int | None = None,
    index_scale: int = 1,
) -> PlanTable:
    """The canonical plans (`canonical`) among per-axis value arrays (indices into `choices`)."""
    enumerator = enumerator or Enumerator(space, q)
    G = q.num_gpus
    col, sched, vpp, et, layout_id = _columns(choices, values, enumerator)
    t, p, c = col["tp"], col["pp"], col["cp"]
    idx = np.flatnonzero(canonical(space, q, choices, col, sched, vpp, et, layout_id))
    cols = {f.column: col[f.space][idx] for f in FIELDS if f.space in col}  # the knobs as searched
    cols |= {
        "dp": G // (t[idx] * p[idx] * c[idx]),
        "etp": et[idx],
        "vpp": vpp[idx],
        "global_batch_size": np.full(len(idx), q.global_batch_size),
        "pp_schedule": sched[idx],
        "layout_id": layout_id[idx],
    }
    table = PlanTable.from_columns(enumerator.layouts, **cols)
    if index_base is not None:
        table.columns["plan_index"] = (index_base + idx) * index_scale
    return table


def _columns(choices: dict, values: dict, enumerator: Enumerator):
    """Choice values of per-axis indices: (columns, schedule, vpp, etp, layout id)."""
    col = {a: np.asarray(choices[a])[values[a]] for a in AXES if a not in ("sched_vpp", "pp_layout")}
    sv = np.asarray(values["sched_vpp"])
    sched = np.array([x[0] for x in choices["sched_vpp"]])[sv]
    vpp = np.array([x[1] for x in choices["sched_vpp"]])[sv]
    et = np.where(col["etp"] == 0, col["tp"], col["etp"])
    return col, sched, vpp, et, enumerator.layout_id(col["pp"], vpp, np.asarray(values["pp_layout"]))


def enumerate_plans(space: SearchSpace, q: Question) -> PlanTable:
    """Every canonical plan of the space, as one table (small spaces, tests; a search streams
    `Enumerator.chunks`)."""
    e = Enumerator(space, q).require_plans()
    return e.chunk(0, e.total)
