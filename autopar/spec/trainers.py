"""The trainers autopar plans for, and what each can run (data/trainers.toml).

A trainer is part of the question: Megatron-LM, NeMo 2 and Megatron-Bridge run Megatron-Core;
torchtitan runs PyTorch's own parallelism; DeepSpeed runs Megatron-DeepSpeed. Each has one
capability table, kept as data with the source of every line; `autopar.spec.trainer_rules` turns it
into the vectorised rules both the search and the exporters apply, so they cannot disagree.

The default trainer is Megatron-LM: Megatron-Core is the engine of Megatron-LM, NeMo and
Megatron-Bridge, which ran most published large-scale trainings (and most of the calibration runs),
and it has every parallelism autopar models (1F1B and interleaved schedules, CP, EP with ETP, FP8,
TP-communication overlap, partial recompute).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from autopar.errors import InputError, did_you_mean, quoted

TRAINERS = ("megatron", "nemo", "bridge", "torchtitan", "deepspeed")  # the production trainers
BUILTIN = "autopar"  # autopar's own parallel transformer: what the measured stage runs
ALL_TRAINERS = TRAINERS + (BUILTIN,)
DEFAULT_TRAINER = "megatron"
#: every capability kind a trainer entry must state (interpreted by autopar.spec.trainer_rules)
KINDS = (
    "pp_schedules",
    "uneven_stages",
    "zero_stages",
    "zero_stages_with_pp",
    "zero0_with_cp",
    "cp",
    "moe",
    "moe_dispatch",
    "moe_dispatcher",
    "ep_comm_overlap",
    "deepep_capacity",
    "etp",
    "ep_in_fsdp",
    "moe_bias_etp1",
    "fp8",
    "fp8_param_gather",
    "fp32",
    "tp_comm_overlap",
    "compile",
    "sp_off",
    "recompute",
    "partial_recompute",
    "bf16_main_grads",
    "hsdp",
    "recompute_modules",
    "optimizer_offload",
    "partial_optimizer_offload",
    "activation_offload",
    "zero_bubble_rounds",
    "attention_variants",
)


@dataclass(frozen=True)
class Capability:
    kind: str
    value: Any  # the TOML value: a bool, number, string, list or table, by kind
    source: str  # the trainer file or document this line comes from
    instead: str  # what to use instead when a plan needs more than the value allows


@dataclass(frozen=True)
class Trainer:
    key: str
    title: str
    engine: str
    profile: str  # the performance profile (autopar.cost.profiles)
    source: str
    capabilities: dict[str, Capability]
    recipes: Capability | None = None  # preset -> recipe name; None = every model runs

    def cap(self, kind: str) -> Capability:
        return self.capabilities[kind]

    def recipe_for(self, model_name: str) -> str | None:
        return None if self.recipes is None else self.recipes.value.get(model_name)


@cache
def _table() -> dict[str, dict]:
    return tomllib.loads(resources.files("autopar.spec").joinpath("data/trainers.toml").read_text())


@cache
def trainers() -> dict[str, Trainer]:
    """Every trainer of the table, inherited entries resolved."""
    raw = _table()
    out = {}
    for key in ALL_TRAINERS:
        entry = dict(raw[key])
        base = dict(raw[entry["inherit"]]) if "inherit" in entry else {}
        merged = {k: v for k, v in base.items() if isinstance(v, dict)} | {
            k: v for k, v in entry.items() if isinstance(v, dict)
        }
        missing = [k for k in KINDS if k not in merged]
        if missing:  # a table error, caught by the tests, never a user's
            raise ValueError(f"trainers.toml: {key} lacks {missing}")
        caps = {k: Capability(k, merged[k]["value"], merged[k]["source"], merged[k]["instead"]) for k in KINDS}
        rec = merged.get("recipes")
        out[key] = Trainer(
            key=key,
            title=entry["title"],
            engine=entry["engine"],
            profile=entry["profile"],
            source=entry["source"],
            capabilities=caps,
            recipes=Capability("recipes", rec["value"], rec["source"], rec["instead"]) if rec else None,
        )
    return out


def get_trainer(name: str) -> Trainer:
    """A trainer by name; an unknown one is one line with "did you mean" and the choices."""
    key = str(name).strip().lower()
    table = trainers()
    if key not in table:
        raise InputError(
            f"unknown trainer '{name}'{did_you_mean(key, ALL_TRAINERS)}; choose one of {', '.join(ALL_TRAINERS)}"
        )
    return table[key]


def default_trainer(gpu_key: str) -> str:
    """The trainer a plan runs on when none is named: Megatron-LM (module docstring), or on this
    machine's CPU profile (`--gpu local`) autopar's built-in model, which is what its trials run."""
    return BUILTIN if gpu_key == "local" else DEFAULT_TRAINER


def parse_trainers(text: str | None, gpu_key: str = "") -> tuple[str, ...]:
    """`--trainer T` or a comma list; None = every production trainer (the built-in model on
    `--gpu local`)."""
    if text is None:
        return (BUILTIN,) if gpu_key == "local" else TRAINERS
    names = [x.strip() for x in str(text).split(",")]
    if not any(names):
        raise InputError(f"--trainer needs a trainer name, e.g. --trainer megatron; choose from {', '.join(TRAINERS)}")
    if not all(names):
        raise InputError(
            f"--trainer {quoted(text)} has an empty item; give a comma list without empty items, e.g. "
            f"--trainer megatron,nemo"
        )
    return tuple(dict.fromkeys(get_trainer(n).key for n in names))


#: what `--recipe` names, per trainer that starts from a recipe
RECIPE_EXAMPLE = "llama3_70b (NeMo 2) or llama3_70b_pretrain_config (Megatron-Bridge)"


def parse_recipes(text: str | None, searched: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`--recipe NAME` (for the one searched trainer that starts from a recipe) or
    `--recipe nemo=NAME,bridge=NAME`: (trainer, recipe) pairs, each recipe a Python name (it is
    pasted into an import line or a command). A recipe stands in for the trainer's preset -> recipe
    line, so a model without a preset can run on it."""
    from autopar.quoting import check_identifier

    if text is None:
        return ()
    takes = [t for t in searched if trainers()[t].recipes is not None]
    if not takes:
        starts = ", ".join(k for k in TRAINERS if trainers()[k].recipes is not None)
        raise InputError(
            f"--recipe is for the trainers that start from a recipe ({starts}), and none is searched; "
            f"add --trainer {starts.split(', ')[0]}, or drop --recipe"
        )
    items = [x.strip() for x in str(text).split(",")]
    if not all(items):
        raise InputError(f"--recipe {quoted(text)} has an empty item; give NAME or nemo=NAME,bridge=NAME")
    pairs: dict[str, str] = {}
    for item in items:
        trainer, sep, name = item.rpartition("=") if "=" in item else ("", "", item)
        if not sep:
            if len(takes) != 1 or len(items) != 1:
                raise InputError(
                    f"--recipe {quoted(item)} names no trainer, and the question searches "
                    f"{len(takes)} trainers that start from one ({', '.join(takes)}); give "
                    f"--recipe {'=NAME,'.join(takes)}=NAME"
                )
            trainer = takes[0]
        key = trainer.strip().lower()
        if key not in takes:
            raise InputError(
                f"--recipe {quoted(item)}: {key or 'no trainer'} is not a searched trainer that starts from a "
                f"recipe; name one of {', '.join(takes)}"
            )
        if key in pairs:
            raise InputError(f"--recipe names two recipes for {key}; give one")
        pairs[key] = check_identifier(name.strip(), "--recipe", example=RECIPE_EXAMPLE)
    return tuple(pairs.items())
