"""The figures stored with the shipped profiles (autopar/cost/data/profiles.toml), in this package's
data/profiles.cv.json: the leave-one-source-out rows, the fitted constants and what the 80 %
intervals are built from. Written by autopar.calibration.validate_runs.write_profiles
(`make profiles`); read here, by the validation and by autopar.calibration.uncertainty."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

CV_FILE = "profiles.cv.json"


def shipped_path() -> Path:
    """Where the shipped profiles' stored figures live (this package's data)."""
    return Path(str(resources.files("autopar.calibration").joinpath(f"data/{CV_FILE}")))


@cache
def stored_figures() -> dict | None:
    """The stored figures, or None when the file is not shipped. Cached: `write_profiles` clears it."""
    path = shipped_path()
    return json.loads(path.read_text()) if path.is_file() else None
