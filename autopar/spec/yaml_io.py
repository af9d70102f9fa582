"""Reading user YAML files (models, clusters, search spaces): one place turns a syntax error into a
one-line InputError with the line and column, and bounds what a file may hold (autopar.spec.schema:
its size before parsing, its values with aliases expanded after)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from autopar.errors import InputError, quoted
from autopar.spec.read_file import read_text
from autopar.spec.schema import YAML_BYTES, check_tree

#: how large such a file is, for the message about one that is too large
USUAL = "a model, cluster or space file is a few KiB"


def parse_yaml(text: str, what: str) -> Any:
    """Parse YAML text; `what` names the file in the error, e.g. "cluster file 'c.yaml'"."""
    import yaml  # only needed when a YAML file is given

    if len(text) > YAML_BYTES:
        raise InputError(f"{what} is larger than {YAML_BYTES // 1024} KiB ({USUAL}); check the path")
    try:
        data = yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a safe loader
    except DuplicateKey as e:
        raise InputError(
            f"{what} repeats the key {quoted(e.key)} (line {e.line}; first on line {e.first}): the second would "
            f"silently replace the first; keep one"
        ) from None
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


class DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


@cache
def _strict_loader():
    """PyYAML's safe loader (the C one where built) refusing a key a mapping repeats: PyYAML keeps
    the last silently, so a space file's second `tp:` (or a second whole section) would win
    unnoticed. Keys merged in with `<<` may repeat (that is what a merge is for)."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node.start_mark.line + 1)
                    except TypeError:  # an unhashable key: the constructor refuses it itself
                        continue
                    if first != key_node.start_mark.line + 1:
                        raise DuplicateKey(key, key_node.start_mark.line + 1, first)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def load_yaml(path: str | Path, what: str) -> Any:
    """Read (autopar.spec.read_file) and parse a YAML file; a missing, special, unreadable or
    oversized file is an InputError too."""
    return parse_yaml(read_text(path, what, YAML_BYTES, usual=USUAL), what)
