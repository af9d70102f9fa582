"""Trial documents on disk: reports/<run>/trials/<key>.json, written atomically (write, rename), so
a reader (a report, another worker sharing the run directory) never sees half a file."""

from __future__ import annotations

from pathlib import Path

from autopar.json_out import dumps
from autopar.search.atomic import write_atomic


def write_trial_doc(doc: dict, trials_dir: Path) -> Path:
    trials_dir = Path(trials_dir)
    trials_dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(trials_dir / f"{doc['key']}.json", dumps(doc, indent=1))
