"""Model presets (data/models.toml) and `--model` resolution: preset name, HF config.json, or
an autopar model file (YAML/JSON, autopar.spec.model_file, which owns the plain-data schema:
`model_from_dict`, re-exported here)."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

from autopar.errors import InputError, did_you_mean, quoted
from autopar.spec.model import ModelSpec
from autopar.spec.model_file import load_model_file, model_from_dict
from autopar.spec.schema import path_kind


@cache
def _preset_table() -> dict[str, dict]:
    text = resources.files("autopar.spec").joinpath("data/models.toml").read_text()
    return tomllib.loads(text)


@cache
def _aliases() -> dict[str, str]:
    out = {}
    for name, row in _preset_table().items():
        out[name] = name
        for alias in row.get("aliases", []):
            out[alias] = name
    return out


def preset_aliases() -> dict[str, str]:
    """Each short name `--model` also takes (models.toml's `aliases`) -> its preset."""
    return {alias: name for alias, name in _aliases().items() if alias != name}


def preset_names() -> list[str]:
    return list(_preset_table())


def published_counts(name: str) -> tuple[float | None, float | None]:
    """The model card's (total, active) parameter counts, for tests of the derivation."""
    row = _preset_table()[_aliases()[name]]
    return row.get("published_params"), row.get("published_active")


def published_batch(name: str) -> tuple[int, str] | None:
    """(tokens per step, its source) of the batch a published run of this preset trained with at
    scale (models.toml's published_batch_tokens / _source), or None (not a preset, or none stated)."""
    key = _aliases().get(name.lower())
    row = _preset_table().get(key, {}) if key else {}
    tokens, source = row.get("published_batch_tokens"), row.get("published_batch_source")
    return (int(tokens), str(source)) if tokens and source else None


def get_preset(name: str) -> ModelSpec:
    key = _aliases().get(name.lower())
    if key is None:
        raise InputError(
            f"unknown model {quoted(name)}{did_you_mean(name, _aliases())}; "
            f"run `autopar models` for the presets, or pass a config.json / YAML file"
        )
    return model_from_dict(key, _preset_table()[key])


def resolve_model(arg: str) -> ModelSpec:
    """`--model`: a preset name or alias, a HuggingFace config.json or the folder holding it (a
    downloaded model), or an autopar model file."""
    if not arg.strip():
        raise InputError(
            "--model is empty; give a preset name (see `autopar models`), a HuggingFace model folder or "
            "config.json, or an autopar model file"
        )
    path = Path(arg)
    kind = path_kind(arg)
    if arg.lower() in _aliases() or (
        kind != "dir" and path.suffix.lower() not in (".json", ".yaml", ".yml") and "/" not in arg
    ):
        return get_preset(arg)
    if kind == "dir":
        path = path / "config.json"
        if path_kind(path) != "file":
            raise InputError(
                f"model folder {quoted(arg)} holds no config.json; give a HuggingFace model folder, a "
                f"config.json, an autopar model file or a preset name"
            )
    elif kind != "file":
        raise InputError(
            f"model file {quoted(arg)} {'is not a regular file' if kind else 'does not exist'}; give a "
            f"preset name or a path to a config.json / YAML model file"
        )
    return load_model_file(path)
