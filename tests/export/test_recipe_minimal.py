"""The Megatron-Bridge and NeMo 2 exports write only what changes the recipe (autopar.export.
recipe_values): a field the recipe already sets to the plan's value is left to it, so no line
restates a default over a tuned value or names a field an older image lacks. What each recipe sets
comes from its source (data/bridge_recipes.json and data/nemo_recipes.json, written by
scripts/bridge_recipe_values.py and scripts/nemo_recipe_values.py); a test re-reads them from the
installed reference releases (the Makefile's trainer-refs)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from autopar.export import ExportOptions, get_exporter
from autopar.export.bridge import parse_bridge_overrides
from autopar.export.recipe_values import recipe_values
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset

REPO = Path(__file__).resolve().parents[2]
REFS = Path(sys.prefix) / "trainer-refs"
H100 = default_cluster("h100-sxm")
#: NVIDIA's Llama 3 70B recipe (megatron/bridge/recipes/llama/llama3.py llama3_70b_pretrain_config,
#: megatron-bridge 0.3.1): TP 4, PP 4, VPP 5, CP 2, SP, TP overlap, micro-batch 1, global batch 512
RECIPE_70B = ParallelPlan(
    tp=4, pp=4, vpp=5, cp=2, dp=4, micro_batch_size=1, global_batch_size=512, tp_comm_overlap=True, trainer="bridge"
)
#: the model's architecture (the recipe takes it from the HF config at run time, not from its
#: source) and the goodput model's checkpoint interval
FACTS = {
    "model.num_layers",
    "model.rotary_base",
    "model.layernorm_epsilon",
    "model.make_vocab_size_divisible_by",
    "checkpoint.save_interval",
}


def _written(plan: ParallelPlan) -> tuple[dict, dict]:
    bundle = get_exporter("bridge").render(plan, get_preset("llama3-70b"), H100, ExportOptions(seq_len=8192))
    return parse_bridge_overrides(bundle.text("bridge_overrides.txt")), bundle.meta["overrides"]


def test_the_recipes_own_layout_writes_only_the_models_facts():
    written, meant = _written(RECIPE_70B)
    assert set(written) == FACTS, sorted(written)
    # what it leaves out is the recipe's, by the recipe's own source lines
    recipe = recipe_values("bridge", "llama3_70b_pretrain_config")
    assert recipe["model.tensor_model_parallel_size"] == 4 and recipe["model.virtual_pipeline_model_parallel_size"] == 5
    assert recipe["model.tp_comm_overlap"] is True  # cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=True)
    assert meant["model.tp_comm_overlap"] is True and "model.tp_comm_overlap" not in written


def test_a_plan_that_departs_from_the_recipe_writes_each_departure():
    departs = ParallelPlan(
        tp=8, pp=2, cp=2, dp=8, micro_batch_size=1, global_batch_size=512, recompute="selective", trainer="bridge"
    )
    written, _ = _written(departs)
    assert written["model.tensor_model_parallel_size"] == 8 and written["model.pipeline_model_parallel_size"] == 2
    assert written["model.virtual_pipeline_model_parallel_size"] is None
    assert written["model.tp_comm_overlap"] is False  # the recipe's True, undone on purpose
    assert written["model.recompute_granularity"] == "selective"
    assert "model.context_parallel_size" not in written  # still the recipe's 2
    assert "model.fine_grained_activation_offloading" not in written  # newer Megatron-Core field, default False


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / f"scripts/{name}.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.mark.parametrize(
    "trainer,tree", [("bridge", "megatron/bridge/recipes"), ("nemo", "nemo/collections/llm/recipes")]
)
def test_the_shipped_recipe_values_are_the_reference_releases(trainer, tree):
    if not (REFS / tree).is_dir():
        pytest.fail(f"{REFS} lacks {tree}: the Makefile's setup step installs the reference packages")
    shipped = json.loads((REPO / f"autopar/export/data/{trainer}_recipes.json").read_text())
    assert _script(f"{trainer}_recipe_values").recipe_values(str(REFS)) == shipped


def test_nemo_writes_only_what_changes_its_recipe():
    """NeMo 2's llama3_70b recipe (nemo/collections/llm/recipes/llama3_70b.py: trainer() defaults tp 4,
    pp 4, vpp 5, cp 2, SP; MockDataModule mbs 1, gbs 512, seq 8192): the same layout writes the node
    and GPU counts (nemo_pretrain.py hands them to pretrain_recipe), the model config's sequence and
    layer count (from the model class, not the recipe's source) and the precision plugin's two fields."""
    from autopar.export.nemo import parse_nemo_script

    plan = RECIPE_70B.with_(trainer="nemo")
    bundle = get_exporter("nemo").render(plan, get_preset("llama3-70b"), H100, ExportOptions(seq_len=8192))
    written, overlap, recipe = parse_nemo_script(bundle.text("nemo_pretrain.py"))
    assert recipe == "llama3_70b" and overlap is True
    assert set(written) == {
        "trainer.num_nodes",
        "trainer.devices",
        "model.config.seq_length",
        "model.config.num_layers",
        "trainer.plugins.grad_reduce_in_fp32",
        "trainer.plugins.fp8",
    }
    assert recipe_values("nemo", "llama3_70b")["trainer.strategy.virtual_pipeline_model_parallel_size"] == 5
    departs = ParallelPlan(tp=8, pp=2, cp=2, dp=8, micro_batch_size=1, global_batch_size=512, trainer="nemo")
    written, _, _ = parse_nemo_script(
        get_exporter("nemo")
        .render(departs, get_preset("llama3-70b"), H100, ExportOptions(seq_len=8192))
        .text("nemo_pretrain.py")
    )
    assert written["trainer.strategy.tensor_model_parallel_size"] == 8
    assert written["trainer.strategy.virtual_pipeline_model_parallel_size"] is None
    assert "trainer.strategy.context_parallel_size" not in written


def test_the_extraction_reads_top_level_literals_and_forgets_conditional_ones(tmp_path):
    """A recipe tree written here: _pretrain_common's ConfigContainer(...) arguments, then a
    recipe's own statements in order; a field set under a condition, or to a call, is unknown."""
    root = tmp_path / "megatron/bridge/recipes"
    root.mkdir(parents=True)
    (root / "common.py").write_text(
        "def _pretrain_common():\n"
        "    opt, sched = distributed_fused_adam_with_cosine_annealing()\n"
        "    cfg = ConfigContainer(train=TrainingConfig(micro_batch_size=2, global_batch_size=32),\n"
        "                          ddp=DistributedDataParallelConfig(overlap_grad_reduce=True),\n"
        "                          mixed_precision='bf16_mixed')\n"
        "    return cfg\n"
    )
    (root / "utils.py").write_text(
        "def distributed_fused_adam_with_cosine_annealing():\n"
        "    return OptimizerConfig(use_distributed_optimizer=True, lr=max_lr), None\n"
    )
    (root / "toy.py").write_text(
        "def llama3_8b_pretrain_config():\n"
        "    cfg = _pretrain_common()\n"
        "    cfg.model = AutoBridge.from_hf_pretrained('x').to_megatron_provider(load_weights=False)\n"
        "    cfg.model.tensor_model_parallel_size = 2\n"
        "    cfg.train.global_batch_size = 128\n"
        "    cfg.model.sequence_parallel = True\n"
        "    if flag:\n"
        "        cfg.model.sequence_parallel = False\n"
        "    cfg.model.pipeline_dtype = torch.bfloat16\n"
        "    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)\n"
        "    cfg.mixed_precision = get_mixed_precision_config('bf16_with_fp8_current_scaling_mixed')\n"
        "    return cfg\n"
    )
    script = _script("bridge_recipe_values")
    funcs = script._functions(tmp_path)
    base = script._common_values(funcs["_pretrain_common"][1]) | script._optimizer_values(funcs)
    got = script._assigned(funcs["llama3_8b_pretrain_config"][1], dict(base))
    assert got == {
        "train.micro_batch_size": 2,
        "train.global_batch_size": 128,
        "ddp.overlap_grad_reduce": True,
        "optimizer.use_distributed_optimizer": True,
        "model.tensor_model_parallel_size": 2,
        "model.tp_comm_overlap": False,
        "mixed_precision": "bf16_with_fp8_current_scaling_mixed",
    }
