"""What a published run's cells say in the words of a ParallelPlan: the recompute modules a
`recompute` cell lists and the activations it offloads. Read by the run-case builder
(autopar.calibration.run_plan) and the memory facts of a row (autopar.calibration.memory_facts)."""

from __future__ import annotations

import re

from autopar.spec.offload_modules import OFFLOAD_MODULES

#: the words of the calibration rows' `recompute` cells -> Megatron-Core recompute modules
_WORDS = (
    (r"\bcore_attn", "core_attn"),
    (r"\b(layer|rms)?norm\b", "layernorm"),
    (r"\bmoe_act\b|(?<![\w_])act\b", "moe_act"),
    (r"(?<![\w_])moe(?![\w_])", "moe"),
    (r"(?<![\w_])mlp\b", "mlp"),
    (r"mla[ _]up_proj|mla up-projection|(?<![\w_])up_proj\b", "mla_up_proj"),
    (r"shared_experts", "shared_experts"),
)


def _listed_and_offloaded(text: str) -> tuple[str, str]:
    t = text.lower()
    if t.startswith(("full", "none", "not stated")) or not t.strip():
        return "", ""
    listed, _, offload = (t.split(":", 1)[1] if t.startswith("selective:") else t).partition("offloading")
    return re.split(r";|\(b\.2|table \d+", listed)[0], offload  # the row's own list, not a second table's


def row_recompute_modules(text: str) -> tuple[str, ...]:
    """The Megatron-Core recompute modules a `recompute` cell lists ("selective: norm, act",
    "moe_act, layernorm (B.2)"), in registry order; () for full, none or a bare "selective"
    (Megatron's default, core_attn)."""
    listed, _ = _listed_and_offloaded(text)
    return tuple(m for pattern, m in _WORDS if re.search(pattern, listed))


def row_offloaded(text: str) -> tuple[str, ...]:
    """The Megatron-Core offload modules (autopar.spec.offload_modules) a `recompute` cell offloads
    (after "offloading"), in registry order."""
    _, offload = _listed_and_offloaded(text)
    return tuple(m for m in OFFLOAD_MODULES if re.search(rf"\b{m}\b", offload))
