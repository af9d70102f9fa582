"""Checks the commands run before any work: an output path that cannot be written is refused in
one line (the option, the path, the fix) instead of failing after a long search or fit. The limits
of sizes and files live in autopar.spec.schema."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from autopar.errors import InputError, quoted
from autopar.spec.schema import path_kind


def _nearest(path: Path) -> Path:
    """The nearest ancestor of `path` (or `path` itself) that exists."""
    p = path
    while path_kind(p) is None and p != p.parent:
        p = p.parent
    return p


def _probe(folder: Path) -> str | None:
    """Why files cannot be created in the existing `folder` (None: they can); root ignores modes,
    so a file is really created and removed."""
    try:
        fd, name = tempfile.mkstemp(prefix=".autopar-probe-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def output_file(path: Path | str | None, flag: str) -> Path | None:
    """`path` (None = not given) when a file can be written there (its folders made on the way),
    else one line naming `flag`."""
    if path is None:
        return None
    p = Path(path)
    kind = path_kind(p)
    if kind == "dir":
        raise InputError(f"{flag} {quoted(str(p))} is a directory; give a file name, e.g. {p / 'out'}")
    if kind == "other":
        raise InputError(f"{flag} {quoted(str(p))} is not a regular file; give a file name")
    base = _nearest(p.parent)
    if path_kind(base) != "dir":
        raise InputError(f"{flag} {quoted(str(p))} lies under {quoted(str(base))}, which is a file; give another path")
    why = _probe(base)
    if why is None and kind == "file" and not os.access(p, os.W_OK):
        why = "the file is read-only"
    if why:
        raise InputError(f"{flag} {quoted(str(p))} cannot be written ({why}); give a writable path")
    return p


def output_dir(path: Path | str | None, flag: str) -> Path | None:
    """`path` (None = not given) when files can be written into it (made if need be), else one
    line naming `flag`."""
    if path is None:
        return None
    p = Path(path)
    kind = path_kind(p)
    if kind not in (None, "dir"):
        raise InputError(f"{flag} {quoted(str(p))} is a file, not a directory; give a directory")
    base = _nearest(p)
    if path_kind(base) != "dir":
        raise InputError(f"{flag} {quoted(str(p))} lies under {quoted(str(base))}, which is a file; give another path")
    why = _probe(base)
    if why:
        raise InputError(f"{flag} {quoted(str(p))} cannot be written ({why}); give a writable directory")
    return p


def check_routing_imbalance(imbalance: float | None, ep: int | None = None) -> float | None:
    """--routing-imbalance (the busiest expert rank's tokens / the mean over the ep ranks): at least
    1 (balanced), and for one plan (`ep` given) at most ep (every token on one rank), else one line.
    A search's plans have many ep sizes: the model caps it at each one's."""
    if imbalance is None:
        return None
    if ep is None:
        if not (math.isfinite(imbalance) and imbalance >= 1):
            raise InputError(
                f"--routing-imbalance {quoted(imbalance)} is below 1 (balanced routing): the busiest expert rank "
                f"holds at least the mean; give 1 (forced balance) or more"
            )
        return imbalance
    if not (math.isfinite(imbalance) and 1 <= imbalance <= ep):
        why = "below 1 (balanced routing)" if math.isfinite(imbalance) and imbalance < 1 else f"above ep={ep}"
        raise InputError(
            f"--routing-imbalance {quoted(imbalance)} is {why}: the busiest of ep expert ranks holds from 1 to ep "
            f"times the mean; give a value from 1 to {ep}"
            + (" (a plan without expert parallelism is balanced: 1)" if ep == 1 else "")
        )
    return imbalance
