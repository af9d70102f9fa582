"""Plans covering every axis, and which exporters must refuse each (with a word of the reason).

Shared by test_export_contract.py and test_export_trainers.py (pytest puts this directory on
sys.path). Variants are (variant id, exporter name, ExportOptions changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from autopar.export import ExportOptions
from autopar.spec.presets import resolve_model
from autopar.spec.resolve import resolve_cluster, resolve_plan

VARIANTS = [
    ("megatron", "megatron", {}),
    ("torchtitan", "torchtitan", {"torchtitan_version": "0.3"}),
    ("torchtitan-toml", "torchtitan", {"torchtitan_version": "0.2.2"}),
    ("deepspeed", "deepspeed", {}),
    ("nemo", "nemo", {}),
    ("bridge", "bridge", {}),
    ("torchrun", "torchrun", {}),
    ("slurm", "slurm", {}),
    ("slurm-torchtitan", "slurm", {"trainer": "torchtitan"}),
]
TITAN = ("torchtitan", "torchtitan-toml", "slurm-torchtitan")
CORE = ("megatron", "nemo", "bridge", "torchrun", "slurm")  # Megatron-Core runtimes


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    gpus: int
    kwargs: dict
    seq_len: int | None = None
    #: variant id -> a word the refusal must contain; variants not listed must accept
    refuse: dict = field(default_factory=dict)
    gpu: str = "h100-sxm"

    @property
    def cluster(self):
        return _cluster(self.gpu)

    @property
    def spec(self):
        return _model(self.model)

    @property
    def seq(self) -> int:
        return self.seq_len or self.spec.seq_len

    @property
    def plan(self):
        return resolve_plan(self.spec, self.gpus, self.seq, **self.kwargs)

    def options(self, variant_opts: dict) -> ExportOptions:
        return ExportOptions(seq_len=self.seq, **variant_opts)


@cache
def _model(name: str):
    return resolve_model(name)


@cache
def _cluster(gpu: str):
    return resolve_cluster(gpu)


CLUSTER = resolve_cluster("h100-sxm")


def _titan(word: str) -> dict:
    return {v: word for v in TITAN}


def _core(word: str) -> dict:
    return {v: word for v in CORE}


CASES = [
    Case(
        "dp-zero1-selective",
        "llama3-8b",
        16,
        dict(tp=2, zero=1, recompute="selective", gbs=64),
        refuse=_titan("ZeRO-1"),
    ),
    Case("tp-pp-1f1b", "llama3-70b", 64, dict(tp=8, pp=4, zero=1, gbs=64), refuse=_titan("ZeRO-1")),
    # hybrid sharding: Megatron-Core's distributed-optimizer instances (ZeRO-1), torchtitan's HSDP (FSDP)
    Case(
        "hsdp-zero1",
        "llama3-8b",
        32,
        dict(tp=2, zero=1, dp_shard=4, gbs=64),
        refuse=_titan("ZeRO-1") | {"deepspeed": "hybrid sharding"},
    ),
    Case(
        "hsdp-fsdp",
        "llama3-8b",
        32,
        dict(tp=2, cp=2, zero=3, dp_shard=4, gbs=64),
        refuse=_core("hybrid sharding") | {"deepspeed": "context"},
    ),
    # Megatron-Core's selective recompute modules (--recompute-modules; NeMo / Bridge recompute_modules)
    Case(
        "selective-modules-dense",
        "llama3-8b",
        16,
        dict(tp=2, zero=3, recompute="selective", recompute_modules="core_attn,mlp,layernorm", gbs=64),
        refuse=_titan("recompute-modules") | {"deepspeed": "recompute-modules"},
    ),
    Case(
        "selective-modules-moe",
        "qwen3-30b-a3b",
        32,
        dict(tp=2, ep=8, etp=1, zero=3, recompute="selective", recompute_modules="moe_act,layernorm", gbs=64),
        refuse=_titan("recompute-modules") | {"deepspeed": "MoE"},
    ),
    Case(
        "selective-modules-mla",
        "deepseek-v3",
        256,
        dict(pp=4, ep=64, zero=3, recompute="selective", recompute_modules="mla_up_proj,mlp", gbs=256),
        refuse=_titan("recompute-modules") | {"deepspeed": "uneven pipeline stages"},
    ),
    # optimizer offload: Megatron-Core's HybridDeviceOptimizer (ZeRO-1, any share), DeepSpeed's
    # ZeRO-Offload (the whole partition; a share with ZeRO-3), torchtitan has no such mode
    Case("offload-zero1", "llama3-8b", 16, dict(tp=2, zero=1, optimizer_offload=1.0, gbs=64), refuse=_titan("ZeRO-1")),
    Case(
        "offload-share-zero1",
        "llama3-8b",
        16,
        dict(tp=2, zero=1, optimizer_offload=0.25, gbs=64),
        refuse=_titan("ZeRO-1") | {"deepspeed": "Stage 3"},
    ),
    Case(
        "offload-share-zero3",
        "llama3-8b",
        16,
        dict(zero=3, optimizer_offload=0.5, gbs=64),
        refuse=_core("offload") | _titan("offload"),
    ),
    # fine-grained activation offloading: Megatron-Core only (NeMo, Bridge, Megatron-LM)
    Case(
        "activation-offload-dense",
        "llama3-8b",
        16,
        dict(tp=2, zero=1, offload_modules="core_attn,attn_proj,attn_norm", gbs=64),
        refuse=_titan("ZeRO-1") | {"deepspeed": "offload"},
    ),
    Case(
        "activation-offload-moe",
        "qwen3-30b-a3b",
        32,
        dict(
            tp=2,
            ep=8,
            etp=1,
            zero=1,
            recompute="selective",
            recompute_modules="layernorm",
            offload_modules="expert_fc1,moe_act",
            gbs=64,
        ),
        refuse=_titan("ZeRO-1") | {"deepspeed": "MoE"},
    ),
    Case(
        "vpp-interleaved-full",
        "llama3-70b",
        64,
        dict(tp=4, pp=4, vpp=5, zero=1, recompute="full", gbs=128),
        refuse=_titan("ZeRO-1") | {"deepspeed": "interleaved"},
    ),
    Case(
        "vpp-zero2",
        "llama3-70b",
        64,
        dict(tp=4, pp=4, vpp=2, zero=2, recompute="full", gbs=128),
        refuse={"deepspeed": "interleaved"},
    ),
    Case(
        "cp-long-context",
        "llama3-8b",
        32,
        dict(tp=4, cp=4, zero=3, gbs=64),
        seq_len=32768,
        refuse={"deepspeed": "context"},
    ),
    Case(
        "uneven-first-last",
        "llama3-70b",
        128,
        dict(tp=8, pp=4, pp_first=18, pp_last=22, zero=1, gbs=512),
        refuse=_titan("ZeRO-1") | {"deepspeed": "uneven"},
    ),
    Case(
        "uneven-first-only-vpp",
        "llama3-70b",
        64,
        dict(tp=8, pp=4, vpp=2, pp_layout="7,11,11,11,7,11,11,11", zero=3, gbs=64),
        refuse={"deepspeed": "interleaved"},
    ),
    Case(
        "uneven-layout-string",
        "llama3-70b",
        128,
        dict(tp=8, pp=4, pp_layout="19,21,19,21", zero=3, gbs=512),
        refuse={"deepspeed": "uneven"},
    ),
    Case(
        "vpp-embedding-loss-balanced",
        "llama3-70b",
        64,
        dict(tp=4, pp=4, vpp=2, embedding_as_layer=True, loss_as_layer=True, zero=2, gbs=128),
        refuse={"deepspeed": "interleaved"},
    ),
    Case(
        "recompute-block",
        "llama3-70b",
        64,
        dict(tp=8, pp=4, zero=0, recompute="full", recompute_layers=6, gbs=64),
        refuse=_titan("recompute") | {"deepspeed": "recompute of 6 layers"},
    ),
    Case(
        "fp8-tp-overlap",
        "llama3-70b",
        64,
        dict(tp=8, pp=2, zero=3, dtype="fp8", tp_comm_overlap=True, gbs=128),
        # torchtitan's async TP needs torch.compile (0.3 CompileConfig.__post_init__)
        refuse=_titan("without torch.compile") | {"deepspeed": "ZeRO-3"},
    ),
    Case(
        "fp8-blockwise",
        "llama3-8b",
        16,
        dict(tp=2, zero=2, dtype="fp8", fp8_recipe="blockwise", gbs=32),
        refuse=_titan("blockwise") | {"deepspeed": "FP8"},
    ),
    Case(
        "fp8-tensorwise-fsdp",
        "llama3-8b",
        16,
        dict(tp=2, zero=3, dtype="fp8", fp8_recipe="tensorwise", gbs=32),
        refuse=_titan("tensorwise") | {"deepspeed": "FP8"},
    ),
    Case(
        "fp8-rowwise-gw-hp",
        "llama3-8b",
        16,
        dict(tp=2, zero=3, dtype="fp8", fp8_recipe="rowwise_with_gw_hp", gbs=32),
        refuse=_core("rowwise_with_gw_hp") | {"deepspeed": "FP8"},
    ),
    Case(
        "fp8-mxfp8",
        "llama3-8b",
        16,
        dict(tp=2, zero=3, dtype="fp8", fp8_recipe="mxfp8", gbs=32),
        refuse={"deepspeed": "FP8"},
        gpu="b200",
    ),
    Case(
        "fp8-mxfp8-compile-tp",
        "llama3-8b",
        16,
        dict(tp=2, zero=3, dtype="fp8", fp8_recipe="mxfp8", compile=True, gbs=32),
        # torchtitan 0.2.2's MX converter asserts against torch.compile with TP
        refuse=_core("torch.compile") | {"torchtitan-toml": "MXFP8 with torch.compile", "deepspeed": "FP8"},
        gpu="b200",
    ),
    Case(
        "moe-fp8",
        "qwen3-30b-a3b",
        32,
        dict(tp=2, ep=16, etp=1, zero=2, dtype="fp8", gbs=64),
        refuse={"deepspeed": "MoE"},
    ),
    Case(
        "moe-fp8-pp",
        "qwen3-30b-a3b",
        32,
        dict(tp=2, pp=2, ep=8, etp=1, zero=2, dtype="fp8", gbs=64),
        # torchtitan 0.2.2's float8 MoE converter asserts pp == 1 and cp == 1
        refuse={"torchtitan-toml": "pipeline and context", "deepspeed": "ZeRO-2"},
    ),
    Case(
        "moe-mxfp8",
        "qwen3-30b-a3b",
        32,
        dict(tp=2, ep=16, etp=1, zero=2, dtype="fp8", fp8_recipe="mxfp8", gbs=64),
        refuse={"deepspeed": "MoE"},
        gpu="b200",
    ),
    Case(
        "fp8-param-gather",
        "llama3-8b",
        16,
        dict(tp=2, zero=2, dtype="fp8", fp8_param_gather="on", gbs=32),
        refuse=_titan("parameter gather") | {"deepspeed": "FP8"},
    ),
    Case(
        "fp8-mxfp8-param-gather",
        "llama3-8b",
        16,
        dict(tp=2, zero=1, dtype="fp8", fp8_recipe="mxfp8", fp8_param_gather="on", gbs=32),
        refuse=_titan("ZeRO-1") | {"deepspeed": "FP8"},
        gpu="b200",
    ),
    Case(
        "fp8-no-param-gather",
        "llama3-8b",
        16,
        dict(tp=2, zero=2, dtype="fp8", fp8_param_gather="off", gbs=32),
        # Megatron-Bridge's delayed-scaling recipe gathers FP8 parameters, and overrides name a recipe
        refuse={"bridge": "parameter gather", "deepspeed": "FP8"},
    ),
    Case(
        "compile-async-tp",
        "llama3-70b",
        64,
        dict(tp=8, pp=2, zero=3, dtype="fp8", tp_comm_overlap=True, compile=True, gbs=128),
        refuse=_core("torch.compile") | {"deepspeed": "ZeRO-3"},
    ),
    Case(
        "compile",
        "llama3-8b",
        16,
        dict(tp=2, zero=2, compile=True, gbs=32),
        refuse=_core("torch.compile") | {"deepspeed": "torch.compile"},
    ),
    Case(
        "zero-bubble",
        "llama3-8b",
        16,
        dict(tp=2, pp=4, zero=2, pp_schedule="zero-bubble", gbs=32),
        refuse=_core("zero-bubble") | {"deepspeed": "zero-bubble"},
    ),
    Case(
        "gpipe",
        "llama3-8b",
        16,
        dict(tp=2, pp=2, zero=3, pp_schedule="gpipe", gbs=32),
        refuse=_core("gpipe") | {"deepspeed": "gpipe"},
    ),
    Case(
        "moe-etp-tp",
        "qwen3-30b-a3b",
        32,
        dict(tp=2, pp=2, ep=8, zero=3, gbs=64),
        refuse={"torchtitan": "etp = 2 with ep = 8", "slurm-torchtitan": "etp = 2 with ep = 8", "deepspeed": "ZeRO-3"},
    ),
    Case("moe-etp1", "qwen3-30b-a3b", 32, dict(tp=2, ep=16, etp=1, zero=2, gbs=64), refuse={"deepspeed": "MoE"}),
    Case(
        "moe-capacity",
        "qwen3-30b-a3b",
        32,
        dict(tp=2, ep=8, etp=1, zero=3, moe_dispatch="capacity", capacity_factor=1.25, gbs=64),
        refuse=_titan("capacity MoE dispatch") | {"deepspeed": "MoE"},
    ),
    Case(
        "moe-deepep",
        "qwen3-30b-a3b",
        32,
        dict(tp=2, ep=8, etp=1, zero=3, moe_dispatcher="deepep", gbs=64),
        refuse={"deepspeed": "MoE"},
    ),
    Case(
        "moe-deepep-ep-overlap",
        "deepseek-v3",
        256,
        dict(pp=4, vpp=2, ep=64, zero=3, moe_dispatcher="deepep", ep_comm_overlap=True, gbs=256),
        refuse=_titan("EP communication overlap") | {"deepspeed": "interleaved"},
    ),
    Case(
        "ddp-fp32-single-node",
        "llama3-8b",
        8,
        dict(zero=0, dtype="fp32", gbs=32),
        refuse={"nemo": "fp32 training", "bridge": "fp32 training"},
    ),
    Case("bf16-main-grads", "llama3-8b", 16, dict(tp=2, zero=3, grads="bf16", gbs=64), refuse=_titan("float32")),
    Case(
        "tp-without-sp",
        "llama3-8b",
        16,
        dict(tp=2, sp=False, zero=3, gbs=64),
        refuse={"torchtitan-toml": "sequence parallelism"},
    ),
]
