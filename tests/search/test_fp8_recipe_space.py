"""The FP8 recipe as a search knob: the shipped spaces keep each trainer's default recipe; a space file
lists recipes to search; a recipe row exists only with FP8, naming a trainer's own default is the
"default" plan again (not a second row), and the trainer rules drop the recipes a trainer lacks."""

from __future__ import annotations

from autopar.calibration.estimate import estimate_table
from autopar.search.enumerate import enumerate_plans, knob_choices
from autopar.search.space import load_space, space_from_dict
from autopar.spec.fp8_recipes import RECIPE_CHOICES, RECIPE_CODE
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.table import DTYPE, TRAINER

H100 = default_cluster("h100-sxm")
ONE_LAYOUT = {"tp": [1], "pp": [1], "cp": [1], "zero": [3], "mbs": [1], "recompute": ["none"]}


def _q(trainers: tuple[str, ...]) -> Question:
    return Question(
        model=get_preset("llama3-8b"), num_gpus=8, cluster=H100, seq_len=4096, global_batch_size=64, trainers=trainers
    )


def test_every_shipped_space_keeps_the_trainers_default_recipe() -> None:
    for name in ("default", "dense-large", "long-context", "moe", "local"):
        assert knob_choices(load_space(name), _q(("megatron",)))["fp8_recipe"] == [RECIPE_CODE["default"]]


def test_a_space_file_searches_the_listed_recipes_once_each() -> None:
    # one layout, bf16 and fp8, four recipe choices: per trainer 1 bf16 row and the fp8 rows of the
    # choices less the trainer's own default named (delayed on Megatron, rowwise on torchtitan)
    recipes = ["default", "delayed", "tensorwise", "rowwise"]
    space = space_from_dict({"knobs": ONE_LAYOUT | {"dtype": ["bf16", "fp8"], "fp8_recipe": recipes}}, "test")
    table = enumerate_plans(space, _q(("megatron", "torchtitan")))
    assert (table.fp8_recipe[table.dtype == DTYPE["bf16"]] == 0).all()
    fp8 = table.dtype == DTYPE["fp8"]
    names = {
        t: sorted(RECIPE_CHOICES[c] for c in table.fp8_recipe[fp8 & (table.trainer == TRAINER[t])])
        for t in ("megatron", "torchtitan")
    }
    assert names == {
        "megatron": ["default", "rowwise", "tensorwise"],
        "torchtitan": ["default", "delayed", "tensorwise"],
    }
    assert len(table) == 2 * (1 + 3)
    # the trainers run only their own recipes: Megatron-Core has no rowwise, torchtitan no delayed or tensorwise
    valid = estimate_table(table, get_preset("llama3-8b"), H100, num_gpus=8, seq_len=4096)["valid"]
    ran = {
        (TRAINER_NAME[t], RECIPE_CHOICES[r])
        for t, r, d, ok in zip(table.trainer, table.fp8_recipe, table.dtype, valid)
        if ok and d == DTYPE["fp8"]
    }
    assert ran == {("megatron", "default"), ("megatron", "tensorwise"), ("torchtitan", "default")}


TRAINER_NAME = {code: name for name, code in TRAINER.items()}


def test_a_space_file_searches_fp8_parameter_gather_written_as_yaml_on_off(tmp_path) -> None:
    # YAML 1.1 reads a bare on / off as booleans: the space takes them as the choices' names. Per
    # trainer the trainer's own choice named is the "default" row again: Megatron-LM's is off,
    # Megatron-Bridge's (the delayed-scaling recipe's) on
    path = tmp_path / "gather.yaml"
    knobs = "".join(f"  {k}: {v}\n" for k, v in ONE_LAYOUT.items())
    path.write_text(f"knobs:\n{knobs}  dtype: [fp8]\n  fp8_param_gather: [default, on, off]\n")
    table = enumerate_plans(load_space(str(path)), _q(("megatron", "bridge")))
    codes = {t: sorted(table.fp8_param_gather[table.trainer == TRAINER[t]].tolist()) for t in ("megatron", "bridge")}
    assert codes == {"megatron": [0, 1], "bridge": [0, 2]}  # 0 default, 1 on, 2 off
