"""The question, declared once: what the user asks autopar (model, GPUs, cluster, sequence length,
global batch, trainers, and what "fastest" means). A search (autopar.search), a comparison
(autopar.report.compare), an estimate and the measured stage's trials (autopar.measured.placement)
all take this one type; a comparison or a trial leaves the batch and the ranking at their defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.routing import REAL_ROUTER_IMBALANCE
from autopar.spec.trainers import TRAINERS


@dataclass
class Question:
    model: ModelSpec
    num_gpus: int
    cluster: ClusterSpec
    seq_len: int
    #: sequences per step; None where each plan carries its own (the layouts of a comparison)
    global_batch_size: int | None = None
    #: the trainers the plans must run on (all of them unless `--trainer` says)
    trainers: tuple[str, ...] = TRAINERS
    #: what "fastest" means: "expected" (the central prediction) or "p80" (the pessimistic end of
    #: the 80 % interval: the step time 90 % of outcomes beat; autopar.calibration.uncertainty)
    rank_by: str = "expected"
    #: (trainer, recipe) the user names for a model the trainer's recipe table lacks (`--recipe`):
    #: NeMo 2 recipe modules, Megatron-Bridge recipe functions; the exports start from them
    recipes: tuple[tuple[str, str], ...] = ()
    #: MoE: the busiest expert rank's tokens over the mean (autopar.spec.routing): a real router's by
    #: default, 1 for forced balance (`--routing-imbalance 1`); capped at ep per plan
    routing_imbalance: float = REAL_ROUTER_IMBALANCE

    @property
    def recipe_trainers(self) -> frozenset[str]:
        return frozenset(t for t, _ in self.recipes)

    @property
    def batch(self) -> int:
        """The global batch of a question that fixes one (a search's)."""
        if self.global_batch_size is None:
            raise ValueError("this question fixes no global batch")
        return self.global_batch_size

    def key(self) -> tuple:
        """What makes two plans' questions the same: model, cluster, GPU count, sequence length."""
        return (
            json.dumps(self.model.to_dict(), sort_keys=True),
            json.dumps(self.cluster.to_dict(), sort_keys=True),
            self.num_gpus,
            self.seq_len,
        )

    def describe(self) -> str:
        return f"{self.model.name} on {self.num_gpus} x {self.cluster.gpu.key}, seq {self.seq_len}"
