"""`autopar trainers`: what each trainer can run (its capability table) and its performance profile."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from autopar.cli import app
from autopar.cli import options as o
from autopar.json_out import dumps


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
    from rich.table import Table

    from autopar.cli.render import console

    out = console()
    if trainer:
        t = table[keys[0]]
        tab = Table(
            title=f"{t.title} ({t.engine}; performance profile {profile_of(t.key).name}): {t.source}",
            title_justify="left",
        )
        for col in ("capability", "value", "source"):
            tab.add_column(col)
        for c in list(t.capabilities.values()) + ([t.recipes] if t.recipes else []):
            tab.add_row(c.kind, _value(c.value), c.source)
        out.print(tab)
        return
    tab = Table(
        title="What each trainer can run (autopar/spec/data/trainers.toml; `--trainer T` for the sources)",
        title_justify="left",
    )
    tab.add_column("capability")
    for k in keys:
        tab.add_column(k)
    for kind in table[keys[0]].capabilities:
        tab.add_row(kind, *[_value(table[k].cap(kind).value) for k in keys])
    tab.add_row("recipes", *[_value(rec.value) if (rec := table[k].recipes) else "any model" for k in keys])
    tab.add_row("performance profile", *[profile_of(k).name for k in keys])
    out.print(tab)
