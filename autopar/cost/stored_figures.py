"""The figures stored with the shipped profiles (data/profiles.cv.json): the leave-one-source-out
rows, the fitted constants and what the 80 % intervals are built from. Written by
autopar.cost.validate_runs.write_profiles (`make profiles`); read here, by the validation and by
autopar.cost.uncertainty."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

CV_FILE = "profiles.cv.json"


@cache
def stored_figures() -> dict | None:
    """The stored figures, or None when the file is not shipped. Cached: `write_profiles` clears it."""
    path = resources.files("autopar.cost").joinpath(f"data/{CV_FILE}")
    return json.loads(path.read_text()) if path.is_file() else None
