"""Model presets (data/models.toml) and `--model` resolution: preset name, HF config.json, or
an autopar model file (YAML/JSON)."""

from __future__ import annotations

import re
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

from autopar.errors import InputError, did_you_mean, quoted
from autopar.spec.model import MLASpec, ModelSpec, MoESpec
from autopar.spec.schema import path_kind

_META_KEYS = {"source", "aliases", "published_params", "published_active"}


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


def preset_names() -> list[str]:
    return list(_preset_table())


def published_counts(name: str) -> tuple[float | None, float | None]:
    """The model card's (total, active) parameter counts, for tests of the derivation."""
    row = _preset_table()[_aliases()[name]]
    return row.get("published_params"), row.get("published_active")


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
    from autopar.spec.model_file import load_model_file

    return load_model_file(path)
