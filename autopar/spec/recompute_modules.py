"""Megatron-Core's selective recompute modules: what `--recompute-granularity selective
--recompute-modules ...` checkpoints (megatron-core 0.16 megatron/core/transformer/transformer_config.py
`recompute_modules`, validated in `TransformerConfig.__post_init__`).

The plan's `recompute_modules` (autopar.spec.plan) is a set of these names, held in a table as a
bitmask (bit i = `RECOMPUTE_MODULES[i]`). It is read only with `recompute = "selective"`, as in
Megatron-Core, whose default list is ["core_attn"]: the plan's plain "selective" is that default
(None), so existing plans mean what they meant. The cost model prices each module by what it drops
from the stored activations (autopar.cost.stack_activations) and by the forward it runs again
(autopar.cost.compute.module_recompute).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RecomputeModule:
    name: str
    short: str  # its name in narrow tables
    what: str  # what the module's checkpoint recomputes (transformer_config.py docstring)
    needs: str = ""  # "moe" | "mla" | "shared_experts" | "dense_mlp": the model part it needs


#: in bit order (the calibration rows' and the tables' bitmask; do not reorder)
MODULES: tuple[RecomputeModule, ...] = (
    RecomputeModule("core_attn", "attn", "the core attention (softmax(QK^T)V); Megatron's default"),
    RecomputeModule("layernorm", "norm", "the input and pre-MLP norms (output-discarding: their outputs are rebuilt)"),
    RecomputeModule("moe_act", "act", "the expert activation function (output-discarding)", "moe"),
    RecomputeModule("moe", "moe", "the whole MoE layer: router, dispatch, experts, combine", "moe"),
    RecomputeModule("mlp", "mlp", "the dense MLP of the dense layers", "dense_mlp"),
    RecomputeModule(
        "mla_up_proj", "up", "MLA's query and key/value up-projections and RoPE (output-discarding)", "mla"
    ),
    RecomputeModule("shared_experts", "shared", "the shared experts of the MoE layers", "shared_experts"),
)
RECOMPUTE_MODULES = tuple(m.name for m in MODULES)
MODULE_BITS = {m.name: 1 << i for i, m in enumerate(MODULES)}
#: Megatron-Core's recompute_modules when none is given (TransformerConfig.__post_init__)
DEFAULT_SELECTIVE = ("core_attn",)
SOURCE = "megatron/core/transformer/transformer_config.py recompute_modules (megatron-core 0.16)"


class ModulesError(ValueError):
    """A module list that names no Megatron-Core recompute module."""


def parse_modules(value) -> tuple[str, ...]:
    """The modules of a comma list ("core_attn,moe_act"), a list of names or a bitmask, in
    registry order, each once; raises ModulesError naming an unknown one."""
    if isinstance(value, bool):
        raise ModulesError(f"recompute modules must be names, got {value!r}")
    if isinstance(value, int):
        if value < 0 or value >> len(MODULES):
            raise ModulesError(f"recompute-module bitmask {value} has bits beyond the {len(MODULES)} modules")
        return tuple(m for m in RECOMPUTE_MODULES if value & MODULE_BITS[m])
    names: Iterable = value.split(",") if isinstance(value, str) else value
    given = [str(n).strip() for n in names if str(n).strip()]
    unknown = [n for n in given if n not in MODULE_BITS]
    if unknown:
        raise ModulesError(
            f"--recompute-modules names an unknown module {unknown[0]!r}; Megatron-Core's are "
            f"{', '.join(RECOMPUTE_MODULES)}"
        )
    return tuple(m for m in RECOMPUTE_MODULES if m in given)


def modules_mask(names: Iterable[str]) -> int:
    """The bitmask of module names."""
    mask = 0
    for n in names:
        mask |= MODULE_BITS[n]
    return mask


#: what a module needs of the model, in words (RecomputeModule.needs)
NEEDS = {
    "moe": "a mixture-of-experts model",
    "mla": "multi-latent attention (MLA)",
    "shared_experts": "MoE layers with shared experts",
    "dense_mlp": "dense (non-MoE) layers",
}


def lacking_modules(model) -> int:
    """The modules (bitmask) whose part of a layer the model (a ModelSpec) lacks: Megatron-Core
    asserts mla_up_proj needs multi_latent_attention and moe_act the grouped expert GEMMs
    (transformer_config.py); a module with nothing to checkpoint is refused too."""
    moe = model.moe
    no_moe = moe is None or model.num_moe_layers == 0
    lacks = {
        "moe": no_moe,
        "mla": model.mla is None,
        "shared_experts": no_moe or not moe.shared_expert_ffn_hidden_size,
        "dense_mlp": model.num_dense_layers == 0,
    }
    return modules_mask(m.name for m in MODULES if m.needs and lacks[m.needs])


def modules_text(names: Iterable[str]) -> str:
    """The names as Megatron's flag takes them: core_attn,moe_act."""
    return ",".join(names)


def recompute_legend(labels) -> str | None:
    """'sel:A+B: selective recompute of the modules norm layernorm, up mla_up_proj': each short
    name the `labels` (recompute_label's) use, once, with its module; None when none is abbreviated."""
    short = {m.short: m.name for m in MODULES}
    used = dict.fromkeys(x for label in labels if str(label).startswith("sel:") for x in str(label)[4:].split("+"))
    if not used:
        return None
    return "sel:A+B: selective recompute of the modules " + ", ".join(f"{x} {short.get(x, x)}" for x in used)


def recompute_label(recompute: str, modules) -> str:
    """A plan's recompute for a narrow table: none, full, selective (the default modules), or
    sel:act+norm (its modules' short names)."""
    names = parse_modules(int(modules)) if modules is not None and not isinstance(modules, (tuple, list)) else modules
    if recompute != "selective" or not names or tuple(names) == DEFAULT_SELECTIVE:
        return recompute
    short = {m.name: m.short for m in MODULES}
    return "sel:" + "+".join(short[n] for n in names)
