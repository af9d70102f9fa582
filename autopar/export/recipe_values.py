"""What a Megatron-Bridge or NeMo 2 recipe sets, read from its source (data/bridge_recipes.json and
data/nemo_recipes.json, written by scripts/bridge_recipe_values.py and scripts/nemo_recipe_values.py
from megatron-bridge 0.3.1, nemo-toolkit 2.7.3 and megatron-core 0.16.1; a test re-reads each from
the reference releases), and the overrides of a plan that change it: an export writes no line that
restates a recipe's value, so none undoes a tuned setting or names a field an older image lacks."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

FILES = {"bridge": "data/bridge_recipes.json", "nemo": "data/nemo_recipes.json"}


@cache
def recipe_values(trainer: str, recipe: str) -> dict:
    """The fields the recipe sets explicitly, over the layout, recompute and offload fields it leaves
    at Megatron-Core's defaults; {} for a recipe the data does not list."""
    data = json.loads(resources.files("autopar.export").joinpath(FILES[trainer]).read_text())
    listed = data["recipes"].get(recipe)
    return (data["defaults"]["values"] | listed["values"]) if listed else {}


def _same(a, b) -> bool:
    """Equal as the config would hold them (a tuple and a list of the same items alike; True is not 1)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def changes(overrides: dict, known: dict, always: tuple[str, ...] = ()) -> dict:
    """The overrides whose value the recipe does not already hold (`always`: written regardless)."""
    return {k: v for k, v in overrides.items() if k in always or k not in known or not _same(known[k], v)}
