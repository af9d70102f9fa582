"""Model files for `--model`: a HuggingFace config.json, or an autopar model file (JSON/YAML with
the same fields as a data/models.toml entry, optional nested `moe:`/`mla:` and an optional `name:`),
and that plain-data schema itself (`model_from_dict`, shared with the presets)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from autopar.errors import InputError, quoted
from autopar.spec.hf_config import model_from_hf_config
from autopar.spec.model import MLASpec, ModelSpec, MoESpec
from autopar.spec.read_file import read_text
from autopar.spec.schema import JSON_BYTES, YAML_BYTES, check_name, check_tree
from autopar.spec.yaml_io import USUAL, parse_yaml

_HF_MARKERS = ("model_type", "architectures", "num_hidden_layers")
#: keys of a preset row that describe it and are not ModelSpec fields
_META_KEYS = {
    "source",
    "aliases",
    "published_params",
    "published_active",
    "published_batch_tokens",
    "published_batch_source",
}


def model_from_dict(name: str, row: dict, source: str = "") -> ModelSpec:
    """Build a ModelSpec from the plain-data schema (presets and autopar model files share it).
    Unknown keys are an error that names them."""
    row = dict(row)
    known = {f for f in ModelSpec.__dataclass_fields__} - {"name", "source"}
    unknown = set(row) - known - _META_KEYS
    if unknown:
        shown = ", ".join(quoted(str(k), 40) for k in sorted(unknown, key=str)[:5])
        raise InputError(
            f"model {quoted(name)}: unknown field(s) {shown}{' ...' if len(unknown) > 5 else ''}; "
            f"known fields are {sorted(known)}"
        )
    kwargs = {k: v for k, v in row.items() if k in known}
    try:
        if isinstance(kwargs.get("moe"), dict):
            kwargs["moe"] = MoESpec(**kwargs["moe"])
        if isinstance(kwargs.get("mla"), dict):
            kwargs["mla"] = MLASpec(**kwargs["mla"])
        return ModelSpec(name=name, source=source or row.get("source", ""), **kwargs)
    except TypeError as e:  # missing or unknown nested field
        missing = re.findall(r"'(\w+)'", str(e))
        what = f"missing or unknown field(s) {', '.join(missing[:5])}" if missing else quoted(str(e))
        raise InputError(f"model {quoted(name)}: {what}; see README 'Model files' for the schema") from None


def _parse(path: Path, text: str) -> Any:
    """The file's data; a syntax error becomes an InputError with the line and column."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            return check_tree(json.loads(text), f"model file '{path.name}'")
        except json.JSONDecodeError as e:
            raise InputError(
                f"model file '{path.name}' is not valid JSON (line {e.lineno}, column "
                f"{e.colno}): {e.msg}; fix the syntax"
            ) from None
        except (ValueError, RecursionError) as e:  # a number of more than 4300 digits, deep nesting
            raise InputError(
                f"model file '{path.name}' holds a value autopar cannot read ({type(e).__name__}); fix the file"
            ) from None
    if suffix in (".yaml", ".yml"):
        return parse_yaml(text, f"model file '{path.name}'")
    raise InputError(
        f"model file '{path.name}' has an unknown extension {quoted(path.suffix)}; use "
        f".json (HuggingFace config.json or autopar schema) or .yaml/.yml"
    )


def _default_name(path: Path) -> str:
    """The file stem; for a HuggingFace `config.json`, the folder it sits in (at most 80 characters:
    a long path must not make every message long)."""
    if path.stem == "config" and path.resolve().parent.name:
        return path.resolve().parent.name[:80]
    return path.stem[:80]


def load_model_file(path: Path) -> ModelSpec:
    """Load a HuggingFace config.json or an autopar JSON/YAML model file."""
    path = Path(path)
    if path.suffix.lower() not in (".json", ".yaml", ".yml"):
        _parse(path, "")  # the one line about the extension
    big = JSON_BYTES if path.suffix.lower() == ".json" else YAML_BYTES
    data = _parse(path, read_text(path, f"model file '{path}'", big, usual=USUAL))
    if not isinstance(data, dict):
        got = "nothing" if data is None else f"a {type(data).__name__}"
        raise InputError(
            f"model file '{path.name}' must hold a mapping of field names to values, "
            f"got {got}; see README 'Model files' for the schema"
        )
    if path.suffix.lower() == ".json" and any(k in data for k in _HF_MARKERS):
        return model_from_hf_config(data, _default_name(path), source=path.name)
    row = dict(data)
    name = check_name(row.pop("name", None) or path.stem[:80], f"model file '{path.name}': 'name'")
    for key in ("moe", "mla"):
        if row.get(key) is not None and not isinstance(row[key], dict):
            raise InputError(
                f"model file '{path.name}': '{key}' must be a mapping of its fields, "
                f"got {quoted(row[key])}; see README 'Model files' for the schema"
            )
    if row.get("source") is not None:
        check_name(row["source"], f"model file '{path.name}': 'source'", 1024)
    return model_from_dict(name, row, source=str(row.get("source") or path))
