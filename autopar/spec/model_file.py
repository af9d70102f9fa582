"""Model files for `--model`: a HuggingFace config.json, or an autopar model file (JSON/YAML with
the same fields as a data/models.toml entry, optional nested `moe:`/`mla:` and an optional `name:`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autopar.errors import InputError
from autopar.spec.hf_config import model_from_hf_config
from autopar.spec.model import ModelSpec
from autopar.spec.presets import model_from_dict
from autopar.spec.yaml_io import parse_yaml

_HF_MARKERS = ("model_type", "architectures", "num_hidden_layers")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _parse(path: Path, text: str) -> Any:
    """The file's data; a syntax error becomes an InputError with the line and column."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"model file '{path.name}' is not valid JSON (line {e.lineno}, column "
                             f"{e.colno}): {e.msg}; fix the syntax") from None
    if suffix in (".yaml", ".yml"):
        return parse_yaml(text, f"model file '{path.name}'")
    raise InputError(f"model file '{path.name}' has an unknown extension '{path.suffix}'; use "
                     f".json (HuggingFace config.json or autopar schema) or .yaml/.yml")


def _default_name(path: Path) -> str:
    """The file stem; for a HuggingFace `config.json`, the folder it sits in."""
    if path.stem == "config" and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem


def load_model_file(path: Path) -> ModelSpec:
    """Load a HuggingFace config.json or an autopar JSON/YAML model file."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read model file '{path}': {_one_line(e)}; check the path") from None
    data = _parse(path, text)
    if not isinstance(data, dict):
        got = "nothing" if data is None else f"a {type(data).__name__}"
        raise InputError(f"model file '{path.name}' must hold a mapping of field names to values, "
                         f"got {got}; see README 'Model files' for the schema")
    if path.suffix.lower() == ".json" and any(k in data for k in _HF_MARKERS):
        return model_from_hf_config(data, _default_name(path), source=path.name)
    row = dict(data)
    name = row.pop("name", None) or path.stem
    if not isinstance(name, str):
        raise InputError(f"model file '{path.name}': 'name' must be a string, got {name!r}; fix it")
    for key in ("moe", "mla"):
        if row.get(key) is not None and not isinstance(row[key], dict):
            raise InputError(f"model file '{path.name}': '{key}' must be a mapping of its fields, "
                             f"got {row[key]!r}; see README 'Model files' for the schema")
    return model_from_dict(name, row, source=str(row.get("source") or path))
