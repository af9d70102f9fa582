"""The cost model's constants (CostConstants) and the one table of their meaning, prior, range and
sources (data/constants.toml). A constant's default is its prior; a trainer profile
(autopar.cost.profiles) holds its fitted values; `ConstantSpec.for_profile` gives a profile its own
prior and range where its trainer's mechanism differs."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources

from autopar.errors import InputError

KINDS = ("fitted", "fact", "link", "memory", "setting")  # setting: a trainer's documented default, any size


@dataclass(frozen=True)
class ConstantSpec:
    name: str
    kind: str
    meaning: str
    prior: float
    low: float
    high: float
    source: str
    profiles: dict  # profile -> {prior, low, high, source}

    def for_profile(self, profile: str, parents: tuple[str, ...] = ()) -> "ConstantSpec":
        """This constant as `profile` has it: its own prior, range and source if the table gives
        them, else its nearest parent's that has them (a profile runs its parent's kernels unless
        the table says otherwise), else the shared ones."""
        own = next((self.profiles[p] for p in (profile, *parents) if p in self.profiles), None)
        if not own:
            return self
        return ConstantSpec(
            self.name, self.kind, self.meaning, own["prior"], own["low"], own["high"], own["source"], {}
        )


@cache
def constant_table() -> dict[str, ConstantSpec]:
    raw = tomllib.loads(resources.files("autopar.spec").joinpath("data/constants.toml").read_text())
    out = {}
    for name, e in raw.items():
        spec = ConstantSpec(
            name,
            e["kind"],
            e["meaning"],
            float(e["prior"]),
            float(e["low"]),
            float(e["high"]),
            e["source"],
            dict(e.get("profiles", {})),
        )
        for s in (spec, *(spec.for_profile(p) for p in spec.profiles)):
            if spec.kind not in KINDS or not s.low <= s.prior <= s.high:
                raise ValueError(f"constants.toml: [{name}] prior {s.prior} outside [{s.low}, {s.high}] or bad kind")
        out[name] = spec
    return out


def _prior(name: str) -> float:
    return constant_table()[name].prior


@dataclass(frozen=True, kw_only=True)
class CostConstants:
    """The constants a performance profile sets (data/constants.toml says what each means, its
    prior and its range): efficiencies are fractions of the GPU's published kernel and link rates
    (autopar.spec.behaviour), never of the datasheet peak."""

    gemm_efficiency: float = _prior("gemm_efficiency")
    fp8_gemm_efficiency: float = _prior("fp8_gemm_efficiency")
    expert_gemm_efficiency: float = _prior("expert_gemm_efficiency")
    attention_efficiency: float = _prior("attention_efficiency")
    elementwise_traffic_factor: float = _prior("elementwise_traffic_factor")
    layer_overhead_us: float = _prior("layer_overhead_us")
    moe_layer_overhead_us: float = _prior("moe_layer_overhead_us")
    expert_launch_us: float = _prior("expert_launch_us")
    host_launch_us: float = _prior("host_launch_us")
    tp_overlap: float = _prior("tp_overlap")
    tp_backward_overlap: float = _prior("tp_backward_overlap")
    ep_overlap: float = _prior("ep_overlap")
    pp_overlap: float = _prior("pp_overlap")
    dp_overlap: float = _prior("dp_overlap")
    attention_flash: float = _prior("attention_flash")
    attention_mma_sync: float = _prior("attention_mma_sync")
    attention_fa1: float = _prior("attention_fa1")
    triton_attention_rate: float = _prior("triton_attention_rate")
    cp_ring_overlap: float = _prior("cp_ring_overlap")
    cp_kv_all_gather: float = _prior("cp_kv_all_gather")
    cp_grad_fp32: float = _prior("cp_grad_fp32")
    attention_repeat_kv: float = _prior("attention_repeat_kv")
    host_link_efficiency: float = _prior("host_link_efficiency")
    cpu_adam_memory_efficiency: float = _prior("cpu_adam_memory_efficiency")
    cpu_optimizer_overlap: float = _prior("cpu_optimizer_overlap")
    tp_async_backward: float = _prior("tp_async_backward")
    sp_backward_regather: float = _prior("sp_backward_regather")
    pp_scatter_gather: float = _prior("pp_scatter_gather")
    fsdp_copy_traffic: float = _prior("fsdp_copy_traffic")
    per_expert_gemms: float = _prior("per_expert_gemms")
    expert_host_launch_us: float = _prior("expert_host_launch_us")
    zero1_rank_copies: float = _prior("zero1_rank_copies")
    dp_bucket_params: float = _prior("dp_bucket_params")
    dp_bucket_params_per_rank: float = _prior("dp_bucket_params_per_rank")
    dp_unit_sharding: float = _prior("dp_unit_sharding")
    intra_node_bw_efficiency: float = _prior("intra_node_bw_efficiency")
    inter_node_bw_efficiency: float = _prior("inter_node_bw_efficiency")
    runtime_reserved_gib: float = _prior("runtime_reserved_gib")
    allocator_overhead_fraction: float = _prior("allocator_overhead_fraction")

    def __post_init__(self) -> None:
        table = constant_table()
        for f in fields(self):
            v = getattr(self, f.name)
            fraction = table[f.name].kind == "fact" or f.name.endswith("_overlap")
            hi = 1.0 if fraction else 1.5 if f.name.endswith("_efficiency") else float("inf")
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or not 0 <= v <= hi:
                raise InputError(
                    f"cost constant '{f.name}' must be a number in [0, {hi:g}], got {v!r}; fix the cluster profile"
                )
            if (f.name.endswith("_efficiency") or f.name == "dp_bucket_params") and v <= 0:
                raise InputError(f"cost constant '{f.name}' must be positive; fix the cluster profile")


def check_table_matches_fields() -> None:
    """The table and the dataclass declare the same constants (a data error, caught by the tests)."""
    names = {f.name for f in fields(CostConstants)}
    if names != set(constant_table()):
        raise ValueError(f"constants.toml and CostConstants differ: {sorted(names ^ set(constant_table()))}")
