"""The exporter registry: one module per trainer, registered by name; duplicate names are refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.errors import InputError, did_you_mean

if TYPE_CHECKING:  # the exporters import nothing of the registry back at run time
    from autopar.export.base import Exporter

EXPORTERS: dict[str, "Exporter"] = {}


def register(exporter: "Exporter") -> "Exporter":
    """Add an exporter under its `name`. A second exporter with the same name is a programming
    error (two modules claiming one trainer), raised at import time."""
    name = exporter.name
    if not name or not name.replace("-", "").isalnum():
        raise ValueError(f"exporter name {name!r} must be a non-empty word")
    if name in EXPORTERS:
        raise ValueError(
            f"duplicate exporter name {name!r}: {type(EXPORTERS[name]).__name__} and "
            f"{type(exporter).__name__} both claim it"
        )
    EXPORTERS[name] = exporter
    return exporter


def get_exporter(name: str) -> "Exporter":
    try:
        return EXPORTERS[name]
    except KeyError:
        raise InputError(
            f"unknown export format '{name}'{did_you_mean(name, EXPORTERS)}; choose one of "
            f"{', '.join(EXPORTERS)}, or all"
        ) from None
