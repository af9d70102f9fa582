"""What the proxy planner (autopar.measured.proxy) works with and decides: the proxy options, the
target the plans were found for, and a plan's `Placement` on this machine (with its `Proxy`, when
scaled down); imports no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from autopar.errors import InputError

if TYPE_CHECKING:  # annotations only: `search --launcher` checks its options without the plan layer
    from autopar.spec.plan import ParallelPlan


@dataclass(frozen=True)
class ProxyOptions:
    """How far trials may be scaled down to fit this machine (`--no-proxy`, `--proxy-*`)."""

    enabled: bool = True
    layers_per_stage: int | None = None  # fixed layers per virtual stage (None: the ladder chooses)
    width_divisor: int | None = None  # fixed width divisor (None: the ladder chooses; 1 = full width)
    seq_divisor: int | None = None  # fixed sequence divisor (None: the ladder chooses)
    #: the proxy's predicted step time on this machine at most (None: no time limit)
    step_budget_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("layers_per_stage", "width_divisor", "seq_divisor"):
            v = getattr(self, name)
            if v is not None and v < 1:
                flag = {"layers_per_stage": "layers", "width_divisor": "width", "seq_divisor": "seq"}[name]
                raise InputError(f"--proxy-{flag} {v} must be at least 1; leave it out to let the proxy choose")


@dataclass(frozen=True)
class Proxy:
    """How a proxy differs from its plan, what it is predicted to take here, and the scale-back."""

    changes: tuple[str, ...]  # every difference from the plan, in words
    nproc: int  # ranks of the proxy (the plan's: Question.num_gpus)
    layers_per_stage: int
    width_divisor: int
    seq_divisor: int
    here: str  # the hardware profile the proxy's prediction uses
    cross_hardware: bool  # measured on other hardware than the plan's (e.g. a CPU proxy of a GPU plan)
    predicted_step_time_s: float  # the proxy, here
    predicted_peak_memory_bytes: float  # the proxy's busiest rank, here
    time_ratio: float  # predicted target step time / predicted proxy step time
    memory_ratio: float  # predicted target peak / predicted proxy peak

    @property
    def summary(self) -> str:
        return ", ".join(self.changes)

    def to_dict(self) -> dict:
        return asdict(self) | {"changes": list(self.changes), "summary": self.summary}


@dataclass(frozen=True)
class Placement:
    """How one plan runs on this machine."""

    plan: dict  # the plan as searched
    kind: str  # "full" | "proxy" | "not-runnable"
    reason: str = ""  # not-runnable: why, and what to do
    nproc: int = 0
    model: dict = field(default_factory=dict)  # the model to run (a ModelSpec dict with "name")
    run_plan: dict = field(default_factory=dict)  # the plan to run
    seq_len: int = 0
    device: str = "cpu"
    proxy: Proxy | None = None

    @property
    def runnable(self) -> bool:
        return self.kind != "not-runnable"


def builtin_trainer() -> str | None:
    """The trainer name of autopar's built-in model (the plan field `trainer` the worker checks its
    capabilities by), when the spec layer knows one."""
    try:
        from autopar.spec.trainers import BUILTIN
    except ImportError:
        return None
    return BUILTIN


def as_builtin(plan: ParallelPlan) -> ParallelPlan:
    """The plan as the built-in model runs it: the same layout, its trainer the built-in model."""
    name = builtin_trainer()
    if name is None or not hasattr(plan, "trainer") or plan.trainer == name:
        return plan
    return plan.with_(trainer=name)
