"""Reading user YAML files (models, clusters, search spaces): one place turns a syntax error into a
one-line InputError with the line and column, and bounds what a file may hold (autopar.spec.schema:
its size before parsing, its values with aliases expanded after)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autopar.errors import InputError
from autopar.spec.read_file import read_text
from autopar.spec.schema import YAML_BYTES, check_tree

#: how large such a file is, for the message about one that is too large
USUAL = "a model, cluster or space file is a few KiB"


def parse_yaml(text: str, what: str) -> Any:
    """Parse YAML text; `what` names the file in the error, e.g. "cluster file 'c.yaml'"."""
    import yaml  # only needed when a YAML file is given

    if len(text) > YAML_BYTES:
        raise InputError(f"{what} is larger than {YAML_BYTES // 1024} KiB ({USUAL}); check the path")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        detail = ": ".join(p for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p)
        detail = " ".join(str(detail or e).split())[:200]
        raise InputError(f"{what} is not valid YAML{where}: {detail}; fix the syntax") from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply; fix the file") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise InputError(
            f"{what} holds a value autopar cannot read ({' '.join(str(e).split(':')[0].split())[:80]}); fix the file"
        ) from None
    return check_tree(data, what)


def load_yaml(path: str | Path, what: str) -> Any:
    """Read (autopar.spec.read_file) and parse a YAML file; a missing, special, unreadable or
    oversized file is an InputError too."""
    return parse_yaml(read_text(path, what, YAML_BYTES, usual=USUAL), what)
