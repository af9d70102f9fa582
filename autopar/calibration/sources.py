"""The publications the bundled runs come from, declared once: how a row's `source` cell names each,
when its figures were published, the group of releases it belongs to, the program that ran it, the
FLOP convention of its TFLOP/s and MFU, and the attention kernels it ran where they differ from its
trainer's today.

- `key` is the leave-one-source-out fold;
- `published` (ISO date) orders the sources for the chronological check (autopar.calibration.
  new_ground): the date of the commit, release or paper the row cites;
- `group` is what a new-ground check leaves out together: every release of one vendor's
  performance summary, or every benchmark file of one trainer team;
- `stack` is the program's memory stack (autopar.cost.memory_stacks.STACKS);
- `convention` is the FLOP count of its TFLOP/s (autopar.calibration.flop_conventions);
- `kernels` are the kernel facts it ran that differ from the profile's (constant -> value, and why);
- `profile` is the validation-only profile of a program autopar exports to no trainer of (NeMo
  AutoModel: Transformer Engine attention and norms over FSDP2), else its family's.
A source the table does not know keys on its own text, with no date and its family's defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: attention kernels a source ran that differ from its trainer's today (the profiles price current
#: kernels): FlashAttention-2 / PyTorch SDPA run on mma.sync; Megatron before FlashAttention
#: (2021-22) and BLOOM's Megatron-DeepSpeed materialise the score matrix (no causal block skipping)
FA2 = ({"attention_mma_sync": 1.0}, "attention: FlashAttention-2 era kernels (mma.sync)")
NO_FLASH = (
    {"attention_mma_sync": 1.0, "attention_flash": 0.0},
    "attention: no FlashAttention (fused softmax over the whole score matrix, 2021-22)",
)
#: Megatron-LM 2021-22 also scattered its pipeline sends over the TP ranks (autopar.cost.comm.pp_calls)
MEGATRON_2021 = (
    NO_FLASH[0] | {"pp_scatter_gather": 1.0},
    NO_FLASH[1] + "; pipeline sends scattered over TP and all-gathered (--scatter-gather-tensors-in-pipeline)",
)
TRITON_FLASH = (
    {"attention_mma_sync": 1.0, "attention_fa1": 1.0},
    "attention: llm-foundry's attn_impl triton (flash_attn_triton.py): FlashAttention in Triton, at "
    "1 / 1.8 of FlashAttention-2's rate (FA2 paper: 1.3-2.5x)",
)
#: torchtitan before 0.2 expanded K/V to the query heads before SDPA (models/llama3/model/model.py
#: `repeat_kv`, torchtitan 0.1.0; 0.2 passes enable_gqa): its CP exchanged query-head-sized blocks
TORCHTITAN_REPEAT_KV = (
    FA2[0] | {"attention_repeat_kv": 1.0},
    FA2[1] + "; K/V repeated to the query heads before SDPA (repeat_kv, torchtitan before 0.2)",
)
CURRENT: tuple[dict, str] = ({}, "")


@dataclass(frozen=True)
class Source:
    key: str
    pattern: str  # a regular expression searched in the row's `source` cell
    published: str  # ISO date of the cited commit, release or paper
    group: str
    stack: str | None = None  # None: its trainer family's (FAMILY_STACK)
    convention: str = "megatron-causal"
    kernels: tuple[dict, str] = field(default=CURRENT)
    #: the validation-only performance profile that prices its runs (autopar/cost/data/profiles.toml);
    #: None: its trainer family's
    profile: str | None = None


#: most specific pattern first: the first that matches names the source
SOURCES = (
    Source(
        "megatron-readme-h100",
        r"Megatron-LM README\.md 'Training Speed",
        "2024-07-15",  # README @f2e5db402c
        "megatron-readme",
        "megatron-core",
        "megatron-full",
    ),
    Source(
        "megatron-readme-2021",
        r"Megatron-LM README\.md \(2021-04\)",
        "2021-04-08",  # README @50a4b5fa02
        "megatron-readme",
        "megatron-core",
        "narayanan",
        MEGATRON_2021,
    ),
    Source("korthikanti-2022", r"Korthikanti", "2022-05-10", "korthikanti", "megatron-core", kernels=MEGATRON_2021),
    Source(
        "nemo-24.07",
        r"NeMo Framework performance summary",
        "2024-07-31",  # NeMo 24.07 container ('24.07 perf numbers')
        "nvidia-performance-summary",
        "nemo-bridge",
        "megatron-full",
    ),
    Source(
        "nemo-long-sequence",
        r"performance_long_sequence",
        "2024-04-15",  # NeMo 24.03.01 container
        "nvidia-performance-summary",
        "nemo-bridge",
    ),
    Source(
        "bridge-25.11",
        r"Megatron-Bridge.*25\.11 NeMo container",
        "2025-12-01",
        "nvidia-performance-summary",
        "nemo-bridge",
    ),
    Source(
        "bridge-26.02",
        r"Megatron-Bridge.*26\.02 NeMo container",
        "2026-03-01",
        "nvidia-performance-summary",
        "nemo-bridge",
    ),
    Source("bridge-25.09", r"Megatron-Bridge", "2025-10-01", "nvidia-performance-summary", "nemo-bridge"),
    Source(
        "automodel", r"Automodel|AutoModel", "2025-10-02", "automodel", "automodel", profile="automodel"
    ),  # docs/performance-summary.md 'Last Updated 2025-10-02' and its later docs.nvidia.com revision
    Source(
        "torchtitan-2024-12",
        r"torchtitan benchmarks/llama3_h100_202412",
        "2024-12-26",  # benchmark commit 9dec370
        "torchtitan",
        "torchtitan-default",
        "palm",
        TORCHTITAN_REPEAT_KV,
    ),
    Source(
        "torchtitan-asynctp-2025-06",
        r"torchtitan benchmarks/asyncTP",
        "2025-06-15",
        "torchtitan",
        "torchtitan-default",
        "palm",
        TORCHTITAN_REPEAT_KV,
    ),
    Source(
        "torchtitan-h200-2025-06",
        r"torchtitan benchmarks/llama3-8b_h200",
        "2025-06-15",
        "torchtitan",
        "torchtitan-default",
        "palm",
        TORCHTITAN_REPEAT_KV,
    ),
    Source(
        "torchtitan-2024",
        r"pytorch/torchtitan",
        "2024-08-23",  # docs/performance.md @3faaa1a0d
        "torchtitan",
        "torchtitan-default",
        "palm",
        TORCHTITAN_REPEAT_KV,
    ),
    Source(
        "llm-foundry",
        r"llm-foundry",
        "2024-01-06",  # the table's commit 5e85bd62d4ec
        "llm-foundry",
        "llm-foundry",
        "6n-full-attention",
        TRITON_FLASH,
    ),
    Source("fms-fsdp", r"fms-fsdp", "2024-05-09", "fms-fsdp", "fms-fsdp", "palm", FA2),  # README @ed74fd5
    Source("nanotron", r"nanotron", "2025-03-10", "nanotron", "nanotron", "palm", FA2),  # @c252843039
    Source(
        "bloom", r"bigscience", "2022-03-11", "bloom", "megatron-deepspeed", kernels=NO_FLASH
    ),  # tr11 pre-launch benchmarks and launch
    Source("llama3-paper", r"Llama 3 Herd", "2024-07-23", "llama3-paper", "meta-4d", "palm"),  # arXiv 2407.21783
    Source(
        "moe-modelzoo", r"Megatron-MoE-ModelZoo", "2025-05-27", "megatron-moe", "megatron-core"
    ),  # examples/qwen3/readme.md @8017e1120f
    Source(
        "deepseek-v3-gb200",
        r"deepseek-v3-gb200",
        "2025-10-15",  # removed 2025-11-05 (Megatron-LM 3c1b98efdc); written on 25.09 containers
        "megatron-moe",
        "megatron-core",
    ),
    Source(
        "megatron-moe-report", r"Scalable Training of Mixture-of-Experts", "2026-03-09", "megatron-moe", "megatron-core"
    ),  # arXiv 2603.07685
    Source(
        "deepseek-v3-report", r"DeepSeek-V3 Technical Report", "2024-12-27", "deepseek-v3-report", "megatron-core"
    ),  # arXiv 2412.19437
    Source(
        "megatron-moe-readme", r"transformer/moe/README", "2024-08-02", "megatron-moe", "megatron-core"
    ),  # Megatron-LM 0b981f9c53
)
BY_KEY = {s.key: s for s in SOURCES}

#: a source autopar does not know, by the trainer family its `framework` names (autopar.calibration.
#: run_rows `family`): a published run ran with its program's own defaults (torchtitan's reshard
#: policy "default", not autopar's export)
FAMILY_STACK = {"fsdp": "torchtitan-default", "nanotron": "nanotron", "deepspeed": "megatron-deepspeed"}


def source_of(cell: str) -> Source:
    """The declared source a row's `source` cell names, else an undated one keyed on the text."""
    for s in SOURCES:
        if re.search(s.pattern, cell):
            return s
    return Source(cell[:40] or "unknown", "", "", cell[:40] or "unknown")


def declared(key: str) -> Source:
    """The source of a case's key (an undated one for a source the table does not know)."""
    return BY_KEY.get(key) or Source(key, "", "", key)


#: a row whose notes name FlexAttention ran it, whatever its source's attention: Triton kernels,
#: priced at the FlashAttention-2 class's rates (AutoModel's GPT-OSS rows: "TE + DeepEP + FlexAttn")
FLEX_ATTENTION = ({"attention_mma_sync": 1.0}, "attention: FlexAttention (Triton), priced as FlashAttention-2")


def row_kernels(key: str, notes: str) -> tuple[dict, str]:
    """The kernel facts of a row of source `key`: its source's, or FlexAttention where its notes
    name it."""
    if re.search(r"FlexAttn|FlexAttention", notes):
        return ({**declared(key).kernels[0], **FLEX_ATTENTION[0]}, FLEX_ATTENTION[1])
    return declared(key).kernels


def nvidia_recipes(key: str) -> bool:
    """NVIDIA's performance summaries (NeMo, Megatron-Bridge): their runs use NVIDIA's tuned
    performance recipes (bf16 gradient reduction, TP overlap, the flex dispatcher)."""
    return declared(key).group == "nvidia-performance-summary"
