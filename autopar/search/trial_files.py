"""Trial documents on disk: reports/<run>/trials/<key>.json, written atomically (write, rename)."""

from __future__ import annotations

import json
from pathlib import Path


def write_trial_doc(doc: dict, trials_dir: Path) -> Path:
    trials_dir = Path(trials_dir)
    trials_dir.mkdir(parents=True, exist_ok=True)
    path = trials_dir / f"{doc['key']}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)
    return path
