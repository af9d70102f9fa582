"""Memory facts of a published run that a ParallelPlan cannot express yet, and the plan of a
published run as its source ran it where that differs in memory from autopar.calibration.run_plan's
reading.

- `row_memory_facts`: a row's MemoryFacts (autopar.cost.memory_stacks): bf16 optimizer states, and
  the program that ran (a MemoryStack name); the estimate prices its trainer's defaults without
  them. The recompute modules a row lists and the activations it offloads
  (autopar.calibration.row_cells) are its plan's (ParallelPlan recompute_modules and
  offload_modules, autopar.calibration.run_plan; a twin row's offloading through `memory_plan`).
- `memory_plan` / `row_memory_facts`: what a row's source states or its program fixes. Each
  correction below is one the run-case builder could make itself (autopar.calibration.run_plan).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from autopar.calibration.row_cells import row_offloaded
from autopar.calibration.run_cases import RunCase
from autopar.calibration.run_rows import family
from autopar.calibration.sources import FAMILY_STACK, declared, nvidia_recipes
from autopar.cost.memory_stacks import MemoryFacts
from autopar.spec.layout import parse_layout
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan

#: NVIDIA's DeepSeek-V3 pre-training recipe: the precision-aware optimizer with bf16 Adam moments
#: (fp32 master weights) and bf16 main gradients (grad_reduce_in_fp32 = False)
DEEPSEEK_V3_RECIPE = "Megatron-Bridge recipes/deepseek/deepseek_v3.py: bf16 exp_avg / exp_avg_sq, bf16 main_grads"


def nvidia_deepseek_v3_recipe(row: dict, source: str) -> bool:
    """A DeepSeek-V3 run of the Megatron-Core MoE team's report, which trains it with NVIDIA's
    DeepSeek-V3 recipe (`DEEPSEEK_V3_RECIPE`; every recipe of that file sets both) where the row
    states no optimizer precision."""
    return source == "megatron-moe-report" and str(row.get("model", "")).startswith("DeepSeek-V3")


#: the cells that identify one run: two rows equal in all of them (a published TFLOP/s included)
#: are the same run published by two sources
SAME_RUN = (
    "gpu_type",
    "num_gpus",
    "num_layers",
    "hidden_size",
    "seq_len",
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "micro_batch_size",
    "global_batch_size",
    "tflops_per_gpu",
)


def _run_key(row: dict) -> tuple[str, ...]:
    return tuple(str(row.get(c, "") or "").strip() for c in SAME_RUN)


def offloading_twins(rows: list[dict]) -> dict[tuple[str, ...], list[dict]]:
    """The rows that state activation offloading, by their run's key (`SAME_RUN`): indexed once, so
    finding every row's twin stays linear in the rows (10,000 rows of a user's table)."""
    twins: dict[tuple[str, ...], list[dict]] = {}
    for twin in rows:
        key = _run_key(twin)
        if key[-1] and "offloading" in (twin.get("recompute", "") or ""):
            twins.setdefault(key, []).append(twin)
    return twins


def with_twin_offloading(row: dict, twins: dict[tuple[str, ...], list[dict]]) -> dict:
    """The row with the fine-grained activation offloading its twin states (the same run published
    by another source, `SAME_RUN`; `twins` from `offloading_twins`) where the row's own recompute
    cell names none: the Megatron-Core MoE report prints the recompute modules of its Qwen3 GB200
    run (row 406) and the ModelZoo's command line of the same run (row 287, 919 TFLOP/s) also
    offloads activations, which the run needs to fit."""
    key = _run_key(row)
    own = row.get("recompute", "") or ""
    if not key[-1] or "offloading" in own:
        return row
    for twin in twins.get(key, ()):
        if twin is not row and twin.get("row_id") != row.get("row_id"):
            text = twin.get("recompute", "") or ""
            offloaded = text[text.index("offloading") :]
            return {
                **row,
                "recompute": f"{own} + fine-grained activation {offloaded} (row {twin['row_id']}, the same run)",
            }
    return row


def row_memory_facts(row: dict, source: str) -> MemoryFacts:
    """The memory facts a calibration row states (its `zero_or_dist_opt`, `notes` cells)."""
    opt = (row.get("zero_or_dist_opt", "") or "") + " " + (row.get("notes", "") or "")
    notes = []
    framework = row.get("framework", "") or ""
    precision = row.get("precision", "") or ""
    bf16_states = re.search(r"BF16 optimizer (states|moments)", f"{opt} {framework} {precision}", re.I) is not None
    if bf16_states:
        notes.append("bf16 Adam states (the row)")
    elif nvidia_deepseek_v3_recipe(row, source):
        bf16_states = True
        notes.append(f"bf16 Adam moments ({DEEPSEEK_V3_RECIPE})")
    return MemoryFacts(
        bf16_optimizer_states=bf16_states,
        stack=declared(source).stack or FAMILY_STACK.get(family(row)),
        era_2022=source == "bloom",
        notes=tuple(notes),
    )


def nanotron_layout(model, pp: int):
    """nanotron's split of its pipeline blocks (nanotron/models/base.py `build_model`): blocks
    weighted by `get_block_compute_costs` (a decoder layer 4 a d h + 3 h F, the LM head V h, the
    embedding 0), each rank taking blocks until their cumulative cost passes its share
    (r + 1)/pp of the total, the block that passes it included."""
    layer = 4 * model.num_attention_heads * model.head_dim * model.hidden_size
    layer += 3 * model.ffn_hidden_size * model.hidden_size
    costs = np.cumsum([0] + [layer] * model.num_layers + [model.vocab_size * model.hidden_size])
    rank, counts = 0, [0] * pp
    for i, total in enumerate(costs):
        if 1 <= i <= model.num_layers:
            counts[rank] += 1
        if total > costs[-1] * (rank + 1) / pp and rank < pp - 1:
            rank += 1
    return parse_layout(",".join(str(c) for c in counts))


def memory_plan(case: RunCase, row: dict | None = None) -> tuple[ParallelPlan, ModelSpec, list[str]]:
    """(plan, model, notes): the run case's plan and model as its source ran them, where that
    differs in memory from the case's reading (autopar.calibration.run_plan / run_rows):
    - BLOOM (Megatron-DeepSpeed, 2022) had no sequence parallelism (Megatron-LM added it with
      Korthikanti et al. 2022, after these runs) and its pre-launch benchmarks ran fp16 with
      DeepSpeed's fp16 ZeRO optimizer (16-bit gradients) where the row states no bf16 (the tr11
      chronicles switch to the BF16_Optimizer, which accumulates fp32 gradients, later);
    - nanotron splits its layers by compute cost (`nanotron_layout`);
    - Korthikanti et al.'s GPT models train with dropout (its 34 s b h counts the masks);
    - NeMo and Megatron-Bridge performance recipes reduce gradients in bf16, so the main-gradient
      buffer is bf16 (Megatron-Bridge scripts/performance/utils/helpers.py `set_precision_configs`
      and NeMo nemo/collections/llm/recipes/llama3_70b.py `pretrain_performance_optimizations`:
      grad_reduce_in_fp32 = False; the base recipes keep True), and so does NVIDIA's DeepSeek-V3
      recipe, which the Megatron-Core MoE report's DeepSeek-V3 runs use (`nvidia_deepseek_v3_recipe`);
    - fms-fsdp checkpoints a share of its blocks that its README does not print; its HFU / MFU
      ratio does: recomputing a share p of the forward adds p / 3 of a step's FLOPs;
    - the fine-grained activation offloading the same run's other row states (`with_twin_offloading`)."""
    plan, model, notes = case.plan, case.model, []
    if case.source == "bloom":
        plan = plan.with_(sequence_parallel=False, tp_comm_overlap=False)
        notes.append("no sequence parallelism (Megatron-DeepSpeed 2022)")
        if not re.search(r"bf16", (row or {}).get("precision", "") or "", re.I):
            plan = plan.with_(main_grads_fp32=False)
            notes.append("fp16 with DeepSpeed's fp16 ZeRO-1 optimizer: 16-bit gradients")
    if case.source == "nanotron" and plan.pp > 1 and plan.vpp == 1:
        layout = nanotron_layout(model, plan.pp)
        plan = plan.with_(layout=layout)
        notes.append(f"nanotron's compute-cost layer split {layout.describe()}")
    if nvidia_recipes(case.source) and plan.main_grads_fp32:
        plan = plan.with_(main_grads_fp32=False)
        notes.append("bf16 gradient reduction (NeMo/Bridge performance recipes: grad_reduce_in_fp32 = False)")
    if row is not None and nvidia_deepseek_v3_recipe(row, case.source) and plan.main_grads_fp32:
        plan = plan.with_(main_grads_fp32=False)
        notes.append(f"bf16 main gradients ({DEEPSEEK_V3_RECIPE})")
    if case.source == "fms-fsdp" and plan.recompute == "full" and row:
        share = _recompute_share_from_hfu(row)
        if share is not None:
            layers = max(0, min(model.num_layers, round(share * model.num_layers)))
            plan = plan.with_(recompute_layers=layers)
            notes.append(f"{layers} of {model.num_layers} blocks checkpointed (HFU / MFU = 1 + share / 3)")
    if case.source == "korthikanti-2022" and not model.dropout:
        model = replace(model, dropout=True)
        notes.append("dropout (Korthikanti et al.'s GPT models)")
    offloaded = row_offloaded((row or {}).get("recompute", "") or "")
    if offloaded and plan.offload_modules != offloaded:  # a twin row's offloading (with_twin_offloading)
        plan = plan.with_(offload_modules=offloaded)
        notes.append(f"activations offloaded: {', '.join(offloaded)} (the same run's other row)")
    return plan, model, notes


def _recompute_share_from_hfu(row: dict) -> float | None:
    """Share of blocks fully recomputed, from a row's HFU / MFU (hardware FLOPs count the
    recomputed forward: HFU / MFU = 1 + p / 3 with the forward a third of a step's FLOPs)."""
    try:
        hfu, mfu = (float(str(row.get(k, "")).rstrip("%")) for k in ("hfu", "mfu"))
    except ValueError:
        return None
    return float(np.clip(3.0 * (hfu / mfu - 1.0), 0.0, 1.0)) if mfu > 0 else None
