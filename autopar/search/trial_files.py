"""Trial documents on disk: reports/<run>/trials/<key>.json, written atomically (write, rename), so
a reader (a report, another worker sharing the run directory) never sees half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file of this process, then rename it over."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # per process: two workers may write at once
    tmp.write_text(text)
    tmp.replace(path)
    return path


def write_trial_doc(doc: dict, trials_dir: Path) -> Path:
    trials_dir = Path(trials_dir)
    trials_dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(trials_dir / f"{doc['key']}.json", json.dumps(doc, indent=1, default=str))
