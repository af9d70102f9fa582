"""What a plan field is, and the columns many plans are kept in.

The fields themselves are declared once, in `autopar.spec.plan.ParallelPlan`: each is a dataclass
field made by `knob(default, kind, ...)`, whose `PlanField` metadata says everything the other
modules derive from it (`plan_fields(ParallelPlan)`): the kind of its values (an integer, a switch,
a number, one of named choices stored as its index, or the pipeline layout), the table column and
how a value is stored there, whether it belongs to the layout key and to the plan key, whether the
search results show it, its plan flag and its search-space knob. The PlanTable columns and dtypes,
the search results' columns and plans.parquet, the plan flags, the search axes, the view every
exporter reproduces and the decoding of a row back into a plan all follow from these.

`PlanColumns` is a table of plans as numpy columns (autopar.spec.table.PlanTable adds the plan
conversions): what the validity rules and the cost model read, so they need not know the plan class
(autopar.spec.rules checks a single plan on a table of one row).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from types import SimpleNamespace
from typing import Self

import numpy as np

from autopar.spec.layout import PipelineLayout
from autopar.spec.offload_modules import offload_mask, parse_offload_modules
from autopar.spec.recompute_modules import DEFAULT_SELECTIVE, modules_mask, parse_modules
from autopar.spec.trainers import ALL_TRAINERS

#: the kinds of plan fields, by how their values are stored in a table; MODULES: a set of
#: recompute-module names (autopar.spec.recompute_modules), OFFLOAD: of offload-module names
#: (autopar.spec.offload_modules), each a bitmask in the table, None = 0
INT, BOOL, FLOAT, CATEGORY, LAYOUT = "int", "bool", "float", "category", "layout"
MODULES, OFFLOAD = "modules", "offload"

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
MOE_DISPATCH = ("dropless", "capacity")  # every routed token computed / tokens past capacity dropped
#: MoE token dispatcher: NCCL all-to-all, or DeepEP / HybridEP fused kernels (Megatron-Core
#: --moe-token-dispatcher-type alltoall | flex), which send each token once per destination node
MOE_DISPATCHERS = ("alltoall", "deepep")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bf16", "fp8", "fp32")  # fp32: full-precision training (CPU trials)
ZERO_STAGES = (0, 1, 2, 3)
#: how a search space splits the stages of a pipeline (autopar.search.enumerate)
LAYOUT_RULES = ("auto", "balanced", "embedding+loss")


def codes(names: tuple) -> dict:
    """The integer code of each name of a categorical field (its index)."""
    return {name: i for i, name in enumerate(names)}


SCHED, RECOMP, DTYPE = codes(SCHEDULES), codes(RECOMPUTE), codes(DTYPES)
TRAINER, DISPATCH, DISPATCHER = codes(ALL_TRAINERS), codes(MOE_DISPATCH), codes(MOE_DISPATCHERS)


@dataclass(frozen=True)
class Flag:
    """A plan flag (autopar.spec.resolve.PlanRequest, autopar.cli.plan_flags): `--<name>` with
    dashes, `--<name>/--no-<name>` for a switch."""

    name: str
    help: str
    type: type | None = None  # the flag's value type where it is not the field's
    choices: tuple = ()  # the flag's names where it is not the field's (grads: fp32 | bf16)


@dataclass(frozen=True)
class PlanField:
    """A field of the plan, as `knob` declares it; `name` and `default` come from the dataclass
    field (`plan_fields`)."""

    kind: str
    choices: tuple = ()  # CATEGORY: the names its codes 0, 1, ... stand for; LAYOUT: LAYOUT_RULES
    #: its place in the layout key (what a layout is: the process grid and the pipeline's shape)
    layout_key: int | None = None
    plan_key: bool = True  # part of what makes a plan what it is (PLAN_KEY); the trainer is not
    shown: bool = True  # a column of the search results (their frame and plans.parquet)
    view: bool = True  # what every exporter must reproduce of it (autopar.export.view)
    moe: bool = False  # only mixture-of-experts models have it: a dense model keeps the default
    none: object = None  # the column value that stands for None (-1 layers, capacity factor 1.0)
    #: the value when none is given, from the plan's other fields (works on one plan or a table,
    #: categories as codes): etp = tp, ...
    follows: Callable | None = None
    only_if: tuple | None = None  # (field, name): None unless that field has that value
    flag: Flag | None = None
    space: str | None = None  # the search-space knob (autopar.search.space), None = not searched
    column_name: str | None = None  # the table column, when not the field's name
    name: str = ""
    default: object = None

    @property
    def column(self) -> str:
        return self.column_name or self.name

    @property
    def cli(self) -> Flag:
        """The field's flag, for a field that has one (autopar.spec.resolve.FLAGGED)."""
        if self.flag is None:
            raise ValueError(f"the plan field {self.name} has no flag")
        return self.flag

    @property
    def dtype(self) -> type:
        return bool if self.kind == BOOL else float if self.kind == FLOAT else np.int64

    @property
    def code_names(self) -> dict:
        return codes(self.choices)

    def encode(self, value):
        """A plan's value as its table column holds it (LAYOUT: by the table's layout list)."""
        if value is None and self.none is not None:
            return self.none
        if self.kind == CATEGORY:
            return self.code_names[value]
        if self.kind == MODULES:  # Megatron's default list (core_attn alone) is None, as the plan holds it
            names = () if value is None else parse_modules(value)
            return 0 if names == DEFAULT_SELECTIVE else modules_mask(names)
        if self.kind == OFFLOAD:
            return 0 if value is None else offload_mask(parse_offload_modules(value))
        return bool(value) if self.kind == BOOL else value

    def decode(self, value):
        """A column's value (a category as its code, or as its name in a results frame) as the plan
        holds it."""
        if self.kind == CATEGORY:
            return value if isinstance(value, str) else self.choices[int(value)]
        if self.kind == BOOL:
            return bool(value)
        if self.kind == FLOAT:
            return float(value)
        if self.kind == MODULES:
            return parse_modules(int(value)) or None
        if self.kind == OFFLOAD:
            return parse_offload_modules(int(value)) or None
        value = int(value)
        return None if self.none is not None and value == self.none else value


