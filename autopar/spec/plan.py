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

The plan's fields are declared here once, each with what the rest of autopar derives from it
(autopar.spec.plan_fields: its kind, default, table column, plan flag, search knob, whether it is
part of the layout key and the plan key, whether the search results show it). Adding a knob is one
`knob(...)` line below, and the cost term that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache

import numpy as np

from autopar.errors import InputError
from autopar.figures import NUM_MICROBATCHES
from autopar.spec.fp8_recipes import FP8_RECIPES, PARAM_GATHER, RECIPE_CHOICES, param_gather_used, recipe_name
from autopar.spec.layout import PipelineLayout, auto_layout
from autopar.spec.offload_modules import OFFLOAD_MODULES, OffloadModulesError, parse_offload_modules
from autopar.spec.plan_fields import (
    BOOL,
    CATEGORY,
    DTYPES,
    FLOAT,
    INT,
    LAYOUT,
    LAYOUT_RULES,
    MODULES,
    MOE_DISPATCH,
    MOE_DISPATCHERS,
    NAME_FIELDS,
    OFFLOAD,
    RECOMPUTE,
    SCHED,
    SCHEDULES,
    ZERO_STAGES,
    Flag,
    fill_followers,
    knob,
    plan_fields,
    plan_names,
)
from autopar.spec.recompute_modules import DEFAULT_SELECTIVE, RECOMPUTE_MODULES, ModulesError, parse_modules
from autopar.spec.rules import plan_problems
from autopar.spec.trainers import ALL_TRAINERS, TRAINERS

MESH_ORDER = ("pp", "dp", "cp", "tp")
EXPERT_MESH_ORDER = ("pp", "edp", "ep", "etp")

_POSITIVE = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size", "global_batch_size")
#: the values the plan flags take for the main-gradient dtype (main_grads_fp32)
GRADS = ("fp32", "bf16")


class PlanError(InputError):
    """A plan that is malformed in itself (not merely infeasible for a model)."""


