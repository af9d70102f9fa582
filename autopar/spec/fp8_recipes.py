"""The FP8 recipes: how the tensors of an FP8 GEMM are scaled, declared once.

A plan's `fp8_recipe` (autopar.spec.plan) names one of these, or "default" for its trainer's default (the
first of the trainer's `fp8` capability list, autopar/spec/data/trainers.toml). The names are the
trainers' own:
- Megatron-Core `--fp8-recipe` / TransformerConfig `fp8_recipe` (megatron-core 0.16
  transformer_config.py: tensorwise | delayed | mxfp8 | blockwise, default delayed), mapped onto
  Transformer Engine's recipes in megatron/core/fp8_utils.py: delayed -> DelayedScaling,
  tensorwise -> Float8CurrentScaling (TE >= 2.2), blockwise -> Float8BlockScaling (TE >= 2.3),
  mxfp8 -> MXFP8BlockScaling (TE >= 2.1, "for Blackwell architecture only");
- torchtitan's torchao converters (torchtitan 0.2.2 config/job_config.py `Float8Linear.recipe_name`
  tensorwise | rowwise | rowwise_with_gw_hp; `MXLinear` for mxfp8, SM100 and later).

What the cost model takes from a recipe (autopar.cost.compute):
- `cast_bytes`: the HBM bytes per element of an FP8 GEMM input that quantizing it moves. The FP8 GEMM
  reads its operands scaled along the reduction dimension, so an activation is quantized for the
  forward GEMM and again, transposed, for the weight-gradient GEMM; an output gradient for the data-
  and weight-gradient GEMMs. Transformer Engine does both in one fused cast-transpose kernel (read
  2 bytes, write 1 + 1: TransformerEngine docs "Using FP8 with Transformer Engine", the
  `cast_transpose` kernels).
- `wgrad_bf16`: the weight-gradient GEMM runs in BF16 (a third of a linear layer's GEMM FLOPs:
  Megatron's backward = 2 x forward, half of it the weight gradient).
- `generations`: the GPU generations with the recipe's kernels (autopar.spec.hardware
  GpuSpec.generation); empty = every FP8 GPU.
- `expert_quantize_kernels`: the kernels one quantization of one local expert's GEMM input launches
  where the trainer runs its expert GEMMs expert by expert (Transformer Engine's GroupedLinear:
  `tex.split_quantize` over the experts' splits). TE 2.9 csrc/extensions/cast.cpp
  `multi_tensor_quantize_impl` has one fused multi-tensor cast-transpose for delayed scaling only
  ("Currently only have fused kernel for FP8 delayed scaling") and quantizes every other recipe's
  splits one by one (csrc/quantizer.cpp): current scaling in three kernels (`nvte_compute_amax`,
  `nvte_compute_scale_from_amax`, `nvte_quantize_v2`), block and MX scaling in one
  (`nvte_quantize_v2`). An MoE layer pass quantizes four inputs per expert (`EXPERT_QUANTIZES`).

FP8 parameter gather (a plan's `fp8_param_gather`: default | on | off): the parameters themselves are
kept in FP8 and the data-parallel all-gathers move 1 byte per linear weight instead of 2 (Megatron-LM
`--fp8-param-gather`, DistributedDataParallelConfig.fp8_param_gather), and Transformer Engine keeps no
cached FP8 copy of a BF16 weight. Each trainer's `fp8_param_gather` capability says how it offers it:
"with-distributed-optimizer" (an option that Megatron-LM's arguments.py allows only with the
distributed optimizer or FSDP), "optional", "by-recipe" (Megatron-Bridge: the registered mixed-
precision recipe of the FP8 recipe sets it, BRIDGE_PARAM_GATHER) or "no"; "default" is off except
where the recipe decides.

[UNCERTAIN] No published figure gives one GPU's GEMM rate per recipe. Every recipe runs at the GPU's
FP8 MAMF (per-tensor scaled `torch._scaled_mm`, autopar.spec.behaviour): DeepGEMM's fine-grained
(1x128 / 128x128 blockwise) FP8 GEMMs at M = 4096 reach 1127-1520 TFLOPS on an H800 (DeepGEMM
README @989c9e3), which brackets the H100's FP8 MAMF of 1402.6; Blackwell's tensor cores read MXFP8
block scales at the dense FP8 rate (B200 datasheet: MXFP8 = FP8 4.5 PFLOPS dense).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from autopar.spec.plan_fields import DTYPE
from autopar.spec.trainers import ALL_TRAINERS, trainers


@dataclass(frozen=True)
class Fp8Recipe:
    name: str
    title: str
    cast_bytes: float
    wgrad_bf16: bool = False
    generations: tuple[str, ...] = ()
    why: str = ""  # how `cast_bytes` follows from the recipe's kernels
    #: kernels per quantization of one local expert's GEMM input where the trainer quantizes the
    #: experts' inputs one by one (module docstring: TE split_quantize); 0 = one fused kernel for all
    expert_quantize_kernels: float = 0.0


#: per-expert input quantizations one MoE layer pass (forward + backward) runs in Transformer
#: Engine's GroupedLinear (TE 2.9 pytorch/module/grouped_linear.py): the forward quantizes each
#: expert's fc1 and fc2 inputs (`tex.split_quantize(inp_view, m_splits, input_quantizers)`, row- and
#: column-wise in one pass), the backward each expert's fc2 and fc1 output gradients
#: (`tex.split_quantize(grad_output_view, ctx.m_splits, ctx.grad_output_quantizers)`); the FP8
#: weights are cast once per step (`is_first_microbatch` caches them), not per microbatch
EXPERT_QUANTIZES = 4.0


#: where the recipes' names and kernels are stated (rule sentences cite it)
SOURCE = "megatron-core transformer_config.py fp8_recipe, fp8_utils.py; torchtitan quantization/float8.py"

#: in code order (a table holds a recipe as its index; do not reorder)
RECIPES: tuple[Fp8Recipe, ...] = (
    Fp8Recipe(
        "delayed",
        "per-tensor delayed scaling (TE DelayedScaling)",
        4.0,
        why="the scale comes from the amax history, so one fused cast-transpose: read 2, write 1 + 1",
    ),
    Fp8Recipe(
        "tensorwise",
        "per-tensor current scaling (TE Float8CurrentScaling; torchao tensorwise)",
        6.0,
        why="the scale needs this tensor's amax first: a reduction pass (read 2), then the cast-transpose",
        expert_quantize_kernels=3.0,
    ),
    Fp8Recipe(
        "blockwise",
        "1x128 / 128x128 block scaling (TE Float8BlockScaling, DeepSeek-V3's recipe)",
        4.0 + 2 * 4.0 / 128,
        why="each block's amax is local to the quantizing kernel: read 2, write 1 + 1, an fp32 scale per 128",
        expert_quantize_kernels=1.0,
    ),
    Fp8Recipe(
        "mxfp8",
        "MXFP8: 32-element blocks with E8M0 scales (TE MXFP8BlockScaling; torchao mx)",
        4.0 + 2 * 1.0 / 32,
        generations=("blackwell",),
        why="row- and column-wise blocks in one pass: read 2, write 1 + 1, a 1-byte scale per 32",
        expert_quantize_kernels=1.0,
    ),
    Fp8Recipe(
        "rowwise",
        "per-row current scaling (torchao Float8 rowwise)",
        6.0,
        why="the row-scaled cast (read 2, write 1) and, for the weight gradient, the column-scaled one",
    ),
    Fp8Recipe(
        "rowwise_with_gw_hp",
        "per-row scaling, weight gradients in BF16 (torchao rowwise_with_gw_hp)",
        3.0,
        wgrad_bf16=True,
        why="the row-scaled cast alone (read 2, write 1): the weight-gradient GEMM reads the BF16 tensors",
    ),
)
FP8_RECIPES = tuple(r.name for r in RECIPES)
#: the plan field's choices: "default" (code 0) = the trainer's default recipe, then the recipes
RECIPE_CHOICES = ("default",) + FP8_RECIPES
BY_NAME = {r.name: r for r in RECIPES}
#: the code of each choice (a table's fp8_recipe column)
RECIPE_CODE = {name: i for i, name in enumerate(RECIPE_CHOICES)}


def recipe_of(code: int) -> Fp8Recipe:
    """The recipe of a (resolved, non-default) code."""
    return RECIPES[int(code) - 1]


@cache
def default_codes() -> np.ndarray:
    """Per trainer code (autopar.spec.trainers.ALL_TRAINERS): the code of its default recipe, the
    first of its `fp8` capability list; 0 for a trainer without FP8."""
    table = trainers()
    out = []
    for key in ALL_TRAINERS:
        listed = table[key].cap("fp8").value
        out.append(RECIPE_CODE[listed[0]] if listed else 0)
    return np.array(out, dtype=np.int64)


def recipe_codes(t) -> np.ndarray:
    """Per row of a table: the code of the recipe its FP8 GEMMs run, the plan's or its trainer's
    default; 0 for a row not in FP8 (or on a trainer without FP8)."""
    fp8 = t.dtype == DTYPE["fp8"]
    return np.where(fp8, np.where(t.fp8_recipe > 0, t.fp8_recipe, default_codes()[t.trainer]), 0)


def cast_bytes(codes: np.ndarray) -> np.ndarray:
    """HBM bytes per element of an FP8 GEMM input that its recipe's quantization moves, per row (0 for
    a row not in FP8)."""
    per_code = np.array([0.0] + [r.cast_bytes for r in RECIPES])
    return per_code[codes]


def expert_quantize_kernels(codes: np.ndarray) -> np.ndarray:
    """Per row: the kernels an MoE layer pass launches per local expert to quantize its GEMM inputs
    where the trainer quantizes them expert by expert (0 for a row not in FP8)."""
    per_code = np.array([0.0] + [EXPERT_QUANTIZES * r.expert_quantize_kernels for r in RECIPES])
    return per_code[codes]


def wgrad_bf16(codes: np.ndarray) -> np.ndarray:
    """Per row: the recipe runs the weight-gradient GEMMs in BF16."""
    per_code = np.array([False] + [r.wgrad_bf16 for r in RECIPES])
    return per_code[codes]


#: a plan's fp8_param_gather choices (code order: a table holds the index)
PARAM_GATHER = ("default", "on", "off")
PARAM_GATHER_CODE = {name: i for i, name in enumerate(PARAM_GATHER)}
#: Megatron-Bridge 0.3.1 training/mixed_precision.py: the fp8_param_gather each registered FP8 recipe
#: sets (bf16_with_fp8_delayed_scaling_mixed, _current_scaling_ (tensorwise), bf16_with_mxfp8_mixed:
#: True; bf16_with_fp8_subchannel_scaling_mixed (blockwise): False)
BRIDGE_PARAM_GATHER = {"delayed": True, "tensorwise": True, "blockwise": False, "mxfp8": True}


@cache
def _gather_by_recipe() -> np.ndarray:
    """[trainer code, recipe code] -> the trainer's default parameter gather for that recipe."""
    table = trainers()
    out = np.zeros((len(ALL_TRAINERS), len(RECIPE_CHOICES)), bool)
    for i, key in enumerate(ALL_TRAINERS):
        if table[key].cap("fp8_param_gather").value == "by-recipe":
            out[i] = [BRIDGE_PARAM_GATHER.get(name, False) for name in RECIPE_CHOICES]
    return out