def knob(default, kind: str, choices: tuple = (), **meta):
    """A plan field: a dataclass field whose metadata is its PlanField."""
    return field(default=default, metadata={"plan": PlanField(kind, choices, **meta)})


def plan_fields(plan_class: type) -> tuple[PlanField, ...]:
    """The fields of a plan class, in declaration order."""
    return _plan_fields(plan_class)


@cache
def _plan_fields(plan_class: type) -> tuple[PlanField, ...]:
    return tuple(replace(f.metadata["plan"], name=f.name, default=f.default) for f in fields(plan_class))


def fill_followers(plan, specs: tuple[PlanField, ...]) -> dict:
    """The values a plan's fields take when none is given: `follows`, or the stored value of a field
    that holds only when another does (`only_if`)."""
    out = {}
    for f in specs:
        if getattr(plan, f.name) is not None:
            continue
        if f.follows is not None:
            v = f.follows(plan)
            out[f.name] = f.choices[int(v)] if f.kind == CATEGORY else v
        elif f.only_if is not None and getattr(plan, f.only_if[0]) == f.only_if[1]:
            out[f.name] = f.none
    return out


#: old names of table columns, still read (the cost model's `table.schedule`)
COLUMN_ALIASES = {"schedule": "pp_schedule"}


class Columns(dict):
    """A table's columns by name; an old name (COLUMN_ALIASES) reads its column."""

    def __missing__(self, key):
        if key in COLUMN_ALIASES:
            return self[COLUMN_ALIASES[key]]
        raise KeyError(key)


