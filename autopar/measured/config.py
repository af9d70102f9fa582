"""What a trial runs (TrialConfig) and the run file the worker reads; no torch, so the launcher and the
search process can write run files.

Run file (`python -m autopar.trial.worker --spec run.json`): one trial object, or
`{"trials": [...]}` to run several plans in one launch (torchrun start-up dominates on small
machines). A trial: `model` (preset name or a ModelSpec dict), optional `scale`
({"num_layers": n, "width_divisor": d}, ModelSpec.scaled), `plan` (ParallelPlan.to_dict),
`seq_len`, `steps`, `warmup`, `seed`, `device` (auto|cpu|cuda), `optimizer` (adamw|sgd), `lr`,
`count_comm` (count collective bytes on the last step), `check_parity` (compare with a
single-process run of the same model, seed and global batch), and for MoE models `moe_routing`
(topk | balanced | skewed, autopar.trial.model.ROUTING_MODES), `moe_capacity_factor` (null =
dropless) and `moe_aux_loss_coeff` (the load-balancing loss weight).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset, model_from_dict


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """One plan to run: model, plan, shapes, steps and what to measure."""

    model: str | dict
    plan: dict
    name: str = ""
    scale: dict | None = None  # ModelSpec.scaled kwargs: num_layers, width_divisor
    seq_len: int | None = None  # None = the model's
    steps: int = 3
    warmup: int = 1  # steps left out of the timing statistics
    seed: int = 0
    device: str = "auto"
    optimizer: str = "adamw"
    lr: float = 1e-3
    count_comm: bool = True
    check_parity: bool = False
    extra: dict = field(default_factory=dict)  # free-form labels carried into the result
    moe_routing: str = "topk"
    moe_capacity_factor: float | None = None
    moe_aux_loss_coeff: float = 1e-2

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"steps must be >= 1 and warmup >= 0, got {self.steps}, {self.warmup}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be adamw or sgd, got {self.optimizer!r}")
        if self.moe_routing not in ("topk", "balanced", "skewed"):
            raise ValueError(f"moe_routing must be topk, balanced or skewed, got {self.moe_routing!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")

    def model_spec(self) -> ModelSpec:
        spec = (
            get_preset(self.model)
            if isinstance(self.model, str)
            else model_from_dict(self.model.get("name", "custom"), {k: v for k, v in self.model.items() if k != "name"})
        )
        return spec.scaled(**self.scale) if self.scale else spec

    def parallel_plan(self) -> ParallelPlan:
        return ParallelPlan.from_dict(self.plan)

    @property
    def sequence_length(self) -> int:
        return self.seq_len or self.model_spec().seq_len

    @property
    def label(self) -> str:
        return self.name or self.parallel_plan().describe()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrialConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown trial field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


def load_run(data: Any) -> list[TrialConfig]:
    """The trials of a run file's parsed JSON (one trial, or {"trials": [...]})."""
    items = data["trials"] if isinstance(data, dict) and "trials" in data else [data]
    return [TrialConfig.from_dict(t) for t in items]
