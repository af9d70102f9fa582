"""The parallel plan: a frozen value object that validates itself and explains every rejection.

Rank order (shared by the cost model's link placement and the built-in model's device mesh):
`MESH_ORDER = ("pp", "dp", "cp", "tp")`, outermost first, so tp is innermost (consecutive ranks,
inside one node), then cp, then dp, with pp outermost. This is Megatron-Core's default order
(tp-cp-ep-dp-pp, innermost first).

Expert parallelism is carved out of the same ranks, as Megatron-Core does: inside one pipeline stage
the tp*cp*dp ranks are re-viewed as `EXPERT_MESH_ORDER = ("pp", "edp", "ep", "etp")`: etp innermost
(expert tensor parallel, default = tp), then ep, then the expert data-parallel rest
edp = tp*cp*dp / (ep*etp). So an EP group takes ep ranks at stride etp: with etp = tp it spans
dp x cp ranks; with etp = 1 ("expert-TP folding") it folds the tp ranks into EP.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from autopar.errors import InputError
from autopar.spec.layout import PipelineLayout
from autopar.spec.trainers import ALL_TRAINERS

MESH_ORDER = ("pp", "dp", "cp", "tp")
EXPERT_MESH_ORDER = ("pp", "edp", "ep", "etp")

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
MOE_DISPATCH = ("dropless", "capacity")  # every routed token computed / tokens past capacity dropped
#: MoE token dispatcher: NCCL all-to-all, or DeepEP / HybridEP fused kernels (Megatron-Core
#: --moe-token-dispatcher-type alltoall | flex), which send each token once per destination node
MOE_DISPATCHERS = ("alltoall", "deepep")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bf16", "fp8", "fp32")  # fp32: full-precision training (CPU trials)
ZERO_STAGES = (0, 1, 2, 3)

_POSITIVE = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "global_batch_size")


class PlanError(InputError):
    """A plan that is malformed in itself (not merely infeasible for a model)."""


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallel; None = tp (Megatron's default)
    vpp: int = 1  # virtual pipeline stages per pp rank
    zero_stage: int = 1  # 0 DDP, 1 distributed optimizer, 2 + sharded grads, 3 FSDP
    sequence_parallel: bool | None = None  # None = on whenever tp > 1
    micro_batch_size: int = 1
    global_batch_size: int = 1
    pp_schedule: str | None = None  # None = 1f1b, or interleaved-1f1b when vpp > 1
    recompute: str = "none"
    recompute_layers: int | None = None  # full recompute: layers per stage recomputed; None = all
    dtype: str = "bf16"
    main_grads_fp32: bool = True  # Megatron's fp32 main grads (18 B/param); False = bf16 gradients (16 B/param)
    tp_comm_overlap: bool = False  # overlap TP collectives with GEMMs (Megatron --tp-comm-overlap)
    layout: PipelineLayout | None = field(default=None)  # None = auto (see layout.auto_layout)
    trainer: str = "megatron"  # which program runs the plan (autopar.spec.trainers)
    moe_dispatch: str = "dropless"  # MoE token dispatch: dropless or capacity (drop past the capacity factor)
    capacity_factor: float | None = None  # capacity dispatch: expert capacity / mean load; None = 1.0
    moe_dispatcher: str = "alltoall"  # alltoall (NCCL) | deepep (DeepEP/HybridEP kernels)
    ep_comm_overlap: bool = False  # overlap the EP all-to-alls with another microbatch's compute

    def __post_init__(self) -> None:
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)
        if self.pp_schedule is None:
            object.__setattr__(self, "pp_schedule", "interleaved-1f1b" if self.vpp > 1 else "1f1b")
        if self.capacity_factor is None and self.moe_dispatch == "capacity":
            object.__setattr__(self, "capacity_factor", 1.0)
        problems = self.intrinsic_problems()
        if problems:
            raise PlanError("invalid plan: " + "; ".join(problems))

    def intrinsic_problems(self) -> list[str]:
        """Problems of the plan on its own, before any model or cluster is known."""
        out = []
        for name in _POSITIVE + ("etp",):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                out.append(f"{name} must be a positive integer, got {v!r}")
        if self.zero_stage not in ZERO_STAGES:
            out.append(f"zero stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.pp_schedule not in SCHEDULES:
            out.append(f"pp schedule must be one of {', '.join(SCHEDULES)}, got '{self.pp_schedule}'")
        if self.recompute not in RECOMPUTE:
            out.append(f"recompute must be one of {', '.join(RECOMPUTE)}, got '{self.recompute}'")
        if self.dtype not in DTYPES:
            out.append(f"dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        if self.trainer not in ALL_TRAINERS:
            out.append(f"trainer must be one of {', '.join(ALL_TRAINERS)}, got '{self.trainer}'")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            out.append(f"MoE dispatcher must be alltoall or deepep, got '{self.moe_dispatcher}'")
        if self.moe_dispatch not in MOE_DISPATCH:
            out.append(f"MoE dispatch must be dropless or capacity, got '{self.moe_dispatch}'")
        if self.capacity_factor is not None:
            cf = self.capacity_factor
            if self.moe_dispatch != "capacity":
                out.append("a capacity factor needs --moe-dispatch capacity (dropless dispatch drops no token)")
            elif isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf >= 1.0 or cf > 64:
                out.append(f"capacity factor must be a number from 1 to 64 (expert capacity / mean load), got {cf!r}")
        if self.recompute_layers is not None:
            if self.recompute != "full":
                out.append("recompute layers need --recompute full")
            elif not isinstance(self.recompute_layers, int) or self.recompute_layers < 0:
                out.append(f"recompute layers must be a non-negative integer, got {self.recompute_layers!r}")
        return out

    # ---- derived ------------------------------------------------------------------------------

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step per pipeline (Megatron num_microbatches_calculator.py)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size: the tp*cp*dp ranks of a stage left after ep*etp."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.etp))

    def problems(self, model, num_gpus: int | None = None, cluster=None, seq_len: int | None = None) -> list[str]:
        """Every rule this plan breaks for the model (and GPU count / cluster), as sentences.
        The rules are the vectorised ones the search applies (autopar.spec.rules)."""
        from autopar.spec.rules import plan_problems

        return plan_problems(self, model, num_gpus=num_gpus, cluster=cluster, seq_len=seq_len)

    def resolved_layout(self, num_layers: int) -> PipelineLayout:
        from autopar.spec.layout import auto_layout

        return self.layout if self.layout is not None else auto_layout(num_layers, self.pp, self.vpp)

    def with_(self, **changes) -> "ParallelPlan":
        return replace(self, **changes)

    def describe(self) -> str:
        """Short layout string, e.g. tp8.pp4.dp8 (axes of size 1 omitted)."""
        parts = [f"{a}{getattr(self, a)}" for a in ("tp", "cp", "pp", "dp") if getattr(self, a) > 1 or a == "dp"]
        if self.vpp > 1:
            parts.insert(parts.index(f"pp{self.pp}") + 1, f"v{self.vpp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        return ".".join(parts)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layout"] = list(self.layout.stages) if self.layout else None
        out["num_microbatches"] = self.num_microbatches
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ParallelPlan":
        data = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        if data.get("layout") is not None and not isinstance(data["layout"], PipelineLayout):
            data["layout"] = PipelineLayout(tuple(data["layout"]), "explicit")
        return cls(**data)
