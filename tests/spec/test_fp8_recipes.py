"""The FP8 recipes as a plan knob (autopar.spec.fp8_recipes): each trainer's default is the trainer's
own, the recipes a trainer lists are the ones its code accepts, trainers that share a cost profile
share their default, and a recipe needs FP8 and, for MXFP8, a Blackwell GPU."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from autopar.spec.fp8_recipes import BY_NAME, FP8_RECIPES, recipe_name
from autopar.spec.plan import ParallelPlan, PlanError
from autopar.spec.trainers import ALL_TRAINERS, get_trainer

MEGATRON_CORE = ("megatron", "nemo", "bridge")


def _listed(trainer: str) -> list[str]:
    return list(get_trainer(trainer).cap("fp8").value or [])


def test_megatron_core_trainers_default_to_transformer_configs_default_recipe() -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    default = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}["fp8_recipe"]
    for t in MEGATRON_CORE:
        assert recipe_name("fp8", "default", t) == default == "delayed"


def test_megatron_core_trainers_list_only_recipes_megatron_core_accepts() -> None:
    from megatron.core.enums import Fp8Recipe

    accepted = {r.value for r in Fp8Recipe} - {"custom"}  # custom needs a quantizer factory of one's own
    for t in MEGATRON_CORE:
        assert set(_listed(t)) == accepted


def test_torchtitan_defaults_to_and_lists_its_float8_converters_recipes() -> None:
    # the float8 converter's recipe names, plus mxfp8 for the MX converter that torchtitan ships
    # beside it (components/quantization/mx.py)
    from torchtitan.components.quantization import mx
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    default = {f.name: f.default for f in dataclasses.fields(Float8LinearConverter.Config)}["recipe_name"]
    assert recipe_name("fp8", "default", "torchtitan") == default == "rowwise"
    literal = typing.get_type_hints(Float8LinearConverter.Config)["recipe_name"]
    assert hasattr(mx, "MXFP8LinearConverter") and hasattr(mx, "MXFP8GroupedExpertsConverter")
    assert set(_listed("torchtitan")) == set(typing.get_args(literal)) | {"mxfp8"}


def test_the_search_prices_each_trainer_with_its_own_fp8_defaults() -> None:
    # estimate_per_trainer prices the trainers of one profile once, as the first's: Megatron-LM and
    # Megatron-Bridge share the megatron profile but not the meaning of a default FP8 plan (Bridge's
    # delayed-scaling recipe gathers FP8 parameters), so each is priced as itself
    from autopar.calibration.estimate import estimate, estimate_per_trainer
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import resolve_model
    from autopar.spec.table import PlanTable

    model, h100 = resolve_model("llama3-70b"), default_cluster("h100-sxm")
    plan = ParallelPlan(tp=4, pp=4, dp=4, zero_stage=1, dtype="fp8", global_batch_size=128)
    table = PlanTable.from_plans([plan])
    trainers = ("megatron", "bridge")
    figures = estimate_per_trainer(table, model, h100, trainers, num_gpus=64, seq_len=8192)
    for t, got in zip(trainers, figures):
        alone = estimate(plan.with_(trainer=t), model, h100, num_gpus=64, seq_len=8192)
        assert got["peak_memory_bytes"][0] == pytest.approx(alone.peak_memory_bytes, rel=1e-12), t
    assert figures[1]["peak_memory_bytes"][0] < figures[0]["peak_memory_bytes"][0]  # no TE cached copy


def test_every_listed_recipe_is_declared() -> None:
    for t in ALL_TRAINERS:
        assert set(_listed(t)) <= set(FP8_RECIPES)


def test_cast_bytes_follow_the_kernels_passes() -> None:
    # read the BF16 tensor (2 B), write the FP8 copy and its transpose (1 + 1 B); current scaling reads
    # it once more for the amax (+2); block scales add an fp32 per 128 (blockwise) or an E8M0 byte per
    # 32 (MXFP8) to each FP8 copy; BF16 weight gradients need no transposed copy (2 + 1)
    assert BY_NAME["delayed"].cast_bytes == 4.0
    assert BY_NAME["tensorwise"].cast_bytes == BY_NAME["rowwise"].cast_bytes == 6.0
    assert BY_NAME["blockwise"].cast_bytes == 4.0 + 2 * 4 / 128
    assert BY_NAME["mxfp8"].cast_bytes == 4.0 + 2 * 1 / 32
    assert BY_NAME["rowwise_with_gw_hp"].cast_bytes == 3.0 and BY_NAME["rowwise_with_gw_hp"].wgrad_bf16


def test_a_recipe_needs_fp8() -> None:
    with pytest.raises(PlanError, match="needs --dtype fp8"):
        ParallelPlan(fp8_recipe="blockwise")
    assert ParallelPlan(dtype="fp8", fp8_recipe="blockwise").fp8_recipe_used == "blockwise"


@pytest.mark.parametrize("name", ["fp4", "Delayed", ""])
def test_an_unknown_recipe_is_refused(name) -> None:
    with pytest.raises(PlanError, match="FP8 recipe must be"):
        ParallelPlan(dtype="fp8", fp8_recipe=name)


def test_no_fp8_means_no_recipe() -> None:
    assert recipe_name("bf16", "default", "megatron") is None
    assert recipe_name("fp8", "default", "deepspeed") is None  # DeepSpeed has no FP8


def test_fp8_parameter_gather_is_off_unless_the_trainer_or_the_plan_says() -> None:
    # Megatron-LM's --fp8-param-gather and NeMo's MegatronMixedPrecision(fp8_param_gather) default to
    # off; Megatron-Bridge's registered FP8 recipes set it (blockwise's does not); torchtitan has none
    plan = ParallelPlan(dp=8, zero_stage=1, dtype="fp8")
    assert plan.with_(trainer="megatron").fp8_param_gather_used is False
    assert plan.with_(trainer="nemo").fp8_param_gather_used is False
    assert plan.with_(trainer="bridge").fp8_param_gather_used is True
    assert plan.with_(trainer="bridge", fp8_recipe="blockwise").fp8_param_gather_used is False
    assert plan.with_(trainer="torchtitan").fp8_param_gather_used is False
    assert plan.with_(fp8_param_gather="on").fp8_param_gather_used is True
    assert ParallelPlan(dp=8).fp8_param_gather_used is None


def test_fp8_parameter_gather_needs_fp8() -> None:
    with pytest.raises(PlanError, match="parameter gather needs --dtype fp8"):
        ParallelPlan(fp8_param_gather="on")
