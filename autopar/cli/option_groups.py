"""Groups of options declared once and shared by several commands: `with_options(GROUP, "name",
build)` appends a group's options to a command's signature and hands the command one value built
from them in its `name` parameter (the plan flags -> a PlanRequest, the run flags -> a
TrainingRun, the trial flags -> TrialFlags).

typer reads a command's parameters from `inspect.signature` and their types from
`typing.get_type_hints`, so the wrapper carries both (`__signature__`, `__annotations__`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, NamedTuple


class Opt(NamedTuple):
    """One option of a group: its Python type, its typer.Option, its default."""

    type: object
    option: object
    default: object = None


def with_options(group: dict[str, Opt], param: str, build: Callable[[dict], object]):
    """A decorator: `command(..., <param>)` gets the group's options (after its own, in the group's
    order) and `<param>` = build({option name: value})."""

    def decorate(command):
        own = inspect.signature(command, eval_str=True)
        hints = typing.get_type_hints(command, include_extras=True)
        params = [p for name, p in own.parameters.items() if name != param]
        clash = {p.name for p in params} & set(group)
        if clash:
            raise TypeError(f"{command.__name__} declares options of the {param} group itself: {sorted(clash)}")
        added = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=Annotated[o.type, o.option]
            )
            for name, o in group.items()
        ]

        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            values = {name: kwargs.pop(name, group[name].default) for name in group}
            return command(*args, **kwargs, **{param: build(values)})

        positional = [p for p in params if p.kind != inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY]
        wrapper.__signature__ = own.replace(parameters=positional + keyword + added)
        wrapper.__annotations__ = {k: v for k, v in hints.items() if k != param} | {p.name: p.annotation for p in added}
        return wrapper

    return decorate