def default_param_gather(t) -> np.ndarray:
    """Per row of a table: the parameter gather an FP8 plan's trainer runs unless told (its recipe's
    on a by-recipe trainer, else off); False for a row not in FP8."""
    return (t.dtype == DTYPE["fp8"]) & _gather_by_recipe()[t.trainer, recipe_codes(t)]


def param_gather(t) -> np.ndarray:
    """Per row: the FP8 parameters are gathered in FP8 (the plan's choice, or its trainer's default)."""
    on = t.fp8_param_gather == PARAM_GATHER_CODE["on"]
    chosen = np.where(t.fp8_param_gather == PARAM_GATHER_CODE["default"], default_param_gather(t), on)
    return (t.dtype == DTYPE["fp8"]) & chosen


def param_gather_used(dtype: str, recipe: str, gather: str, trainer: str) -> bool | None:
    """One plan's parameter gather: True or False with FP8, None without."""
    name = recipe_name(dtype, recipe, trainer)
    if name is None:
        return None
    if gather != "default":
        return gather == "on"
    return bool(_gather_by_recipe()[ALL_TRAINERS.index(trainer), RECIPE_CODE[name]])


def fp8_defaults(trainer: str) -> tuple:
    """What a plan's "default" FP8 choices mean on `trainer`: its default recipe and its parameter
    gather per recipe. Trainers that agree on it price a plan alike (autopar.calibration.estimate)."""
    i = ALL_TRAINERS.index(trainer)
    return int(default_codes()[i]), tuple(_gather_by_recipe()[i].tolist())


def recipe_name(dtype: str, recipe: str, trainer: str) -> str | None:
    """The recipe one plan's FP8 GEMMs run: its own, or its trainer's default; None without FP8 (or
    on a trainer without it)."""
    if dtype != "fp8":
        return None
    if recipe != "default":
        return recipe
    code = int(default_codes()[ALL_TRAINERS.index(trainer)])
    return RECIPE_CHOICES[code] if code else None
