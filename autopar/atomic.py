"""The one atomic file write: fill a temporary file of this process next to the target, then rename
it over the target, so a reader (a report, another worker sharing a run directory, a launcher
polling a trial's result) never sees half a file. A process that dies mid-write leaves only its
`.NAME.PID.tmp`, which autopar.search.run_state removes once the process is gone."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def temp_path(path: Path) -> Path:
    """The temporary file this process fills before renaming it over `path` (per process: two
    workers may write the same file at once)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def publish(path: Path) -> Path:
    """Rename this process's filled `temp_path(path)` over `path` (a file written over time, such
    as plans.parquet's row groups)."""
    temp_path(path).replace(path)
    return Path(path)


def temp_files(folder: Path, own: bool = False) -> list[tuple[Path, int | None]]:
    """The temporary files in `folder` (this process's only, with `own`), each with the process id
    its name carries (None where it carries none)."""
    pattern = f".*.{os.getpid()}.tmp" if own else ".*.tmp"
    out = []
    for p in Path(folder).glob(pattern):
        pid = p.name.rsplit(".", 2)[-2] if p.name.count(".") >= 3 else ""
        out.append((p, int(pid) if pid.isdigit() else None))
    return out


def write_with(path: Path, write: Callable[[Path], object]) -> Path:
    """Have `write` fill `temp_path(path)`, then rename it over `path`."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
