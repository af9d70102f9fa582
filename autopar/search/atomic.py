"""Atomic file writes (write a temporary file of this process, then rename it over the target), so
a reader — a report, another worker sharing the run directory — never sees half a file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_with(path: Path, write: Callable[[Path], object]) -> Path:
    """Have `write` fill a temporary path next to `path` (per process: two workers may write the
    same file at once), then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically."""
    return write_with(path, lambda tmp: tmp.write_text(text))
