"""PlanTable: many plans as numpy columns, so that the rules and the cost model evaluate a whole
search space in one vectorised pass. A single plan is a table of one row: the scalar `estimate` and
the search run the very same code."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar.spec.layout import PipelineLayout
from autopar.spec.plan import DTYPES, MOE_DISPATCH, MOE_DISPATCHERS, RECOMPUTE, SCHEDULES, ParallelPlan
from autopar.spec.trainers import ALL_TRAINERS

INT_COLUMNS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "etp",
    "vpp",
    "zero_stage",
    "micro_batch_size",
    "global_batch_size",
    "schedule",
    "recompute",
    "recompute_layers",
    "dtype",
    "layout_id",
    "trainer",
    "moe_dispatch",
    "moe_dispatcher",
)
BOOL_COLUMNS = ("sequence_parallel", "main_grads_fp32", "tp_comm_overlap", "ep_comm_overlap")
FLOAT_COLUMNS = ("capacity_factor",)

# integer codes of the categorical columns
SCHED = {name: i for i, name in enumerate(SCHEDULES)}
RECOMP = {name: i for i, name in enumerate(RECOMPUTE)}
DTYPE = {name: i for i, name in enumerate(DTYPES)}
TRAINER = {name: i for i, name in enumerate(ALL_TRAINERS)}
DISPATCH = {name: i for i, name in enumerate(MOE_DISPATCH)}
DISPATCHER = {name: i for i, name in enumerate(MOE_DISPATCHERS)}


@dataclass
class PlanTable:
    """Columns of equal length. `recompute_layers` -1 = all layers; `layout_id` -1 = auto layout,
    otherwise an index into `layouts`."""

    columns: dict[str, np.ndarray]
    layouts: list[PipelineLayout] = field(default_factory=list)

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
    def from_columns(cls, layouts: list[PipelineLayout] | None = None, **cols) -> "PlanTable":
        """Build from arrays (the search's enumeration); missing columns take plan defaults."""
        n = len(next(iter(cols.values())))
        defaults = {
            "cp": 1,
            "ep": 1,
            "vpp": 1,
            "zero_stage": 1,
            "micro_batch_size": 1,
            "recompute_layers": -1,
            "dtype": DTYPE["bf16"],
            "layout_id": -1,
            "main_grads_fp32": True,
            "recompute": RECOMP["none"],
            "tp_comm_overlap": False,
            "trainer": TRAINER["megatron"],
            "moe_dispatch": DISPATCH["dropless"],
            "capacity_factor": 1.0,
            "moe_dispatcher": DISPATCHER["alltoall"],
            "ep_comm_overlap": False,
        }
        out = {}
        for name in INT_COLUMNS + BOOL_COLUMNS + FLOAT_COLUMNS:
            if name in cols:
                v = np.asarray(cols[name])
            elif name == "etp":
                v = np.asarray(cols["tp"])
            elif name == "sequence_parallel":
                v = np.asarray(cols["tp"]) > 1
            elif name == "schedule":
                v = np.where(np.asarray(cols.get("vpp", 1)) > 1, SCHED["interleaved-1f1b"], SCHED["1f1b"])
            else:
                v = defaults[name]
            dtype = bool if name in BOOL_COLUMNS else float if name in FLOAT_COLUMNS else np.int64
            out[name] = np.broadcast_to(np.asarray(v, dtype=dtype), (n,)).copy()
        return cls(out, layouts if layouts is not None else [])

    @classmethod
    def from_plans(cls, plans: list[ParallelPlan]) -> "PlanTable":
        layouts: list[PipelineLayout] = []
        layout_ids = []
        for p in plans:
            if p.layout is None:
                layout_ids.append(-1)
            else:
                layouts.append(p.layout)
                layout_ids.append(len(layouts) - 1)
        cols = {
            "tp": [p.tp for p in plans],
            "pp": [p.pp for p in plans],
            "dp": [p.dp for p in plans],
            "cp": [p.cp for p in plans],
            "ep": [p.ep for p in plans],
            "etp": [p.etp for p in plans],
            "vpp": [p.vpp for p in plans],
            "zero_stage": [p.zero_stage for p in plans],
            "micro_batch_size": [p.micro_batch_size for p in plans],
            "global_batch_size": [p.global_batch_size for p in plans],
            "schedule": [SCHED[p.pp_schedule] for p in plans],
            "recompute": [RECOMP[p.recompute] for p in plans],
            "recompute_layers": [-1 if p.recompute_layers is None else p.recompute_layers for p in plans],
            "dtype": [DTYPE[p.dtype] for p in plans],
            "layout_id": layout_ids,
            "sequence_parallel": [bool(p.sequence_parallel) for p in plans],
            "main_grads_fp32": [p.main_grads_fp32 for p in plans],
            "tp_comm_overlap": [p.tp_comm_overlap for p in plans],
            "trainer": [TRAINER[p.trainer] for p in plans],
            "moe_dispatch": [DISPATCH[p.moe_dispatch] for p in plans],
            "capacity_factor": [p.capacity_factor or 1.0 for p in plans],
            "moe_dispatcher": [DISPATCHER[p.moe_dispatcher] for p in plans],
            "ep_comm_overlap": [p.ep_comm_overlap for p in plans],
        }
        return cls.from_columns(layouts, **cols)

    def plan(self, i: int) -> ParallelPlan:
        """Row i as a ParallelPlan."""
        c = {k: v[i] for k, v in self.columns.items()}
        lid = int(c["layout_id"])
        return ParallelPlan(
            tp=int(c["tp"]),
            pp=int(c["pp"]),
            dp=int(c["dp"]),
            cp=int(c["cp"]),
            ep=int(c["ep"]),
            etp=int(c["etp"]),
            vpp=int(c["vpp"]),
            zero_stage=int(c["zero_stage"]),
            sequence_parallel=bool(c["sequence_parallel"]),
            micro_batch_size=int(c["micro_batch_size"]),
            global_batch_size=int(c["global_batch_size"]),
            pp_schedule=SCHEDULES[int(c["schedule"])],
            recompute=RECOMPUTE[int(c["recompute"])],
            recompute_layers=None if c["recompute_layers"] < 0 else int(c["recompute_layers"]),
            dtype=DTYPES[int(c["dtype"])],
            main_grads_fp32=bool(c["main_grads_fp32"]),
            tp_comm_overlap=bool(c["tp_comm_overlap"]),
            layout=None if lid < 0 else self.layouts[lid],
            trainer=ALL_TRAINERS[int(c["trainer"])],
            moe_dispatch=MOE_DISPATCH[int(c["moe_dispatch"])],
            capacity_factor=float(c["capacity_factor"]) if MOE_DISPATCH[int(c["moe_dispatch"])] == "capacity" else None,
            moe_dispatcher=MOE_DISPATCHERS[int(c["moe_dispatcher"])],
            ep_comm_overlap=bool(c["ep_comm_overlap"]),
        )

    def take(self, idx: np.ndarray) -> "PlanTable":
        return PlanTable({k: v[idx] for k, v in self.columns.items()}, self.layouts)

    def with_columns(self, **columns) -> "PlanTable":
        """The same plans with some columns replaced (arrays, or one value for every row)."""
        n = len(self)
        new = {k: np.broadcast_to(np.asarray(v, dtype=self.columns[k].dtype), (n,)) for k, v in columns.items()}
        return PlanTable(self.columns | new, self.layouts)