def table_columns(specs: tuple[PlanField, ...]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The integer (codes and the layout id included), boolean and float columns of a table."""
    ints = tuple(f.column for f in specs if f.kind in (INT, CATEGORY, LAYOUT, MODULES, OFFLOAD))
    return ints, tuple(f.column for f in specs if f.kind == BOOL), tuple(f.column for f in specs if f.kind == FLOAT)


@dataclass
class PlanColumns:
    """Plans as columns of equal length. `recompute_layers` -1 = all layers; `layout_id` -1 = auto
    layout, otherwise an index into `layouts`."""

    columns: dict[str, np.ndarray]
    layouts: list[PipelineLayout] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.columns, Columns):
            self.columns = Columns({COLUMN_ALIASES.get(k, k): v for k, v in self.columns.items()})

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["columns"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch_size // np.maximum(self.micro_batch_size * self.dp, 1)

    @property
    def num_gpus(self) -> np.ndarray:
        return self.tp * self.pp * self.cp * self.dp

    @classmethod
    def build(cls, specs: tuple[PlanField, ...], layouts: list | None, cols: Mapping) -> Self:
        """From arrays (or one value each); a missing column takes the plan's default, or the value
        it follows from the others (etp = tp, ...)."""
        cols = {COLUMN_ALIASES.get(k, k): v for k, v in cols.items()}
        n = len(next(iter(cols.values())))
        out: dict[str, np.ndarray] = {}
        for f in specs:
            if f.column in cols or f.follows is None:
                v = cols[f.column] if f.column in cols else (-1 if f.kind == LAYOUT else f.encode(f.default))
                out[f.column] = np.broadcast_to(np.asarray(v, dtype=f.dtype), (n,)).copy()
        given = SimpleNamespace(**out)
        for f in specs:
            if f.column not in out and f.follows is not None:
                out[f.column] = np.broadcast_to(np.asarray(f.follows(given), dtype=f.dtype), (n,)).copy()
        ints, bools, floats = table_columns(specs)
        return cls({c: out[c] for c in ints + bools + floats}, layouts if layouts is not None else [])

    @classmethod
    def of_plans(cls, plans: list, specs: tuple[PlanField, ...]) -> Self:
        """Plans (of the class whose fields `specs` are) as a table, a layout list entry per plan
        that names its layout."""
        layouts: list[PipelineLayout] = []
        cols: dict[str, list] = {f.column: [] for f in specs}
        for p in plans:
            for f in specs:
                v = getattr(p, f.name)
                if f.kind == LAYOUT:
                    if v is not None:
                        layouts.append(v)
                    v = -1 if v is None else len(layouts) - 1
                else:
                    v = f.encode(v)
                cols[f.column].append(v)
        return cls.build(specs, layouts, cols)

    def take(self, idx: np.ndarray) -> Self:
        return type(self)({k: v[idx] for k, v in self.columns.items()}, self.layouts)

    def with_columns(self, **columns) -> Self:
        """The same plans with some columns replaced (arrays, or one value for every row)."""
        n = len(self)
        new = {
            COLUMN_ALIASES.get(k, k): np.broadcast_to(np.asarray(v, dtype=self.columns[k].dtype), (n,))
            for k, v in columns.items()
        }
        return type(self)(self.columns | new, self.layouts)


#: the fields a plan's short name shows (`plan_names`)
NAME_FIELDS = ("tp", "cp", "pp", "vpp", "dp", "ep", "etp")


def plan_names(cols: Mapping) -> np.ndarray:
    """Short layout names, e.g. tp8.pp4.v2.dp8 (axes of size 1 omitted but dp; etp where it is not
    tp; hsdpN where ZeRO shards span N of the data-parallel ranks), of every row of a mapping of
    columns (a results frame, a table's columns)."""
    c = {a: np.asarray(cols[a]) for a in NAME_FIELDS}

    def part(col, prefix, always=False):
        v = c[col].astype(str)
        keep = c[col] > 1 if not always else np.ones(len(v), bool)
        return np.where(keep, prefix + v.astype(object) + ".", "")

    name = part("tp", "tp") + part("cp", "cp") + part("pp", "pp") + part("vpp", "v") + part("dp", "dp", True)
    name = name + part("ep", "ep")
    name = np.where(c["etp"] != c["tp"], name + "etp" + c["etp"].astype(str).astype(object) + ".", name)
    if "dp_shard" in cols:  # hybrid sharding: shard groups of n ranks, replicated across them
        shard = np.asarray(cols["dp_shard"], dtype=float)  # None (a plan's) and -1 (a table's): none
        hsdp = np.nan_to_num(shard, nan=-1.0) > 0
        sizes = np.where(hsdp, shard, 0).astype(np.int64).astype(str).astype(object)
        name = np.where(hsdp, name + "hsdp" + sizes + ".", name)
    return np.char.rstrip(name.astype(str), ".")
