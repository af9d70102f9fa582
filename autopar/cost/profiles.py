"""Performance profiles: the cost model's constants for each training program, and its memory stack.

A trainer runs its own kernels and overlaps its own communication, so the same plan trains at a
different speed under Megatron-Core (fused Transformer Engine kernels, userbuffer TP overlap),
PyTorch FSDP2 / torchtitan (eager or compiled PyTorch, FSDP prefetching) or DeepSpeed. Each
profile (data/profiles.toml) holds every constant of `CostConstants`, fitted by `autopar validate
--fit` on the bundled calibration runs and stored with where the fit came from; trainers name their
profile in autopar/spec/data/trainers.toml. A cluster file's `constants:` (a calibration, the
`local` CPU profile) pins constants on top of the profile.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources

from autopar.spec.hardware import ClusterSpec, CostConstants
from autopar.spec.trainers import get_trainer

CONSTANT_NAMES = tuple(f.name for f in fields(CostConstants))


@dataclass(frozen=True)
class Profile:
    name: str
    memory_stack: str  # "megatron" | "torch" (autopar.cost.memory_terms)
    constants: CostConstants
    description: str
    #: the profile a fit starts from (its constants are the parent's x exp(deviation)); "" = the base
    parent: str = ""
    #: prices published runs of a framework autopar plans for no trainer of (nanotron, Meta's stack)
    validation_only: bool = False


@dataclass(frozen=True)
class Provenance:
    """Where the profiles' constants come from (the [provenance] table of profiles.toml)."""

    command: str
    runs: str
    date: str
    cross_validation: str


def _data() -> dict:
    return tomllib.loads(resources.files("autopar.cost").joinpath("data/profiles.toml").read_text())


@cache
def profiles() -> dict[str, Profile]:
    raw = _data()
    out = {}
    for name, entry in raw.items():
        if name == "provenance":
            continue
        consts = {k: float(v) for k, v in entry.get("constants", {}).items()}
        unknown = set(consts) - set(CONSTANT_NAMES)
        if unknown:  # a data error, caught by the tests
            raise ValueError(f"profiles.toml: [{name}] has unknown constants {sorted(unknown)}")
        out[name] = Profile(
            name=name,
            memory_stack=entry["memory_stack"],
            constants=replace(CostConstants(), **consts),
            description=entry.get("description", ""),
            parent=entry.get("parent", ""),
            validation_only=bool(entry.get("validation_only", False)),
        )
    return out


@cache
def provenance() -> Provenance:
    p = _data()["provenance"]
    return Provenance(command=p["command"], runs=p["runs"], date=p["date"], cross_validation=p["cross_validation"])


def profile_of(trainer: str) -> Profile:
    return profiles()[get_trainer(trainer).profile]


def priced_cluster(cluster: ClusterSpec, trainer: str) -> ClusterSpec:
    """The cluster as the cost model prices a plan of `trainer` on it: the trainer's profile
    constants with the cluster's pinned constants on top, and the profile's memory stack unless the
    cluster names one."""
    prof = profile_of(trainer)
    consts = replace(prof.constants, **{n: getattr(cluster.constants, n) for n in cluster.pinned})
    return replace(cluster, constants=consts, training_stack=cluster.training_stack or prof.memory_stack)


def profiles_toml(constants: dict[str, CostConstants], provenance_: Provenance) -> str:
    """profiles.toml text for fitted constants (the memory stacks and descriptions are kept)."""

    def q(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        "# Performance profiles: every constant of the cost model (autopar.spec.hardware.CostConstants) per",
        "# training program, and the memory stack it runs. Written by `autopar validate --fit",
        "# --write-profiles`; see autopar/cost/profiles.py. A trainer names its profile in",
        "# autopar/spec/data/trainers.toml.",
        "",
        "[provenance]",
    ]
    lines += [f"{k} = {q(getattr(provenance_, k))}" for k in ("command", "runs", "date", "cross_validation")]
    for name, p in profiles().items():
        k = constants.get(name, p.constants)
        lines += ["", f"[{name}]", f"memory_stack = {q(p.memory_stack)}", f"description = {q(p.description)}"]
        if p.parent:
            lines.append(f"parent = {q(p.parent)}")
        if p.validation_only:
            lines.append("validation_only = true")
        lines.append(f"[{name}.constants]")
        lines += [f"{n} = {float(getattr(k, n))!r}" for n in CONSTANT_NAMES]
    return "\n".join(lines) + "\n"
