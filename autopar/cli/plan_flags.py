"""The plan flags, declared with the plan's fields (autopar.spec.plan: each field's flag and its
help) but the layout flags' help here: `@with_plan_flags` appends them to a command's signature and
hands the command one `PlanRequest` (autopar.spec.resolve) in its `plan` parameter
(autopar.cli.option_groups). Every flag defaults to None (not given): each command fills in its own
defaults (estimate: the hardware's dtype; export --run: the ranked plan's values).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Optional

import typer

from autopar.cli.option_groups import Opt, with_options
from autopar.spec.plan_fields import PlanField
from autopar.spec.resolve import FLAGGED, LAYOUT_FLAGS, PlanRequest, flag_type, option

PANEL = "Plan"  # help panel of the plan flags


def _opt(*names: str, help: str):
    return typer.Option(*names, help=help, rich_help_panel=PANEL, show_default=False)


#: the layout flags' help (autopar.spec.resolve.LAYOUT_FLAGS); every other flag's is the plan's
#: declaration's (autopar.spec.plan)
LAYOUT_HELP = {
    "pp_layout": "Layers per virtual stage, e.g. 4,5,5,4.",
    "pp_first": "Layers on the first stage (Megatron --decoder-first-pipeline-num-layers).",
    "pp_last": "Layers on the last stage.",
    "pp_embedding_as_layer": "Count the embedding as a layer when balancing stages.",
    "pp_loss_as_layer": "Count the loss as a layer when balancing stages.",
}


def _plan_option(f: PlanField) -> tuple[object, object]:
    """A flagged field's (type, typer option): `--name`, or `--name/--no-name` for a switch."""
    typ, name = flag_type(f), option(f.cli.name)
    return Optional[typ], _opt(f"{name}/--no-{name[2:]}" if typ is bool else name, help=f.cli.help)


_OPTIONS = {f.cli.name: _plan_option(f) for f in FLAGGED} | {
    name: (Optional[typ], _opt(option(name), help=LAYOUT_HELP[name])) for name, typ in LAYOUT_FLAGS.items()
}
assert set(_OPTIONS) == {f.name for f in fields(PlanRequest)}, "one option per PlanRequest field"
#: field -> (type, typer option); one entry per PlanRequest field, in --help order
PLAN_OPTIONS: dict[str, tuple[object, object]] = {f.name: _OPTIONS[f.name] for f in fields(PlanRequest)}


def _request(values: dict) -> PlanRequest:
    """The PlanRequest of the parsed options; the two layout switches given as False mean not given."""
    for name in ("pp_embedding_as_layer", "pp_loss_as_layer"):
        if values.get(name) is False:
            values[name] = None
    return PlanRequest(**values)


def with_plan_flags(command):
    """Give `command(..., plan: PlanRequest)` the plan flags as options; the command's own
    parameters come first (its `plan` parameter is filled in, not an option)."""
    return with_options({name: Opt(typ, opt) for name, (typ, opt) in PLAN_OPTIONS.items()}, "plan", _request)(command)
