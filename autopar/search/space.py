"""Search spaces: user-editable YAML files (search_spaces/*.yaml) naming the choices of every knob
and the constraints every plan must meet. Unknown keys and bad values are errors that name them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from autopar.errors import InputError, did_you_mean, quoted
from autopar.spec.offload_modules import OffloadModulesError, parse_offload_modules
from autopar.spec.plan import BY_KEY, SCHEDULES
from autopar.spec.plan_fields import BOOL, CATEGORY, FLOAT, INT, LAYOUT, MODULES, OFFLOAD
from autopar.spec.recompute_modules import ModulesError, parse_modules
from autopar.spec.schema import MAX_BATCH, MAX_GPUS, MAX_LAYERS, check_name, path_kind
from autopar.spec.yaml_io import load_yaml

#: the shipped spaces: the top-level folder search_spaces/, installed as the package autopar.spaces
SPACES_DIR = Path(str(resources.files("autopar.spaces")))
#: the space every other one inherits the knobs and constraints it does not set from
DEFAULT_SPACE = "default"

#: the knobs, by kind: the plan's fields that name one (autopar.spec.plan), in the search results' order
_KNOB_FIELDS = tuple(f for f in BY_KEY if f.space)
INT_KNOBS = tuple(f.space for f in _KNOB_FIELDS if f.space and f.kind == INT)
CHOICE_KNOBS = {f.space: list(f.choices) for f in _KNOB_FIELDS if f.space and f.kind in (CATEGORY, LAYOUT)}
CHOICE_KNOBS["pp_schedule"] = [s for s in SCHEDULES if s != "interleaved-1f1b"]  # interleaving: vpp > 1
BOOL_KNOBS = tuple(f.space for f in _KNOB_FIELDS if f.space and f.kind == BOOL)
#: knobs whose choices are sets of names (recompute_modules: comma lists of Megatron-Core modules)
MODULE_KNOBS = tuple(f.space for f in _KNOB_FIELDS if f.space and f.kind == MODULES)
#: knobs whose choices are sets of offloaded modules, or none (offload_modules)
OFFLOAD_KNOBS = tuple(f.space for f in _KNOB_FIELDS if f.space and f.kind == OFFLOAD)
#: number knobs -> their (lowest, highest) choice: the share of the optimizer shard offloaded
FLOAT_KNOBS = {f.space: (0.0, 1.0) for f in _KNOB_FIELDS if f.space and f.kind == FLOAT}
KNOBS = (
    INT_KNOBS
    + tuple(CHOICE_KNOBS)
    + BOOL_KNOBS
    + MODULE_KNOBS
    + OFFLOAD_KNOBS
    + tuple(FLOAT_KNOBS)
    + ("tokens_per_step",)
)
CONSTRAINTS = {
    "tp_within_node": bool,
    "max_pp": int,
    "max_cp": int,
    "min_dp": int,
    "ep_within": int,
    "memory_headroom_gib": float,
    # the largest share of step time the headroom rule gives up (autopar.search.margins); 0: off
    "headroom_trade": float,
    "max_tp": int,
}
#: the largest choice of an integer knob (the schema's limits), and choices per knob
KNOB_MAX = {"recompute_layers": MAX_LAYERS, "pp": MAX_LAYERS, "vpp": MAX_LAYERS, "mbs": MAX_BATCH}
MAX_CHOICES = 256


@dataclass(frozen=True)
class SearchSpace:
    name: str
    description: str
    knobs: dict = field(default_factory=dict)  # knob -> list of choices, or "auto"
    constraints: dict = field(default_factory=dict)
    source: str = ""
    #: the knobs and constraints taken from the default space because this one does not set them
    inherited: tuple[str, ...] = ()
    #: why `--space` left out chose this space (`chosen_space`); "" when the user named it
    chosen_because: str = ""

    def choices(self, knob: str, default):
        v = self.knobs.get(knob, default)
        return v

    def with_knobs(self, **overrides) -> "SearchSpace":
        """A copy with some knobs pinned (CLI flags such as --tp 8 narrow the space)."""
        knobs = dict(self.knobs)
        for k, v in overrides.items():
            if v is not None:
                knobs[k] = v if isinstance(v, list) else [v]
        return replace(self, knobs=knobs, constraints=dict(self.constraints))


def inherit(space: SearchSpace, base: SearchSpace) -> SearchSpace:
    """`space` with every knob and constraint it does not set taken from `base` (the default space),
    so that a file holding only `dtype: [fp8]` is the default space with fp8, not a space of single
    choices (an unset knob would otherwise fall back to its plan default: tp 1, pp 1, ...)."""
    knobs = {k: v for k, v in base.knobs.items() if k not in space.knobs}
    cons = {k: v for k, v in base.constraints.items() if k not in space.constraints}
    return SearchSpace(
        space.name,
        space.description,
        knobs | space.knobs,
        cons | space.constraints,
        space.source,
        tuple(knobs) + tuple(cons),
    )


def check_choices(name: str, value, origin: str) -> list:
    """A knob's choices: a non-empty list of at most MAX_CHOICES values of the knob's kind."""
    if value == "auto" and name in ("ep", "sp", "etp"):
        return value
    if not isinstance(value, list) or not value or len(value) > MAX_CHOICES:
        raise InputError(
            f"{origin}: knob '{name}' must be a non-empty list of at most {MAX_CHOICES} choices (or "
            f"'auto' where allowed), got {quoted(value)}"
        )
    if name in INT_KNOBS:
        lo, hi = (0, 3) if name == "zero" else (0 if name == "recompute_layers" else 1, KNOB_MAX.get(name, MAX_GPUS))
        for v in value:
            if (name, v) in (("etp", "tp"), ("dp_shard", "all")):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise InputError(
                    f"{origin}: knob '{name}' has a bad choice {quoted(v)}; use integers from {lo} to {hi:,}"
                )
    elif name in CHOICE_KNOBS:
        allowed = CHOICE_KNOBS[name] + (["interleaved-1f1b"] if name == "pp_schedule" else [])
        if "on" in allowed:  # YAML 1.1 reads a bare on / off as true / false
            value = ["on" if v is True else "off" if v is False else v for v in value]
        for v in value:
            if not isinstance(v, str) or v not in allowed:
                raise InputError(
                    f"{origin}: knob '{name}' has an unknown choice {quoted(v)}"
                    f"{did_you_mean(v, allowed) if isinstance(v, str) else ''}; "
                    f"choose from {', '.join(allowed)}"
                )
    elif name in BOOL_KNOBS:
        if any(not isinstance(v, bool) for v in value):
            raise InputError(f"{origin}: knob '{name}' choices must be true/false, got {quoted(value)}")
    elif name in MODULE_KNOBS:
        for v in value:
            try:
                if not isinstance(v, str) or not parse_modules(v):
                    raise ModulesError("a choice is a comma list of modules, e.g. core_attn or moe_act,layernorm")
            except ModulesError as e:
                raise InputError(f"{origin}: knob '{name}' has a bad choice {quoted(v)}: {e}") from None
    elif name in OFFLOAD_KNOBS:
        for v in value:
            try:
                if not isinstance(v, str):
                    raise OffloadModulesError("a choice is none or a comma list of modules, e.g. expert_fc1,moe_act")
                parse_offload_modules(v)
            except OffloadModulesError as e:
                raise InputError(f"{origin}: knob '{name}' has a bad choice {quoted(v)}: {e}") from None
    elif name in FLOAT_KNOBS:
        low, high = FLOAT_KNOBS[name]
        for v in value:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not low <= v <= high:
                raise InputError(
                    f"{origin}: knob '{name}' has a bad choice {quoted(v)}; use numbers from {low:g} to {high:g}"
                )
    return value


def space_from_dict(data, origin: str) -> SearchSpace:
    if not isinstance(data, dict):
        raise InputError(f"{origin}: the top level must be a mapping with 'knobs' and 'constraints'")
    unknown = set(data) - {"name", "description", "knobs", "constraints"}
    if unknown:
        shown = ", ".join(quoted(str(k), 40) for k in sorted(unknown, key=str)[:5])
        raise InputError(f"{origin}: unknown key(s) {shown}; a space has name, description, knobs, constraints")
    for key in ("name", "description"):
        if data.get(key) is not None:
            check_name(data[key], f"{origin}: '{key}'", 256 if key == "name" else 4096, lines=key != "name")
    knobs = data.get("knobs") or {}
    if not isinstance(knobs, dict):
        raise InputError(f"{origin}: 'knobs' must be a mapping of knob -> choices")
    for k in knobs:
        if k in ("gbs", "global_batch_size"):
            raise InputError(
                f"{origin}: knob '{k}' cannot be searched: the global batch is part of the question (it "
                f"changes what training converges to, not only its speed); drop it and pass --gbs "
                f"256,512 for a what-if per batch size, or set tokens_per_step"
            )
        if k not in KNOBS:
            raise InputError(
                f"{origin}: unknown knob {quoted(str(k), 40)}{did_you_mean(str(k), KNOBS)}; known knobs: "
                f"{', '.join(KNOBS)}"
            )
    checked: dict[str, Any] = {}
    for k, v in knobs.items():
        if k == "tokens_per_step":
            if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_BATCH * MAX_BATCH:
                raise InputError(
                    f"{origin}: 'tokens_per_step' must be a positive integer up to "
                    f"{MAX_BATCH * MAX_BATCH:,}, got {quoted(v)}"
                )
            checked[k] = v
        else:
            checked[k] = check_choices(k, v, origin)
    cons = data.get("constraints") or {}
    if not isinstance(cons, dict):
        raise InputError(f"{origin}: 'constraints' must be a mapping")
    for k, v in cons.items():
        if k not in CONSTRAINTS:
            raise InputError(
                f"{origin}: unknown constraint {quoted(str(k), 40)}{did_you_mean(str(k), CONSTRAINTS)}; "
                f"known: {', '.join(CONSTRAINTS)}"
            )
        typ = CONSTRAINTS[k]
        if (
            typ is bool
            and not isinstance(v, bool)
            or typ is int
            and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_GPUS)
            or typ is float
            and (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1e6)
        ):
            kind = {
                bool: "true/false",
                int: f"a positive integer up to {MAX_GPUS:,}",
                float: "a number from 0 to 1,000,000",
            }[typ]
            raise InputError(f"{origin}: constraint '{k}' must be {kind}, got {quoted(v)}")
        if k == "headroom_trade" and v > 1:
            raise InputError(
                f"{origin}: constraint 'headroom_trade' is a share of step time from 0 to 1 "
                f"(0.05 = 5 %), got {quoted(v)}"
            )
    return SearchSpace(
        name=str(data.get("name", origin)),
        description=str(data.get("description", "")),
        knobs=checked,
        constraints=dict(cons),
        source=origin,
    )


def space_names() -> list[str]:
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def load_space(name_or_file: str) -> SearchSpace:
    """`--space NAME|FILE`: a shipped space by name, or a YAML file."""
    path = Path(name_or_file)
    if not (path.suffix in (".yaml", ".yml") or "/" in name_or_file):
        path = SPACES_DIR / f"{name_or_file}.yaml"
        if name_or_file not in space_names():
            raise InputError(
                f"unknown search space {quoted(name_or_file)}{did_you_mean(name_or_file, space_names())}; "
                f"shipped spaces: {', '.join(space_names())}, or pass a YAML file"
            )
    elif path_kind(path) != "file":
        raise InputError(f"search space file {quoted(name_or_file)} does not exist; check the path")
    data = load_yaml(path, f"search space '{path}'")
    space = space_from_dict(data, f"search space '{path.name}'")
    if not (isinstance(data, dict) and data.get("name")):  # a file without a name is named after it
        space = SearchSpace(path.stem, space.description, space.knobs, space.constraints, space.source)
    if path.resolve() == (SPACES_DIR / f"{DEFAULT_SPACE}.yaml").resolve():
        return space
    return inherit(space, load_space(DEFAULT_SPACE))


#: the sequence length from which `chosen_space` takes the long-context space's knobs: that space's
#: own range (search_spaces/long-context.yaml: "Long sequences (32K-1M tokens)")
LONG_CONTEXT_SEQ = 32 * 1024


def chosen_space(is_moe: bool, seq_len: int) -> SearchSpace:
    """The space `autopar search` uses when --space is not given: the default space, with the moe
    space's knobs for an MoE model and the long-context space's from LONG_CONTEXT_SEQ tokens on
    (both: moe's, then long-context's on top, `compose`)."""
    names = (["moe"] if is_moe else []) + (["long-context"] if seq_len >= LONG_CONTEXT_SEQ else [])
    why = ", ".join(
        (["an MoE model"] if is_moe else [])
        + ([f"seq {seq_len:,} >= {LONG_CONTEXT_SEQ:,}"] if "long-context" in names else [])
    )
    space = compose(names) if names else load_space(DEFAULT_SPACE)
    return replace(space, chosen_because=f"chosen for {why}" if why else "chosen for a dense model below seq 32,768")


def compose(names: list[str]) -> SearchSpace:
    """The default space with each named shipped space's knobs and constraints that differ from the
    default's laid over it, in order (a later space wins a knob both set): moe + long-context keeps
    moe's expert knobs (etp, ep_comm_overlap, ep_within) and takes long-context's cp, pp, vpp, mbs."""
    if len(names) == 1:
        return load_space(names[0])
    base = load_space(DEFAULT_SPACE)
    knobs, cons = dict(base.knobs), dict(base.constraints)
    for name in names:
        sp = load_space(name)
        knobs |= {k: v for k, v in sp.knobs.items() if k not in sp.inherited and base.knobs.get(k) != v}
        cons |= {k: v for k, v in sp.constraints.items() if k not in sp.inherited and base.constraints.get(k) != v}
    description = "The default space with the knobs of " + ", then ".join(names)
    return SearchSpace("+".join(names), description, knobs, cons, "+".join(names))
