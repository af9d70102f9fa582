"""Reading user YAML files (models, clusters, search spaces): one place turns a syntax error into a
one-line InputError with the line and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autopar.errors import InputError


def parse_yaml(text: str, what: str) -> Any:
    """Parse YAML text; `what` names the file in the error, e.g. "cluster file 'c.yaml'"."""
    import yaml  # only needed when a YAML file is given

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        detail = ": ".join(p for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p)
        detail = " ".join(str(detail or e).split())
        raise InputError(f"{what} is not valid YAML{where}: {detail}; fix the syntax") from None


def load_yaml(path: str | Path, what: str) -> Any:
    """Read and parse a YAML file; a missing or unreadable file is an InputError too."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} does not exist; check the path")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {what}: {' '.join(str(e).split())}; check the path") from None
    return parse_yaml(text, what)
