"""PlanTable: many plans as numpy columns, so that the rules and the cost model evaluate a whole
search space in one vectorised pass. A single plan is a table of one row: the scalar `estimate` and
the search run the very same code.

Its columns, their dtypes and the conversions both ways follow from the plan's declaration
(autopar.spec.plan.FIELDS): a categorical field is held as the index of its name, the layout as an
index into the table's `layouts`. `plan_of_row` is the one decoder of a row (of a table, or of a
search results frame, which holds the names) back into a ParallelPlan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autopar.spec.layout import PipelineLayout
from autopar.spec.plan import FIELDS, ParallelPlan
from autopar.spec.plan_fields import (
    DISPATCH,
    DISPATCHER,
    DTYPE,
    LAYOUT,
    RECOMP,
    SCHED,
    TRAINER,
    PlanColumns,
    table_columns,
)

# the codes of the categorical columns are re-exported: the cost model reads them from here
__all__ = [
    "BOOL_COLUMNS",
    "DISPATCH",
    "DISPATCHER",
    "DTYPE",
    "FLOAT_COLUMNS",
    "INT_COLUMNS",
    "PlanTable",
    "RECOMP",
    "SCHED",
    "TABLE_COLUMNS",
    "TRAINER",
    "plan_of_row",
]

#: the table's columns by how they are stored: integers (codes and the layout id too), switches, numbers
INT_COLUMNS, BOOL_COLUMNS, FLOAT_COLUMNS = table_columns(FIELDS)
TABLE_COLUMNS = INT_COLUMNS + BOOL_COLUMNS + FLOAT_COLUMNS


class PlanTable(PlanColumns):
    """Columns of equal length (autopar.spec.plan_fields.PlanColumns). `recompute_layers` -1 = all
    layers; `layout_id` -1 = auto layout, otherwise an index into `layouts`."""

    @classmethod
    def from_columns(cls, layouts: list[PipelineLayout] | None = None, **cols) -> "PlanTable":
        """Build from arrays (the search's enumeration); missing columns take plan defaults."""
        return cls.build(FIELDS, layouts, cols)

    @classmethod
    def from_plans(cls, plans: list[ParallelPlan]) -> "PlanTable":
        return cls.of_plans(plans, FIELDS)

    def plan(self, i: int) -> ParallelPlan:
        """Row i as a ParallelPlan."""
        return plan_of_row({k: v[i] for k, v in self.columns.items()}, self.layouts)


def plan_of_row(row: Mapping, layouts) -> ParallelPlan:
    """A row back into a ParallelPlan: a table's (categories as codes) or a search results frame's
    (categories as names; a field it does not show takes the plan's default)."""
    values: dict[str, Any] = {}
    for f in FIELDS:
        if f.column in row:
            v = row[f.column]
            values[f.name] = (None if int(v) < 0 else layouts[int(v)]) if f.kind == LAYOUT else f.decode(v)
    for f in FIELDS:
        if f.only_if is not None and values.get(f.only_if[0]) != f.only_if[1]:
            values[f.name] = None
    return ParallelPlan(**values)
