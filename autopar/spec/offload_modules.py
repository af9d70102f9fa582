"""Megatron-Core's fine-grained activation offloading: the modules whose inputs `--fine-grained-
activation-offloading --offload-modules ...` moves to host memory in the forward and back before the
backward (megatron-core 0.16 megatron/core/transformer/transformer_config.py
`fine_grained_activation_offloading`, `offload_modules`, validated in `TransformerConfig.__post_init__`;
the copies run on their own device-to-host and host-to-device streams,
megatron/core/pipeline_parallel/fine_grained_activation_offload.py `PipelineOffloadManager`).

The plan's `offload_modules` (autopar.spec.plan) is a set of these names, held in a table as a
bitmask (bit i = `OFFLOAD_MODULES[i]`); none = no offloading. The cost model prices each module by
the saved tensors it moves off the GPU (autopar.cost.stack_activations) and the host-link seconds
the copies leave exposed (autopar.cost.activation_offload).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autopar.spec.recompute_modules import RECOMPUTE_MODULES


@dataclass(frozen=True)
class OffloadModule:
    name: str
    short: str  # its name in narrow tables
    what: str  # the saved tensor that leaves the GPU (transformer_config.py docstring)
    needs: str = ""  # "moe": the model part it needs


#: in bit order (the tables' bitmask; do not reorder)
MODULES: tuple[OffloadModule, ...] = (
    OffloadModule("attn_norm", "anorm", "the input of the attention's norm (the layer input)"),
    OffloadModule("qkv_linear", "qkv", "the input of the QKV projection (the normed layer input)"),
    OffloadModule("core_attn", "attn", "the input of the core attention (Q, K and V)"),
    OffloadModule("attn_proj", "proj", "the input of the attention's output projection (the attention output)"),
    OffloadModule("mlp_norm", "mnorm", "the input of the MLP's norm (the residual after the attention)"),
    OffloadModule("expert_fc1", "fc1", "the input of the experts' fc1 (the dispatched tokens)", "moe"),
    OffloadModule("moe_act", "act", "the input of the expert activation (the fc1 output)", "moe"),
)
OFFLOAD_MODULES = tuple(m.name for m in MODULES)
OFFLOAD_BITS = {m.name: 1 << i for i, m in enumerate(MODULES)}
#: where the offload bits sit in the activation terms' one bitmask (autopar.cost.stack_activations):
#: after the recompute modules' bits
SHIFT = len(RECOMPUTE_MODULES)
SOURCE = "megatron/core/transformer/transformer_config.py offload_modules (megatron-core 0.16)"


class OffloadModulesError(ValueError):
    """A module list that names no Megatron-Core offload module, or one Megatron-Core refuses."""


def parse_offload_modules(value) -> tuple[str, ...]:
    """The modules of a comma list ("expert_fc1,moe_act"), a list of names or a bitmask, in registry
    order, each once; raises OffloadModulesError naming an unknown one, or attn_proj without
    core_attn (Megatron-Core refuses it: attn_proj's input is core_attn's output, which
    core_attn's backward needs on the GPU)."""
    if isinstance(value, bool):
        raise OffloadModulesError(f"offload modules must be names, got {value!r}")
    if isinstance(value, int):
        if value < 0 or value >> len(MODULES):
            raise OffloadModulesError(f"offload-module bitmask {value} has bits beyond the {len(MODULES)} modules")
        names = tuple(m for m in OFFLOAD_MODULES if value & OFFLOAD_BITS[m])
    elif isinstance(value, str) and value.strip() in ("", "none"):
        names = ()  # a space file's "none"
    else:
        raw: Iterable = value.split(",") if isinstance(value, str) else value
        given = [str(n).strip() for n in raw if str(n).strip()]
        unknown = [n for n in given if n not in OFFLOAD_BITS]
        if unknown:
            raise OffloadModulesError(
                f"--offload-modules names an unknown module {unknown[0]!r}; Megatron-Core's are "
                f"{', '.join(OFFLOAD_MODULES)}"
            )
        names = tuple(m for m in OFFLOAD_MODULES if m in given)
    if "attn_proj" in names and "core_attn" not in names:
        raise OffloadModulesError(
            "offloading attn_proj needs core_attn too (its input is core_attn's output, which core_attn's "
            "backward needs): add core_attn"
        )
    return names


def offload_mask(names: Iterable[str]) -> int:
    """The bitmask of module names."""
    mask = 0
    for n in names:
        mask |= OFFLOAD_BITS[n]
    return mask


def lacking_offload(model) -> int:
    """The modules (bitmask) whose part of a layer the model (a ModelSpec) lacks: the expert inputs
    of a model without MoE layers."""
    no_moe = model.moe is None or model.num_moe_layers == 0
    return offload_mask(m.name for m in MODULES if m.needs == "moe" and no_moe)


def offload_label(modules) -> str:
    """A plan's offloaded modules for a narrow table: fc1+act, or "" for none."""
    names = parse_offload_modules(int(modules)) if not isinstance(modules, (tuple, list)) else modules
    short = {m.name: m.short for m in MODULES}
    return "+".join(short[n] for n in names)