def _schedule(p):
    """The default schedule: 1F1B, or interleaved 1F1B when vpp > 1 (codes, for a plan or a table)."""
    return np.where(p.vpp > 1, SCHED["interleaved-1f1b"], SCHED["1f1b"])


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    tp: int = knob(1, INT, layout_key=0, space="tp", flag=Flag("tp", "Tensor-parallel size (default 1)."))
    pp: int = knob(1, INT, layout_key=1, space="pp", flag=Flag("pp", "Pipeline-parallel size (default 1)."))
    dp: int = knob(1, INT, layout_key=4, flag=Flag("dp", "Data-parallel size (default: gpus / (tp*pp*cp))."))
    cp: int = knob(1, INT, layout_key=3, space="cp", flag=Flag("cp", "Context-parallel size (default 1)."))
    ep: int = knob(
        1,
        INT,
        layout_key=5,
        space="ep",
        flag=Flag("ep", "Expert-parallel size, carved out of the dp x cp (x tp) ranks (default 1)."),
    )
    #: expert tensor parallel; None = tp (Megatron's default)
    etp: int | None = knob(
        None,
        INT,
        layout_key=6,
        follows=lambda p: p.tp,
        space="etp",
        flag=Flag("etp", "Expert tensor-parallel size (default: tp)."),
    )
    #: virtual pipeline stages per pp rank
    vpp: int = knob(
        1,
        INT,
        layout_key=2,
        space="vpp",
        flag=Flag("vpp", "Virtual pipeline stages per pp rank: interleaved 1F1B (default 1)."),
    )
    #: 0 DDP, 1 distributed optimizer, 2 + sharded grads, 3 FSDP
    zero_stage: int = knob(
        1,
        INT,
        space="zero",
        flag=Flag("zero", "ZeRO stage: 0 DDP, 1 distributed optimizer, 2 + sharded gradients, 3 FSDP (default 1)."),
    )
    #: ranks one ZeRO shard of the dense parameters spans; None = the whole dp x cp group. Fewer:
    #: hybrid sharding (HSDP), each shard replicated over dp*cp / dp_shard groups
    dp_shard: int | None = knob(
        None,
        INT,
        none=-1,
        space="dp_shard",
        flag=Flag(
            "dp_shard",
            "Hybrid sharding (HSDP): ranks one ZeRO shard spans, a divisor of dp x cp (torchtitan "
            "data_parallel_shard_degree; Megatron --num-distributed-optimizer-instances = dp x cp / "
            "dp_shard). Default: the whole dp x cp group.",
        ),
    )
    #: None = on whenever tp > 1
    sequence_parallel: bool | None = knob(
        None,
        BOOL,
        follows=lambda p: p.tp > 1,
        space="sp",
        flag=Flag("sp", "Sequence parallelism (default: on when tp > 1)."),
    )
    micro_batch_size: int = knob(1, INT, space="mbs", flag=Flag("mbs", "Micro-batch size in sequences (default 1)."))
    global_batch_size: int = knob(1, INT, flag=Flag("gbs", "Global batch size in sequences (default: ~4M tokens)."))
    #: None = 1f1b, or interleaved-1f1b when vpp > 1
    pp_schedule: str | None = knob(
        None,
        CATEGORY,
        SCHEDULES,
        follows=_schedule,
        space="pp_schedule",
        flag=Flag(
            "pp_schedule", "gpipe | 1f1b | interleaved-1f1b | zero-bubble (default: 1f1b, interleaved when vpp > 1)."
        ),
    )
    recompute: str = knob(
        "none",
        CATEGORY,
        RECOMPUTE,
        space="recompute",
        flag=Flag("recompute", "none | selective | full (default none)."),
    )
    #: full recompute: layers per stage recomputed; None = all
    recompute_layers: int | None = knob(
        None,
        INT,
        none=-1,
        space="recompute_layers",
        flag=Flag("recompute_layers", "With --recompute full: layers per stage to recompute (default: all)."),
    )
    #: with selective recompute: Megatron-Core's recompute_modules (autopar.spec.recompute_modules);
    #: None = its default, the core attention (what "selective" has always meant here)
    recompute_modules: tuple[str, ...] | None = knob(
        None,
        MODULES,
        space="recompute_modules",
        flag=Flag(
            "recompute_modules",
            f"With --recompute selective: the modules recomputed, a comma list of {', '.join(RECOMPUTE_MODULES)} "
            "(Megatron --recompute-modules; default core_attn).",
            str,
        ),
    )
    dtype: str = knob(
        "bf16",
        CATEGORY,
        DTYPES,
        space="dtype",
        flag=Flag("dtype", "bf16 | fp8 (GEMMs in FP8) | fp32 (full precision). Default: bf16; fp32 on --gpu local."),
    )
    #: with FP8: how the GEMMs' tensors are scaled (autopar.spec.fp8_recipes); "default" = the
    #: trainer's (the first of its `fp8` capability list: delayed on Megatron-Core, rowwise on
    #: torchtitan), so that one plan is the same plan on every trainer
    fp8_recipe: str = knob(
        "default",
        CATEGORY,
        RECIPE_CHOICES,
        space="fp8_recipe",
        flag=Flag(
            "fp8_recipe",
            f"With --dtype fp8: the scaling recipe, default (the trainer's: delayed on Megatron-Core, rowwise on "
            f"torchtitan) or one of {', '.join(FP8_RECIPES)} (Megatron --fp8-recipe; torchao recipe_name).",
        ),
    )
    #: with FP8: parameters kept and all-gathered in FP8 (autopar.spec.fp8_recipes); "default" = the
    #: trainer's (off, except Megatron-Bridge, whose FP8 recipe decides)
    fp8_param_gather: str = knob(
        "default",
        CATEGORY,
        PARAM_GATHER,
        space="fp8_param_gather",
        flag=Flag(
            "fp8_param_gather",
            "With --dtype fp8: keep and all-gather the parameters in FP8, on or off (default: the trainer's; "
            "Megatron --fp8-param-gather).",
        ),
    )
    #: Megatron's fp32 main grads (18 B/param); False = bf16 gradients (16 B/param)
    main_grads_fp32: bool = knob(
        True,
        BOOL,
        shown=False,
        flag=Flag(
            "grads",
            "Main-gradient dtype: fp32 (Megatron, 18 B/param; default) or bf16 (16 bytes per parameter with Adam).",
            str,
            GRADS,
        ),
    )
    #: overlap TP collectives with GEMMs (Megatron --tp-comm-overlap)
    tp_comm_overlap: bool = knob(
        False,
        BOOL,
        space="tp_comm_overlap",
        flag=Flag(
            "tp_comm_overlap",
            "Overlap TP collectives with GEMMs (Megatron --tp-comm-overlap, torchtitan async TP; default off).",
        ),
    )
    #: torch.compile of the model (torchtitan [compile] enable, components model and loss): Inductor
    #: fuses the elementwise ops, so fewer tensors are saved and moved (autopar.cost.memory_stacks
    #: `compiled`); off by default, as in torchtitan's CompileConfig (enable = False)
    compile: bool = knob(
        False,
        BOOL,
        space="compile",
        flag=Flag(
            "compile",
            "torch.compile of the model (torchtitan compile.enable; async TP needs it). Default off, as torchtitan.",
        ),
    )
    #: None = auto (see layout.auto_layout); the table holds an index into its layouts (-1 = auto)
    layout: PipelineLayout | None = knob(None, LAYOUT, LAYOUT_RULES, column_name="layout_id", space="pp_layout")
    #: which program runs the plan (autopar.spec.trainers)
    trainer: str = knob(
        "megatron",
        CATEGORY,
        ALL_TRAINERS,
        plan_key=False,
        view=False,
        space="trainer",
        flag=Flag(
            "trainer",
            f"The trainer that runs the plan: {', '.join(TRAINERS)} (default megatron); its capabilities and "
            f"performance profile apply.",
        ),
    )
    #: MoE token dispatch: dropless or capacity (drop past the capacity factor)
    moe_dispatch: str = knob(
        "dropless",
        CATEGORY,
        MOE_DISPATCH,
        moe=True,
        flag=Flag(
            "moe_dispatch",
            "MoE token dispatch: dropless (default) or capacity (tokens past the capacity factor dropped).",
        ),
    )
    #: capacity dispatch: expert capacity / mean load; None = 1.0
    capacity_factor: float | None = knob(
        None,
        FLOAT,
        none=1.0,
        only_if=("moe_dispatch", "capacity"),
        moe=True,
        flag=Flag("capacity_factor", "With --moe-dispatch capacity: expert capacity / mean load (default 1.0)."),
    )
    #: alltoall (NCCL) | deepep (DeepEP/HybridEP kernels)
    moe_dispatcher: str = knob(
        "alltoall",
        CATEGORY,
        MOE_DISPATCHERS,
        moe=True,
        space="moe_dispatcher",
        flag=Flag(
            "moe_dispatcher", "MoE token dispatcher: alltoall (NCCL, default) or deepep (DeepEP / HybridEP kernels)."
        ),
    )
    #: overlap the EP all-to-alls with another microbatch's compute
    ep_comm_overlap: bool = knob(
        False,
        BOOL,
        moe=True,
        space="ep_comm_overlap",
        flag=Flag(
            "ep_comm_overlap",
            "Hide the EP all-to-alls of one microbatch under another's compute (Megatron "
            "--overlap-moe-expert-parallel-comm; default off).",
        ),
    )
    #: share of each rank's optimizer shard (fp32 master weights and Adam moments) kept in host
    #: memory and stepped by a CPU Adam; 0 = none (Megatron-Core OptimizerConfig
    #: optimizer_offload_fraction with optimizer_cpu_offload; DeepSpeed offload_optimizer.ratio)
    optimizer_offload: float = knob(
        0.0,
        FLOAT,
        space="optimizer_offload",
        flag=Flag(
            "optimizer_offload",
            "Share of the optimizer shard (fp32 master weights, Adam moments) offloaded to host memory and "
            "stepped on the CPU, 0 to 1 (Megatron --optimizer-cpu-offload --optimizer-offload-fraction; "
            "DeepSpeed offload_optimizer). Default 0.",
        ),
    )
    #: Megatron-Core's fine-grained activation offloading: the modules whose saved inputs go to host
    #: memory in the forward and come back for the backward (autopar.spec.offload_modules); None = none
    offload_modules: tuple[str, ...] | None = knob(
        None,
        OFFLOAD,
        space="offload_modules",
        flag=Flag(
            "offload_modules",
            f"Activations offloaded to host memory, a comma list of {', '.join(OFFLOAD_MODULES)} (Megatron "
            "--fine-grained-activation-offloading --offload-modules). Default none.",
            str,
        ),
    )

    def __post_init__(self) -> None:
        for name, value in fill_followers(self, plan_fields(type(self))).items():
            object.__setattr__(self, name, value)
        problems = self._normalise_modules() + self._normalise_offload()
        problems += self.intrinsic_problems()
        if problems:
            raise PlanError("invalid plan: " + "; ".join(problems))

    def _normalise_modules(self) -> list[str]:
        """The recompute modules as one spelling: the names in registry order, or None for
        Megatron's default (core_attn alone), so that one plan has one value."""
        if self.recompute_modules is None:
            return []
        try:
            names = parse_modules(self.recompute_modules)
        except ModulesError as e:
            return [str(e)]
        if not names:
            return ["an empty recompute-module list recomputes nothing; use --recompute none"]
        object.__setattr__(self, "recompute_modules", None if names == DEFAULT_SELECTIVE else names)
        return []

    def _normalise_offload(self) -> list[str]:
        """The offloaded modules as one spelling: the names in registry order, or None for none."""
        if self.offload_modules is None:
            return []
        try:
            names = parse_offload_modules(self.offload_modules)
        except OffloadModulesError as e:
            return [str(e)]
        object.__setattr__(self, "offload_modules", names or None)
        return []

    @property
    def fp8_recipe_used(self) -> str | None:
        """The recipe the FP8 GEMMs run: the plan's, or its trainer's default; None without FP8."""
        return recipe_name(self.dtype, self.fp8_recipe, self.trainer)

    @property
    def fp8_param_gather_used(self) -> bool | None:
        """The FP8 parameters are kept and gathered in FP8 (the plan's or its trainer's choice); None
        without FP8."""
        return param_gather_used(self.dtype, self.fp8_recipe, self.fp8_param_gather, self.trainer)

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """The modules selective recompute checkpoints (none without it)."""
        if self.recompute != "selective":
            return ()
        return self.recompute_modules or DEFAULT_SELECTIVE

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
        if self.fp8_recipe not in RECIPE_CHOICES:
            out.append(f"FP8 recipe must be default or one of {', '.join(FP8_RECIPES)}, got '{self.fp8_recipe}'")
        elif self.fp8_recipe != "default" and self.dtype != "fp8":
            out.append(f"an FP8 recipe ({self.fp8_recipe}) needs --dtype fp8; drop --fp8-recipe or add --dtype fp8")
        if self.fp8_param_gather not in PARAM_GATHER:
            out.append(f"FP8 parameter gather must be default, on or off, got '{self.fp8_param_gather}'")
        elif self.fp8_param_gather != "default" and self.dtype != "fp8":
            out.append("FP8 parameter gather needs --dtype fp8; drop --fp8-param-gather or add --dtype fp8")
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
        if self.dp_shard is not None:
            if isinstance(self.dp_shard, bool) or not isinstance(self.dp_shard, int) or self.dp_shard <= 0:
                out.append(f"dp shard must be a positive integer, got {self.dp_shard!r}")
            elif (self.dp * self.cp) % self.dp_shard:
                out.append(
                    f"dp shard {self.dp_shard} does not divide the {self.dp * self.cp} data-parallel ranks "
                    f"(dp x cp); give a divisor"
                )
            elif self.zero_stage == 0:
                out.append("hybrid sharding (--dp-shard) needs ZeRO 1, 2 or 3: ZeRO 0 shards nothing")
        if self.recompute_modules is not None and self.recompute != "selective":
            out.append(
                f"recompute modules ({','.join(self.recompute_modules)}) need --recompute selective "
                f"(Megatron reads --recompute-modules only with --recompute-granularity selective)"
            )
        f = self.optimizer_offload
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            out.append(f"optimizer offload must be a share from 0 to 1 of the optimizer shard, got {f!r}")
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
        return max(1, self.tp * self.cp * self.dp // (self.ep * (self.etp or self.tp)))  # etp: tp when not given

    def problems(self, model, num_gpus: int | None = None, cluster=None, seq_len: int | None = None) -> list[str]:
        """Every rule this plan breaks for the model (and GPU count / cluster), as sentences.
        The rules are the vectorised ones the search applies (autopar.spec.rules)."""
        return plan_problems(self, model, num_gpus=num_gpus, cluster=cluster, seq_len=seq_len)

    def resolved_layout(self, num_layers: int) -> PipelineLayout:
        return self.layout if self.layout is not None else auto_layout(num_layers, self.pp, self.vpp)

    def with_(self, **changes) -> "ParallelPlan":
        return replace(self, **changes)

    def describe(self) -> str:
        """Short layout string, e.g. tp8.pp4.dp8 (axes of size 1 omitted; autopar.spec.plan_fields.plan_names)."""
        return _described(tuple(getattr(self, a) for a in NAME_FIELDS + ("dp_shard",)))

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layout"] = list(self.layout.stages) if self.layout else None
        out[NUM_MICROBATCHES] = self.num_microbatches
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ParallelPlan":
        data = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        if data.get("layout") is not None and not isinstance(data["layout"], PipelineLayout):
            data["layout"] = PipelineLayout(tuple(data["layout"]), "explicit")
        return cls(**data)


@lru_cache(maxsize=65536)
def _described(values: tuple) -> str:
    """A plan's layout string from its name fields (computed once per distinct layout: a table of
    thousands of runs repeats few)."""
    return str(plan_names({a: [v] for a, v in zip(NAME_FIELDS + ("dp_shard",), values)})[0])


# ---- what the declaration gives the rest of autopar ------------------------------------------------

#: the plan's fields, as declared above (autopar.spec.plan_fields.PlanField)
FIELDS = plan_fields(ParallelPlan)
#: what a layout is, for the search's per-layout pool: the process grid and the pipeline's shape
LAYOUT_KEY = tuple(
    f.name for f in sorted((f for f in FIELDS if f.layout_key is not None), key=lambda f: f.layout_key or 0)
)
#: the fields with the layout key first, in its order, then as declared: the plan flags' order
GRID_FIRST = tuple(sorted(FIELDS, key=lambda f: (f.layout_key is None, f.layout_key or 0)))
#: the fields in the order of search results: the plan (the layout key first), then who runs it
BY_KEY = tuple(f for f in GRID_FIRST if f.plan_key) + tuple(f for f in GRID_FIRST if not f.plan_key)
#: the columns of search results, as a frame holds them (autopar.search.results.frame;
#: plans.parquet groups them by type, autopar.search.run_dir)
RESULT_FIELDS = tuple(f for f in BY_KEY if f.shown)
#: the columns that make a plan what it is, apart from the trainer that runs it
PLAN_KEY = tuple(f.column for f in RESULT_FIELDS if f.plan_key)
