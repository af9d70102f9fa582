"""How a search runs (the question's space, top-k, exhaustive or Optuna, storage, run directory,
the whole run): read by autopar.search.run and autopar.search.optuna_search."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autopar.search.limits import DEFAULT_MAX_EXHAUSTIVE
from autopar.search.space import SearchSpace
from autopar.spec.training_run import TrainingRun


@dataclass
class SearchOptions:
    space: SearchSpace
    top_k: int = 10
    max_exhaustive: int = DEFAULT_MAX_EXHAUSTIVE
    sampler: str = "tpe"
    n_trials: int = 200
    seed: int | None = None
    storage: str | None = None
    study_name: str | None = None
    multi_objective: bool = False
    run_dir: Path | None = None
    csv: bool = False  # also write plans.csv
    training: TrainingRun | None = None  # --tokens/--deadline/--price-per-gpu-hour/--budget: the whole run

    def __post_init__(self) -> None:
        from autopar.spec.schema import check_name, check_storage

        check_storage(self.storage)
        if self.study_name is not None:
            check_name(self.study_name, "--study-name")
