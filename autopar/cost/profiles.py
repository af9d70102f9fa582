"""Performance profiles: the cost model's constants for each training program, and its memory stack.

A trainer runs its own kernels and overlaps its own communication, so the same plan trains at a
different speed under Megatron-Core (fused Transformer Engine kernels, userbuffer TP overlap),
PyTorch FSDP2 / torchtitan (eager PyTorch, FSDP prefetching) or DeepSpeed. Each profile
(data/profiles.toml) lists its kernel facts and its fitted constants (`autopar validate --fit`, with
where the fit came from); a constant it does not list is its parent's, or the prior of the one
table of constants (autopar.spec.constants). Trainers name their profile in
autopar/spec/data/trainers.toml. A cluster file's `constants:` (a calibration, the `local` CPU
profile) pins constants on top of the profile.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources

from autopar.spec.constants import constant_table
from autopar.spec.hardware import ClusterSpec, CostConstants
from autopar.spec.trainers import get_trainer

CONSTANT_NAMES = tuple(f.name for f in fields(CostConstants))


@dataclass(frozen=True)
class Profile:
    name: str
    memory_stack: str  # "megatron" | "torch" (autopar.cost.memory_terms)
    constants: CostConstants
    description: str
    #: the profile whose constants this one starts from; "" = the base (the priors)
    parent: str = ""
    #: prices published runs of a framework autopar plans for no trainer of (nanotron, Meta's stack)
    validation_only: bool = False
    #: the constants this profile sets itself (the rest are its parent's or the priors)
    own: tuple[str, ...] = ()


@dataclass(frozen=True)
class Provenance:
    """Where the profiles' constants come from (the [provenance] table of profiles.toml)."""

    command: str
    runs: str
    date: str
    cross_validation: str
    digest: str = ""  # sha256 over the code, profiles and data the figures were computed with


def _data() -> dict:
    return tomllib.loads(resources.files("autopar.cost").joinpath("data/profiles.toml").read_text())


def resolve(name: str, listed: dict[str, dict[str, float]], parents: dict[str, str]) -> CostConstants:
    """A profile's constants: what it lists, else its own prior where the table gives the profile
    one, else its parent's (the priors for a profile without a parent)."""
    parent = parents.get(name, "")
    base = resolve(parent, listed, parents) if parent else None
    table = constant_table()
    values = {}
    for c in CONSTANT_NAMES:
        if c in listed.get(name, {}):
            values[c] = listed[name][c]
        elif name in table[c].profiles or base is None:
            values[c] = table[c].for_profile(name).prior
        else:
            values[c] = getattr(base, c)
    return CostConstants(**values)


@cache
def profiles() -> dict[str, Profile]:
    raw = {k: v for k, v in _data().items() if k != "provenance"}
    listed = {name: {k: float(v) for k, v in e.get("constants", {}).items()} for name, e in raw.items()}
    for name, consts in listed.items():
        unknown = set(consts) - set(CONSTANT_NAMES)
        if unknown:  # a data error, caught by the tests
            raise ValueError(f"profiles.toml: [{name}] has unknown constants {sorted(unknown)}")
    parents = {name: e.get("parent", "") for name, e in raw.items()}
    return {
        name: Profile(
            name=name,
            memory_stack=e["memory_stack"],
            constants=resolve(name, listed, parents),
            description=e.get("description", ""),
            parent=parents[name],
            validation_only=bool(e.get("validation_only", False)),
            own=tuple(listed[name]),
        )
        for name, e in raw.items()
    }


@cache
def provenance() -> Provenance:
    p = _data()["provenance"]
    return Provenance(
        command=p["command"],
        runs=p["runs"],
        date=p["date"],
        cross_validation=p["cross_validation"],
        digest=p.get("digest", ""),
    )


def lineage(name: str) -> tuple[str, ...]:
    """A profile's parents, nearest first."""
    out, p = [], profiles()[name].parent
    while p and p not in out:
        out.append(p)
        p = profiles()[p].parent
    return tuple(out)


def pinned(name: str, constant: str) -> bool:
    """A fitted-kind constant the profile's trainer fixes by its mechanism (its range for the
    profile is one value, e.g. Megatron's bucketed DP overlap): the prior, never fitted or listed."""
    spec = constant_table()[constant]
    own = spec.for_profile(name, lineage(name))
    return spec.kind == "fitted" and own.low == own.high


def profile_of(trainer: str) -> Profile:
    return profiles()[get_trainer(trainer).profile]


def priced_cluster(cluster: ClusterSpec, trainer: str) -> ClusterSpec:
    """The cluster as the cost model prices a plan of `trainer` on it: the trainer's profile
    constants with the cluster's pinned constants on top, and the profile's memory stack unless the
    cluster names one."""
    prof = profile_of(trainer)
    consts = replace(prof.constants, **{n: getattr(cluster.constants, n) for n in cluster.pinned})
    return replace(cluster, constants=consts, training_stack=cluster.training_stack or prof.memory_stack)


def profiles_toml(fitted: dict[str, dict[str, float]], provenance_: Provenance) -> str:
    """profiles.toml text: each profile's facts and own constants, with `fitted` (profile ->
    constant -> value) replacing or adding to them (memory stacks, parents, descriptions kept)."""

    def q(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [
        "# Performance profiles: each training program's kernel facts and fitted constants (what each",
        "# constant means, its prior and range: autopar/spec/data/constants.toml), and the memory stack it",
        "# runs. A constant a profile does not list is its parent's, or the prior. Written by `autopar",
        "# validate --fit --write-profiles`; see autopar/cost/profiles.py. A trainer names its profile in",
        "# autopar/spec/data/trainers.toml.",
        "",
        "[provenance]",
    ]
    lines += [f"{k} = {q(getattr(provenance_, k))}" for k in ("command", "runs", "date", "cross_validation", "digest")]
    raw = {k: v for k, v in _data().items() if k != "provenance"}
    for name, p in profiles().items():
        own = {k: float(v) for k, v in raw[name].get("constants", {}).items() if not pinned(name, k)}
        own |= fitted.get(name, {})
        lines += ["", f"[{name}]", f"memory_stack = {q(p.memory_stack)}", f"description = {q(p.description)}"]
        if p.parent:
            lines.append(f"parent = {q(p.parent)}")
        if p.validation_only:
            lines.append("validation_only = true")
        lines.append(f"[{name}.constants]")
        lines += [f"{n} = {_rounded(own[n])!r}" for n in CONSTANT_NAMES if n in own]
    return "\n".join(lines) + "\n"


#: significant digits a fitted constant is stored to: a fit to published runs that scatter by
#: several percent determines none better than to a part in a thousand, and fewer digits keep a
#: refit's diff to the constants that moved
STORED_DIGITS = 4


def _rounded(value: float) -> float:
    return float(f"{value:.{STORED_DIGITS}g}")
