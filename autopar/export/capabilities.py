"""What a trainer's export refuses, taken from its capability table (autopar/spec/data/trainers.toml).

The search and the exporters read the same table through the same rules (autopar.spec.rules runs
the model rules and every capability kind, labelled `<trainer>:<kind>` on a plan of that
trainer), so an exporter refuses exactly the plans the search would not offer on its trainer,
with the same sentence. An exporter may waive a line that an export option stands in for
(`--recipe` for `<trainer>:recipes`), and keeps only the checks that depend on its own options
(e.g. torchtitan <= 0.2.2's TOML format).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.rules import check_rules
from autopar.spec.table import PlanTable


@dataclass(frozen=True)
class BrokenRules:
    """The rules a plan breaks, split into its trainer's capability lines and the rest."""

    trainer: str
    capability: tuple[tuple[str, str], ...]  # (rule name, sentence), the trainer's own lines
    other: tuple[tuple[str, str], ...]  # model, GPU and cluster rules

    @property
    def ok(self) -> bool:
        return not self.capability and not self.other


def broken_rules(
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    num_gpus: int,
    seq_len: int,
    waived: frozenset[str] = frozenset(),
) -> BrokenRules:
    """Every rule `plan` breaks on its own trainer (plan.trainer), as (name, sentence); `waived`
    rule names are left out."""
    result = check_rules(PlanTable.from_plans([plan]), model, num_gpus=num_gpus, cluster=cluster, seq_len=seq_len)
    pairs = [(n, s) for n, s in zip(result.labels(0), result.reasons(0)) if n not in waived]
    mine = tuple((n, s) for n, s in pairs if n.startswith(f"{plan.trainer}:"))
    return BrokenRules(plan.trainer, mine, tuple(p for p in pairs if p not in mine))


def recipe_waiver(trainer: str, recipe: str | None) -> frozenset[str]:
    """`--recipe NAME` stands in for the table's preset -> recipe line."""
    return frozenset({f"{trainer}:recipes"}) if recipe else frozenset()
