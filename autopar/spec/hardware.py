"""Hardware: GPU presets (data/gpus.toml) and the cluster they sit in; the cost model's constants
(autopar.spec.constants.CostConstants, re-exported here) a cluster file may pin (a "hardware
profile" is a cluster YAML with them filled in)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path

from autopar.errors import InputError, did_you_mean, quoted
from autopar.spec.constants import CostConstants  # noqa: F401 (re-exported: the cost model imports it from here)
from autopar.spec.curves import MeasuredBehaviour
from autopar.spec.reliability import Reliability
from autopar.spec.schema import MAX_GPUS_PER_NODE, MAX_NAME_CHARS, check_int, check_name, check_number

GIB = 1024**3
#: the programs whose allocation the memory model knows (autopar.cost.memory_stacks: "megatron" and
#: "torch" are the profiles' short names, for Megatron-Core and the built-in model)
TRAINING_STACKS = (
    "megatron",
    "torch",
    "megatron-core",
    "nemo-bridge",
    "megatron-deepspeed",
    "torchtitan",
    "torchtitan-default",
    "automodel",
    "torchtitan-fused-norm",
    "autopar-builtin",
    "nanotron",
    "llm-foundry",
    "fms-fsdp",
    "meta-4d",
)


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    key: str
    name: str
    bf16_tflops: float  # dense peak
    fp8_tflops: float  # dense peak; 0 = no FP8
    hbm_gib: float
    hbm_gbps: float
    intra_node_gbps: float  # per GPU per direction (per link when topology is full-mesh)
    nic_gbps: float  # scale-out, per GPU per direction
    gpus_per_node: int = 8
    intra_node_topology: str = "switch"  # "switch" (NVSwitch) | "full-mesh" (MI300X xGMI)
    #: the architecture ("ampere", "hopper", "blackwell", "cdna3"; "" = not stated): published runs
    #: on one GPU of a generation calibrate plans on the others (autopar.calibration.uncertainty)
    generation: str = ""
    #: GPU <-> host memory, per GPU per direction (PCIe x16 or NVLink-C2C); None = not stated, and a
    #: plan that offloads to host memory cannot be priced on this GPU
    host_link_gbps: float | None = None
    #: host DRAM bandwidth per GPU (the node's CPU memory channels / GPUs per node), what a CPU
    #: optimizer step streams through; None = not stated
    host_memory_gbps: float | None = None
    #: where the two host figures come from
    host_source: str = ""
    source: str = ""
    #: the board power its published figures were measured at (W; None = not stated)
    tdp_w: float | None = None
    #: the power limit it runs under (W; None = its TDP): compute-bound kernels slow down with the
    #: clock under a cap (`compute_clock_factor`), memory-bound ones barely move
    power_limit_w: float | None = None

    def __post_init__(self) -> None:
        what = f"gpu {quoted(self.key)}" if isinstance(self.key, str) else "gpu"
        for f in ("key", "name", "source", "generation", "host_source"):
            check_name(getattr(self, f), f"{what}: {f}", MAX_NAME_CHARS if "source" not in f else 1024)
        for f, hi in _GPU_LIMITS.items():
            if getattr(self, f) is None and f in _OPTIONAL_GPU_FIGURES:
                continue
            check_number(
                getattr(self, f), f"{what}: {f}", 0.0, hi, above=f not in ("fp8_tflops",), fix="fix the cluster file"
            )
        check_int(self.gpus_per_node, f"{what}: gpus_per_node", 1, MAX_GPUS_PER_NODE, fix="fix the cluster file")
        if self.intra_node_topology not in ("switch", "full-mesh"):
            raise InputError(
                f"{what}: intra_node_topology must be 'switch' or 'full-mesh', got "
                f"{quoted(self.intra_node_topology)}; fix the cluster file"
            )

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * GIB

    @property
    def power_w(self) -> float | None:
        """The board power it draws training: its limit (dense training holds a GPU at its power
        limit: an H100's GEMMs are power-limited even at 700 W, DeepGEMM issue #120), else its TDP."""
        return self.power_limit_w if self.power_limit_w is not None else self.tdp_w

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for the GEMM dtype."""
        return (self.fp8_tflops if dtype == "fp8" else self.bf16_tflops) * 1e12


#: GpuSpec's figures -> the largest value a cluster file may give (all above 0; fp8_tflops 0 = no FP8)
_GPU_LIMITS = {
    "bf16_tflops": 1e6,
    "fp8_tflops": 1e6,
    "hbm_gib": 1e6,
    "hbm_gbps": 1e8,
    "intra_node_gbps": 1e7,
    "nic_gbps": 1e7,
    "host_link_gbps": 1e6,
    "host_memory_gbps": 1e6,
    "tdp_w": 1e5,
    "power_limit_w": 1e5,
}
#: the GpuSpec figures a preset or cluster file may leave unstated (None)
_OPTIONAL_GPU_FIGURES = ("host_link_gbps", "host_memory_gbps", "tdp_w", "power_limit_w")

#: throughput of compute-bound kernels under a power cap against the TDP's, (cap / TDP) ** exponent:
#: power is convex in the clock, so the first watts removed cost little. Fitted to the published
#: pairs down to half the TDP (H100 MLPerf MaxQ 0.47-0.49, A100 Perseus clock sweeps 0.34-0.58,
#: Blackwell B100/B200/GB200 specifications 0.58-0.70, H100 500 W DGEMM clock 0.63): about 0.5,
#: with that spread (a pair is within 8 % of it). Deeper caps cost more: at 36 % of the TDP the
#: GB300's GEMM rate falls about linearly with the power (exponent near 1), below POWER_KNEE.
POWER_EXPONENT = 0.5
POWER_EXPONENT_DEEP = 1.0
POWER_KNEE = 0.4


def compute_clock_factor(gpu: GpuSpec) -> float:
    """The share of its published compute rates a GPU keeps under its power limit (1 at or above
    its TDP, or where either is not stated)."""
    if gpu.power_limit_w is None or gpu.tdp_w is None or gpu.power_limit_w >= gpu.tdp_w:
        return 1.0
    r = gpu.power_limit_w / gpu.tdp_w
    if r >= POWER_KNEE:
        return r**POWER_EXPONENT
    return POWER_KNEE**POWER_EXPONENT * (r / POWER_KNEE) ** POWER_EXPONENT_DEEP


#: ClusterSpec's figures -> the largest value
_CLUSTER_LIMITS = {
    "intra_node_gbps": 1e7,
    "inter_node_gbps": 1e7,
    "intra_node_latency_us": 1e7,
    "inter_node_latency_us": 1e7,
}


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    gpu: GpuSpec
    gpus_per_node: int
    intra_node_gbps: float
    inter_node_gbps: float
    intra_node_topology: str = "switch"
    intra_node_latency_us: float = 3.0  # [assumed] NCCL per-step latency over NVLink
    inter_node_latency_us: float = 8.0  # [assumed] NCCL per-step latency over IB
    constants: CostConstants = field(default_factory=CostConstants)
    #: the constants this cluster pins (a profile file's `constants:`, a calibration); every other
    #: constant comes from the trainer's performance profile (autopar.cost.profiles)
    pinned: frozenset = frozenset()
    name: str = ""
    #: the program trained, for its activation and buffer memory (autopar.cost.torch_stack):
    #: "megatron" (Megatron-Core with fused kernels, Korthikanti et al.'s accounting) or "torch"
    #: (PyTorch eager autograd + DTensor + FSDP2 + torch.distributed.pipelining: autopar's built-in
    #: trial model, torchtitan without compile). None = the trainer's (autopar.cost.profiles); the
    #: `local` profile pins "torch", where trials run the built-in model.
    training_stack: str | None = None
    #: interruptions, checkpoint bandwidth and restart time, for the time to train a whole run
    #: (autopar.cost.goodput); a cluster file's `reliability:` mapping
    reliability: Reliability = field(default_factory=Reliability)
    #: what `autopar probe` measured on this cluster, replacing the published (or derived) behaviour
    #: of its GPU (autopar.spec.behaviour); a cluster file's `behaviour:` mapping
    measured: MeasuredBehaviour = field(default_factory=MeasuredBehaviour)
    #: the power limit its GPUs run under (W; `--power-limit`, a cluster file's `power_limit_w`); None
    #: = the GPU's own (its preset's limit, else its TDP)
    power_limit_w: float | None = None

    def __post_init__(self) -> None:
        if self.power_limit_w is not None:
            check_number(self.power_limit_w, "cluster: power_limit_w", 0.0, 1e5, above=True, fix="give watts per GPU")
        if self.training_stack is None and self.gpu.key == LOCAL:
            object.__setattr__(self, "training_stack", "torch")
        if self.training_stack is not None and self.training_stack not in TRAINING_STACKS:
            raise InputError(
                f"cluster: training_stack must be one of {', '.join(TRAINING_STACKS)}, got "
                f"{quoted(self.training_stack)}"
            )
        check_int(self.gpus_per_node, "cluster: gpus_per_node", 1, MAX_GPUS_PER_NODE, fix="fix the cluster file")
        for f, hi in _CLUSTER_LIMITS.items():
            check_number(getattr(self, f), f"cluster: {f}", 0.0, hi, above=True, fix="fix the cluster file")
        check_name(self.name, "cluster: name")
        if self.intra_node_topology not in ("switch", "full-mesh"):
            raise InputError(
                f"cluster: intra_node_topology must be 'switch' or 'full-mesh', got {quoted(self.intra_node_topology)}"
            )

    @property
    def operating_gpu(self) -> GpuSpec:
        """Its GPU as it runs here: under the cluster's power limit where it sets one."""
        if self.power_limit_w is None or self.power_limit_w == self.gpu.power_limit_w:
            return self.gpu
        return replace(self.gpu, power_limit_w=self.power_limit_w)

    def with_constants(self, constants: CostConstants, **changes) -> "ClusterSpec":
        """This cluster with every constant set and pinned (a calibration: no profile overrides it)."""
        return replace(self, constants=constants, pinned=frozenset(f.name for f in fields(CostConstants)), **changes)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["gpu"] = self.gpu.key
        out["pinned"] = sorted(self.pinned)
        measured = out.pop("measured").items()  # curves as lists: a YAML or JSON file holds them
        out["behaviour"] = {k: list(v) if isinstance(v, tuple) else v for k, v in measured if v is not None}
        return out


@cache
def _gpu_table() -> dict[str, dict]:
    return tomllib.loads(resources.files("autopar.spec").joinpath("data/gpus.toml").read_text())


def gpu_names() -> list[str]:
    return list(_gpu_table())


def get_gpu(name: str) -> GpuSpec:
    table = _gpu_table()
    aliases = {k: k for k in table} | {a: k for k, row in table.items() for a in row.get("aliases", [])}
    key = aliases.get(name.lower()) if isinstance(name, str) else None
    if key is None:
        name = name if isinstance(name, str) else quoted(name)
        raise InputError(
            f"unknown GPU {quoted(name)}{did_you_mean(name, aliases)}; run `autopar hardware` "
            f"for the presets, or describe it in a --cluster YAML file"
        )
    row = {k: v for k, v in table[key].items() if k != "aliases"}
    return GpuSpec(key=key, **row)


def default_cluster(gpu: str | GpuSpec = "h100-sxm", gpus_per_node: int | None = None) -> ClusterSpec:
    """A cluster of identical nodes of the preset GPU: NVLink inside a node, one NIC per GPU."""
    if isinstance(gpu, str) and gpu.lower() == LOCAL:
        return local_cluster(gpus_per_node)
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if gpus_per_node is not None:
        check_int(gpus_per_node, "--gpus-per-node", 1, MAX_GPUS_PER_NODE, fix="change --gpus-per-node")
    return ClusterSpec(
        gpu=g,
        gpus_per_node=gpus_per_node or g.gpus_per_node,
        intra_node_gbps=g.intra_node_gbps,
        inter_node_gbps=g.nic_gbps,
        intra_node_topology=g.intra_node_topology,
        name=g.key,
    )


_CLUSTER_KEYS = {f.name for f in fields(ClusterSpec)} - {"constants", "reliability", "measured"}
#: the ClusterSpec figures a cluster file (or a saved cluster) may leave null
_OPTIONAL_CLUSTER_FIGURES = ("power_limit_w",)
_CONSTANT_KEYS = {f.name for f in fields(CostConstants)}


def cluster_from_dict(data: dict, origin: str = "cluster") -> ClusterSpec:
    """The cluster-file schema: `gpu` (preset name, or a mapping of GpuSpec fields), optional link
    figures overriding the preset's, an optional `constants` mapping (a calibrated profile) and an
    optional `reliability` mapping (interruptions, checkpoint bandwidth, restart time)."""
    if not isinstance(data, dict):
        raise InputError(f"{origin}: the top level must be a mapping of cluster fields")
    unknown = set(data) - _CLUSTER_KEYS - {"constants", "reliability", "behaviour"}
    if unknown:
        raise InputError(
            f"{origin}: unknown field(s) {_names(unknown)}; known: "
            f"{sorted(_CLUSTER_KEYS | {'constants', 'reliability', 'behaviour'})}"
        )
    reliability = Reliability.from_dict(data["reliability"], origin) if "reliability" in data else Reliability()
    measured = MeasuredBehaviour.from_dict(data["behaviour"], origin) if "behaviour" in data else MeasuredBehaviour()
    gpu_spec = _gpu_of(data.get("gpu", "h100-sxm"), origin)
    if data.get("gpus_per_node") is not None:
        check_int(data["gpus_per_node"], f"{origin}: gpus_per_node", 1, MAX_GPUS_PER_NODE, fix="fix the cluster file")
    cluster = default_cluster(gpu_spec, data.get("gpus_per_node"))
    consts = data.get("constants", {}) or {}
    if not isinstance(consts, dict):
        raise InputError(f"{origin}: 'constants' must be a mapping of constant -> number, got {quoted(consts)}")
    bad_consts = set(consts) - _CONSTANT_KEYS
    if bad_consts:
        raise InputError(f"{origin}: unknown constant(s) {_names(bad_consts)}; known: {sorted(_CONSTANT_KEYS)}")
    pinned = data.get("pinned")  # a saved cluster (ClusterSpec.to_dict): only these constants were set
    if pinned is not None:
        if not isinstance(pinned, list) or not all(isinstance(p, str) and p in _CONSTANT_KEYS for p in pinned):
            raise InputError(f"{origin}: 'pinned' must list constant names, got {quoted(pinned)}")
        consts = {k: v for k, v in consts.items() if k in pinned}
    overrides = {
        k: v
        for k, v in data.items()
        if k not in ("gpu", "constants", "gpus_per_node", "pinned", "reliability", "behaviour")
        and not (k in _OPTIONAL_CLUSTER_FIGURES and v is None)
    }
    for k, v in list(overrides.items()) + list(consts.items()):
        if k in ("name", "intra_node_topology", "training_stack"):
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise InputError(f"{origin}: '{k}' must be a number, got {quoted(v)}; fix the cluster file")
    try:
        return replace(
            cluster,
            **overrides,
            constants=replace(cluster.constants, **consts),
            pinned=cluster.pinned | frozenset(consts),
            reliability=reliability,
            measured=measured,
        )
    except InputError as e:
        raise InputError(f"{origin}: {str(e).removeprefix('cluster: ')}") from None


def _names(keys) -> str:
    """Unknown keys for a message: at most five, each quoted and cut."""
    shown = ", ".join(quoted(str(k), 40) for k in sorted(keys, key=str)[:5])
    return shown + (" ..." if len(keys) > 5 else "")


def _gpu_of(gpu: object, origin: str) -> GpuSpec:
    """A cluster file's `gpu`: a preset name, or a mapping of GpuSpec fields (with `base: PRESET`
    for the fields it does not give)."""
    if isinstance(gpu, str):
        return get_gpu(gpu)
    if not isinstance(gpu, dict):
        raise InputError(
            f"{origin}: 'gpu' must be a preset name or a mapping of GPU fields, got {quoted(gpu)}; e.g. gpu: h100-sxm"
        )
    base = get_gpu(check_name(gpu["base"], f"{origin}: gpu.base")) if "base" in gpu else None
    fields_ = {k: v for k, v in gpu.items() if k != "base"}
    known = {f.name for f in fields(GpuSpec)}
    unknown = [k for k in fields_ if k not in known]
    missing = (
        []
        if base
        else [f.name for f in fields(GpuSpec) if f.name not in fields_ and f.name != "key" and f.default is MISSING]
    )
    if unknown or missing:
        what = (
            f"unknown field(s) {', '.join(quoted(str(k), 40) for k in unknown[:5])}"
            if unknown
            else f"missing field(s) {', '.join(missing)}"
        )
        raise InputError(
            f"{origin}: gpu mapping has {what}; give `base: h100-sxm` plus the fields to change "
            f"(known: {', '.join(sorted(known))})"
        )
    try:
        return replace(base, **fields_) if base else GpuSpec(key=fields_.pop("key", "custom"), **fields_)
    except InputError as e:
        raise InputError(f"{origin}: {e}") from None


#: the preset a probed GPU takes its datasheet figures from, by a fragment of its CUDA device name
#: (torch.cuda.get_device_name: 'NVIDIA H200', 'NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-80GB');
#: most specific first. PCIe and NVL cards have other peaks than the SXM presets: none of these.
DEVICE_PRESETS = (
    ("GB300", "gb300"),
    ("GB200", "gb200"),
    ("B200", "b200"),
    ("H200", "h200"),
    ("H800", "h800"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("MI300X", "mi300x"),
)


def preset_for_device(device_name: str) -> str | None:
    """The GPU preset of a CUDA device name, or None where no preset describes that card."""
    if "PCIe" in device_name or device_name.rstrip().endswith(" NVL"):
        return None
    return next((key for fragment, key in DEVICE_PRESETS if fragment in device_name), None)


def load_cluster_file(path: str | Path) -> ClusterSpec:
    from autopar.spec.yaml_io import load_yaml

    data = load_yaml(path, f"cluster file '{path}'")
    return cluster_from_dict(data, origin=f"cluster file '{path}'")


# ---- `--gpu local`: this machine, as `autopar probe` measured it ---------------------------------

LOCAL = "local"

#: the CPU profile used until `autopar probe` has written one: [assumed] figures for one core per
#: rank (fp32 GEMMs; the cost model runs fp32 at half its `bf16_tflops`), memory in RAM, links in
#: shared memory (gloo). No runtime reservation (the torch runtime is not tensor memory) and a
#: small allocator allowance.
LOCAL_DEFAULTS: dict = {
    "name": "local (unprobed defaults)",
    "gpu": {
        "key": LOCAL,
        "name": "this machine (CPU, one core per rank)",
        "bf16_tflops": 0.1,
        "fp8_tflops": 0.0,
        "hbm_gib": 4.0,
        "hbm_gbps": 10.0,
        "intra_node_gbps": 2.0,
        "nic_gbps": 2.0,
        "gpus_per_node": max(1, os.cpu_count() or 1),
        "source": "autopar LOCAL_DEFAULTS [assumed]",
    },
    "intra_node_latency_us": 50.0,
    "inter_node_latency_us": 50.0,
    "constants": {"runtime_reserved_gib": 0.0, "allocator_overhead_fraction": 0.0, "gemm_efficiency": 0.9},
}

#: names the profile file `--gpu local` reads (and `autopar probe` writes)
ENV = "AUTOPAR_LOCAL_PROFILE"


def local_profile_path() -> Path:
    """Where `autopar probe` writes (and `--gpu local` reads) this machine's profile:
    $AUTOPAR_LOCAL_PROFILE, else ~/.autopar/local.yaml."""
    return Path(os.environ.get(ENV) or "~/.autopar/local.yaml").expanduser()


def local_cluster(gpus_per_node: int | None = None) -> ClusterSpec:
    """`--gpu local`: this machine's profile as `autopar probe` wrote it (autopar.measured.local_profile),
    else LOCAL_DEFAULTS on a machine never probed. A profile that $AUTOPAR_LOCAL_PROFILE names must
    exist: a path the user gave and mistyped is one line, never a silent fallback to the defaults."""
    path = local_profile_path()
    if os.environ.get(ENV) and not path.exists():
        raise InputError(
            f"{ENV} names {quoted(str(path))}, which does not exist; run `autopar probe` to write it "
            f"there, fix the path, or unset {ENV} (the unprobed defaults)"
        )
    cluster = load_cluster_file(path) if path.exists() else cluster_from_dict(LOCAL_DEFAULTS, origin="local defaults")
    return replace(cluster, gpus_per_node=gpus_per_node) if gpus_per_node else cluster
