"""`autopar trainers`: what each trainer can run (its capability table) and its performance profile."""

from __future__ import annotations

import re
import textwrap
from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.json_out import dumps


class _UnderscoreWrapper(textwrap.TextWrapper):
    """Wraps at spaces, hyphens and underscores (recipe names such as rowwise_with_gw_hp), so that a
    long name breaks between its words rather than inside one."""

    def _split(self, text: str) -> list[str]:
        return [piece for chunk in super()._split(text) for piece in re.split(r"(?<=_)", chunk) if piece]


def _value(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return ", ".join(str(x) for x in v) or "-"
    if isinstance(v, dict):
        return f"{len(v)} presets"
    return str(v)


@app.command()
def trainers(
    trainer: Annotated[
        Optional[str], typer.Option("--trainer", help="Show one trainer's lines with their sources.")
    ] = None,
    as_json: o.Json = False,
) -> None:
    """The trainers autopar plans for: what each can run (one capability table each, every line with the
    trainer file it comes from) and the performance profile that prices it."""
    from autopar.cost.profiles import profile_of
    from autopar.spec.trainers import ALL_TRAINERS, get_trainer

    keys = [get_trainer(trainer).key] if trainer else list(ALL_TRAINERS)
    table = {k: get_trainer(k) for k in keys}
    if as_json:
        print(
            dumps(
                {
                    k: {
                        "title": t.title,
                        "engine": t.engine,
                        "profile": t.profile,
                        "source": t.source,
                        "capabilities": {
                            c.kind: {"value": c.value, "source": c.source, "instead": c.instead}
                            for c in t.capabilities.values()
                        },
                        "recipes": t.recipes.value if t.recipes else None,
                    }
                    for k, t in table.items()
                },
                indent=2,
            )
        )
        return
    from autopar.cli.render import SCHEDULE_SHORT, Col, compact_table, console, fitted_table, schedule_legend

    out = console()
    if trainer:
        t = table[keys[0]]
        tab, _ = fitted_table(
            f"{t.title} ({t.engine}; performance profile {profile_of(t.key).name}): {t.source}",
            (Col("capability", left=True), Col("value", left=True, wraps=True), Col("source", left=True, wraps=True)),
            [(c.kind, _value(c.value), c.source) for c in [*t.capabilities.values(), t.recipes] if c is not None],
            out.width,
        )
        out.print(tab)
        return
    tab = compact_table("What each trainer can run (autopar/spec/data/trainers.toml; `--trainer T` for the sources)")
    kinds = list(table[keys[0]].capabilities) + ["recipes", "performance profile"]
    tab.add_column("capability", no_wrap=True)
    # the trainers share what the capability column leaves; a cell wraps at spaces and hyphens
    cell = max(8, (out.width - max(map(len, kinds)) - 2 * len(keys)) // len(keys))
    for k in keys:
        tab.add_column(k, no_wrap=True)

    def shown(v) -> str:
        short = [SCHEDULE_SHORT.get(x, x) for x in v] if isinstance(v, list) else SCHEDULE_SHORT.get(v, v)
        return _UnderscoreWrapper(width=cell, break_on_hyphens=True).fill(_value(short))

    for kind in table[keys[0]].capabilities:
        tab.add_row(kind, *[shown(table[k].cap(kind).value) for k in keys])
    tab.add_row("recipes", *[_value(rec.value) if (rec := table[k].recipes) else "any model" for k in keys])
    tab.add_row("performance profile", *[profile_of(k).name for k in keys])
    out.print(tab)
    out.print(schedule_legend())
