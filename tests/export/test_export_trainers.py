"""The trainers' own parsers and config classes accept the exports (real PyPI packages).

Installed by `make setup` (the `test` extras and the no-deps line of the Makefile); a missing
package FAILS these tests, it never skips them:
- deepspeed 0.19.8: `DeepSpeedConfig` loads ds_config.json with a fake mpu and derives the batch;
- megatron-core 0.16.1: `TransformerConfig` / `DistributedDataParallelConfig` accept the Megatron-LM
  flags, the NeMo 2 strategy overrides and the Megatron-Bridge model/ddp overrides, and Megatron-Core's
  own layer placement (`get_num_layers_to_build`, `PipelineParallelLayerLayout`) reproduces the plan's
  layout;
- torchtitan 0.3.0: the Python config function builds a `Trainer.Config` (also through
  `ConfigManager --module/--config`), `ParallelDims` accepts the degrees and every
  `module_fqns_per_model_part` name is a module of the model built on the meta device;
- torchtitan 0.2.2, Megatron-Bridge 0.3.1 and NeMo 2.7.3 (no-deps, in <venv>/trainer-refs):
  torchtitan 0.2.2's `ConfigManager` loads the TOML in a subprocess (same checks); Megatron-Bridge
  and NeMo import transformer-engine (CUDA) at package import, so their override paths are checked
  against the installed sources (ast): ConfigContainer groups, TrainingConfig, MegatronStrategy and
  MegatronMixedPrecision arguments, recipe names.
Megatron-LM's `pretrain_gpt.py` argparse and Megatron-DeepSpeed are not on PyPI: their flags are
checked against the reference flag lists (shared/reference/formulas-and-formats.md B.1, B.4) and,
for Megatron-LM, against the Megatron-Core dataclass fields the flags are generated from.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import pytest
from export_cases import CASES

from autopar.export import get_exporter
from autopar.export.bash import read_bash_array
from autopar.export.megatron_parse import megatron_vpp, parse_megatron_args

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning"),
    pytest.mark.slow,
]  # the trainers' own packages load: about 15 s for the module
REFS = Path(sys.prefix) / "trainer-refs"
REFS_INSTALL = (
    "python -m pip install --no-deps --target <venv>/trainer-refs torchtitan==0.2.2 "
    "megatron-bridge==0.3.1 nemo-toolkit==2.7.3   (the Makefile's setup step does this)"
)


def accepted(variant: str) -> list:
    return [c for c in CASES if variant not in c.refuse]


def render(case, name: str, **opts):
    return get_exporter(name).render(case.plan, case.spec, case.cluster, case.options(opts))


def stages_of(case) -> tuple[int, ...]:
    return tuple(case.plan.resolved_layout(case.spec.num_layers).stages)


def refs_file(rel: str) -> Path:
    p = REFS / rel
    if not p.is_file():
        pytest.fail(f"{p} is missing; install the reference packages: {REFS_INSTALL}")
    return p


def ast_fields(path: Path, cls: str) -> set[str]:
    """Annotated fields of a dataclass in a source file (no import)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    raise AssertionError(f"no class {cls} in {path}")


def ast_init_params(path: Path, cls: str) -> set[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    return {a.arg for a in f.args.args + f.args.kwonlyargs}
    raise AssertionError(f"no {cls}.__init__ in {path}")


def ast_functions(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


# ---- DeepSpeed ----------------------------------------------------------------------------------

DS_CASES = accepted("deepspeed")


@pytest.mark.parametrize("case", DS_CASES, ids=[c.id for c in DS_CASES])
def test_deepspeed_config_class_loads_the_json(case, tmp_path, monkeypatch) -> None:
    from deepspeed.runtime import config as dsc

    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    p = case.plan

    class Mpu:  # Megatron's mpu as DeepSpeed sees it: the data-parallel world size
        def get_data_parallel_world_size(self):
            return p.dp

    bundle = render(case, "deepspeed")
    bundle.write(tmp_path)
    cfg = dsc.DeepSpeedConfig(str(tmp_path / "ds_config.json"), mpu=Mpu())
    assert cfg.world_size == p.dp
    assert cfg.train_batch_size == p.global_batch_size
    assert cfg.train_micro_batch_size_per_gpu == p.micro_batch_size
    assert cfg.gradient_accumulation_steps == p.num_microbatches
    assert cfg.zero_optimization_stage == p.zero_stage
    assert cfg.bfloat16_config.enabled == (p.dtype == "bf16")
    assert str(cfg.grad_accum_dtype) == ("fp32" if p.main_grads_fp32 else "bf16")
    # DeepSpeed derives the same gradient accumulation from train batch, micro batch and DP world
    data = json.loads((tmp_path / "ds_config.json").read_text())
    del data["gradient_accumulation_steps"]
    derived = dsc.DeepSpeedConfig(data, mpu=Mpu())
    assert derived.gradient_accumulation_steps == p.num_microbatches


def test_deepspeed_pipeline_engine_still_rejects_zero2_and_3() -> None:
    """The refusal quotes DeepSpeed's own assertion; check the installed engine still has it."""
    import deepspeed.runtime.pipe.engine as engine

    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in Path(engine.__file__).read_text()


#: Megatron-DeepSpeed flags (megatron/arguments.py, not on PyPI): reference B.4 and the Megatron-LM
#: flags of B.1 it inherits; the last set is from its examples_deepspeed/pretrain_llama2_distributed.sh.
MDS_FLAGS = {
    "--deepspeed",
    "--deepspeed_config",
    "--zero-stage",
    "--no-pipeline-parallel",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--sequence-parallel",
    "--deepspeed-activation-checkpointing",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--kv-channels",
    "--seq-length",
    "--max-position-embeddings",
    "--swiglu",
    "--normalization",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--micro-batch-size",
    "--global-batch-size",
    "--bf16",
} | {"--num-key-value-heads", "--use-rotary-position-embeddings", "--attention-dropout", "--hidden-dropout"}
#: Megatron-DeepSpeed megatron/arguments.py (not on PyPI; not in reference B.4): --rope-theta (float,
#: default 10000), --layernorm-epsilon and --make-vocab-size-divisible-by (Megatron-LM's old names),
#: --use-flash-attn-v2 (FlashSelfAttention), --save-interval / --save / --load (checkpointing)
MDS_FLAGS |= {"--rope-theta", "--layernorm-epsilon", "--make-vocab-size-divisible-by", "--use-flash-attn-v2"}
MDS_FLAGS |= {"--save-interval"}
#: Megatron-DeepSpeed megatron/arguments.py --cpu-optimizer (the DeepSpeedCPUAdam ZeRO-Offload needs,
#: megatron/optimizer/__init__.py; not on PyPI, not in reference B.4: from memory)
MDS_FLAGS |= {"--cpu-optimizer"}


@pytest.mark.parametrize("case", DS_CASES, ids=[c.id for c in DS_CASES])
def test_megatron_deepspeed_flags_are_known(case) -> None:
    text = render(case, "deepspeed").text("megatron_deepspeed_args.sh")
    argv = read_bash_array(text, "AUTOPAR_ARGS") + read_bash_array(text, "DS_ARGS")
    flags = {a for a in argv if a.startswith("--")}
    assert flags <= MDS_FLAGS, flags - MDS_FLAGS


# ---- Megatron-Core (Megatron-LM, NeMo 2, Megatron-Bridge) -----------------------------------------


def _core():
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    return torch, TransformerConfig, MLATransformerConfig, DistributedDataParallelConfig, get_num_layers_to_build


def _shape_kwargs(model) -> dict:
    kw = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        kv_channels=model.head_dim,
        num_query_groups=model.num_kv_heads,
        gated_linear_unit=model.gated_mlp,
        add_bias_linear=model.linear_bias,
        normalization="RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
    )
    if model.moe is not None:
        kw.update(
            num_moe_experts=model.moe.num_experts,
            moe_router_topk=model.moe.top_k,
            moe_ffn_hidden_size=model.moe.expert_ffn_hidden_size,
            moe_token_dispatcher_type="alltoall",
        )
    return kw


def _check_core_config(case, fields: dict) -> None:
    """Build the real TransformerConfig from the parallel/recompute fields and compare Megatron-Core's
    own layer placement with the plan's layout."""
    torch, TransformerConfig, _, _, get_num_layers_to_build = _core()
    from megatron.core.transformer.enums import LayerType

    p = case.plan
    kw = _shape_kwargs(case.spec) | {k: v for k, v in fields.items() if v is not None or k.startswith("num_layers_in")}
    kw = {k: v for k, v in kw.items() if not (k.startswith("account_for") and v is False)}
    if p.pp > 1:
        kw["pipeline_dtype"] = torch.bfloat16
    if p.dtype != "fp32":  # NeMo's / Bridge's mixed-precision plugin sets it at run time, Megatron-LM's --bf16
        kw.setdefault("bf16", True)
    config_class = TransformerConfig
    if case.spec.mla is not None and "mla_up_proj" in p.selective_modules:  # Megatron-Core asserts MLA for it
        m = case.spec.mla
        config_class = _core()[2]
        kw |= dict(
            q_lora_rank=m.q_lora_rank,
            kv_lora_rank=m.kv_lora_rank,
            qk_head_dim=m.qk_nope_head_dim,
            qk_pos_emb_head_dim=m.qk_rope_head_dim,
            v_head_dim=m.v_head_dim,
        )
    # MoE in FP8 needs Transformer Engine >= 1.7 (not installed here): pretend the cluster's
    te_check = "megatron.core.transformer.transformer_config.is_te_min_version"
    with mock.patch(te_check, lambda *a, **k: True) if case.spec.moe and p.dtype == "fp8" else nullcontext():
        cfg = config_class(**kw)
    assert cfg.tensor_model_parallel_size == p.tp and cfg.pipeline_model_parallel_size == p.pp
    if "fp8_recipe" in fields:  # the recipe Megatron-Core scales the plan's FP8 GEMMs by
        assert cfg.fp8_recipe == (p.with_(trainer="megatron").fp8_recipe_used or "delayed")
        assert bool(cfg.fp8) == (p.dtype == "fp8")
    capacity = case.spec.moe is not None and p.moe_dispatch == "capacity"
    assert cfg.moe_expert_capacity_factor == (p.capacity_factor if capacity else None)
    assert cfg.moe_pad_expert_input_to_capacity == capacity and cfg.moe_token_drop_policy == "probs"
    if case.spec.moe is not None:
        assert cfg.moe_token_dispatcher_type == ("flex" if p.moe_dispatcher == "deepep" else "alltoall")
        assert cfg.moe_flex_dispatcher_backend == "deepep"
        assert cfg.overlap_moe_expert_parallel_comm == (p.ep_comm_overlap and p.ep > 1)
    assert cfg.context_parallel_size == p.cp and cfg.sequence_parallel == p.sequence_parallel
    if p.recompute == "selective":  # Megatron-Core's own list, its default filled in (["core_attn"])
        assert sorted(cfg.recompute_modules) == sorted(p.selective_modules)
    # fine-grained activation offloading: Megatron-Core's own check of the module names passed
    assert cfg.fine_grained_activation_offloading == bool(p.offload_modules)
    assert sorted(cfg.offload_modules or []) == sorted(p.offload_modules or [])
    if case.spec.moe is not None:
        assert cfg.expert_model_parallel_size == p.ep and cfg.expert_tensor_parallel_size == p.etp
    vpp = cfg.virtual_pipeline_model_parallel_size or 1
    assert vpp == p.vpp
    if p.pp == 1:
        return
    built = []
    for i in range(p.pp * p.vpp):
        r, v = i % p.pp, i // p.pp
        if cfg.pipeline_model_parallel_layout is not None:
            built.append(cfg.pipeline_model_parallel_layout.layout[r][v].count(LayerType.decoder))
        else:
            built.append(get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=r))
    assert tuple(built) == stages_of(case)


MEGATRON_CASES = accepted("megatron")


def _megatron_core_fields(ns) -> dict:
    """What Megatron-LM's arguments.py hands Megatron-Core for these flags."""
    vpp = megatron_vpp(ns)
    return {
        "tensor_model_parallel_size": ns.tensor_model_parallel_size,
        "pipeline_model_parallel_size": ns.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": vpp if vpp > 1 and not ns.pipeline_model_parallel_layout else None,
        "context_parallel_size": ns.context_parallel_size,
        "sequence_parallel": ns.sequence_parallel,
        "expert_model_parallel_size": ns.expert_model_parallel_size or 1,
        "expert_tensor_parallel_size": ns.expert_tensor_parallel_size,
        "num_layers_in_first_pipeline_stage": ns.decoder_first_pipeline_num_layers,
        "num_layers_in_last_pipeline_stage": ns.decoder_last_pipeline_num_layers,
        "pipeline_model_parallel_layout": ns.pipeline_model_parallel_layout,
        "recompute_granularity": ns.recompute_granularity,
        "recompute_method": ns.recompute_method,
        "recompute_num_layers": ns.recompute_num_layers,
        "recompute_modules": ns.recompute_modules,
        "fine_grained_activation_offloading": ns.fine_grained_activation_offloading,
        "offload_modules": ns.offload_modules,
        "tp_comm_overlap": ns.tp_comm_overlap,
        "bf16": ns.bf16,
        "fp8": ns.fp8_format,
        "hidden_dropout": ns.hidden_dropout,
        "attention_dropout": ns.attention_dropout,
        "moe_grouped_gemm": ns.moe_grouped_gemm,
        "moe_expert_capacity_factor": ns.moe_expert_capacity_factor,
        "moe_token_drop_policy": ns.moe_token_drop_policy,
        "moe_pad_expert_input_to_capacity": ns.moe_pad_expert_input_to_capacity or None,
        "moe_token_dispatcher_type": ns.moe_token_dispatcher_type,
        "moe_flex_dispatcher_backend": ns.moe_flex_dispatcher_backend,
        "overlap_moe_expert_parallel_comm": ns.overlap_moe_expert_parallel_comm or None,
        "fp8_recipe": ns.fp8_recipe if ns.fp8_format else None,
        "fp8_param": ns.fp8_param_gather or None,  # arguments.py: config.fp8_param = args.fp8_param_gather
    }


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=[c.id for c in MEGATRON_CASES])
def test_megatron_flags_build_a_megatron_core_config(case) -> None:
    argv = read_bash_array(render(case, "megatron").text("megatron_args.sh"), "AUTOPAR_ARGS")
    ns = parse_megatron_args(argv)
    assert ns.num_layers == case.spec.num_layers and ns.hidden_size == case.spec.hidden_size
    _check_core_config(case, _megatron_core_fields(ns))
    _, _, _, DDP, _ = _core()
    z = case.plan.zero_stage
    ddp = DDP(
        use_distributed_optimizer=ns.use_distributed_optimizer,
        overlap_grad_reduce=ns.overlap_grad_reduce,
        overlap_param_gather=ns.overlap_param_gather,
        use_megatron_fsdp=ns.use_megatron_fsdp,
        data_parallel_sharding_strategy=ns.data_parallel_sharding_strategy or "no_shard",
        grad_reduce_in_fp32=not ns.grad_reduce_in_bf16,
        fp8_param_gather=ns.fp8_param_gather,
        reuse_grad_buf_for_mxfp8_param_ag=ns.reuse_grad_buf_for_mxfp8_param_ag,
    )
    assert ddp.use_distributed_optimizer == (z >= 1) and ddp.use_megatron_fsdp == (z >= 2)
    plan = case.plan.with_(trainer="megatron")
    assert ddp.fp8_param_gather == bool(plan.fp8_param_gather_used)
    # MXFP8 parameters gather into the gradient buffer, as Megatron-Core recommends (no warning below)
    mxfp8_params = plan.fp8_recipe_used == "mxfp8" and bool(plan.fp8_param_gather_used)
    assert ddp.reuse_grad_buf_for_mxfp8_param_ag == mxfp8_params
    _check_optimizer_config(
        case,
        fp8_recipe=ns.fp8_recipe if ns.fp8_format else None,
        reuse_grad_buf_for_mxfp8_param_ag=ns.reuse_grad_buf_for_mxfp8_param_ag,
        use_distributed_optimizer=ns.use_distributed_optimizer,
        optimizer_cpu_offload=ns.optimizer_cpu_offload,
        optimizer_offload_fraction=ns.optimizer_offload_fraction or 0.0,
        use_precision_aware_optimizer=ns.use_precision_aware_optimizer,
        overlap_cpu_optimizer_d2h_h2d=ns.overlap_cpu_optimizer_d2h_h2d,
    )


def _check_optimizer_config(case, **fields) -> None:
    """Megatron-Core's OptimizerConfig accepts the optimizer fields (its __post_init__ checks the
    precision-aware optimizer, which CPU offload reuses, against the distributed optimizer) and holds
    the plan's offloaded share."""
    from megatron.core.optimizer import OptimizerConfig

    # the precision-aware check asks Transformer Engine's version (CUDA, not installed): pretend 2.1+,
    # after which CPU offload returns before any TE import (optimizer_config.py __post_init__)
    with (
        mock.patch("megatron.core.optimizer.optimizer_config.is_te_min_version", lambda *a, **k: True),
        warnings.catch_warnings(),
    ):
        # MXFP8 parameters gathered without the gradient-buffer reuse are warned about ("significant
        # amount additional GPU memory"): the exports set it with them, so the warning is an error
        if fields.get("reuse_grad_buf_for_mxfp8_param_ag"):
            warnings.filterwarnings("error", message="mxfp8 without")
        cfg = OptimizerConfig(bf16=case.plan.dtype != "fp32", **fields)
    share = case.plan.optimizer_offload
    assert cfg.optimizer_cpu_offload == (share > 0)
    assert (cfg.optimizer_offload_fraction if cfg.optimizer_cpu_offload else 0.0) == share
    if share:
        assert cfg.use_distributed_optimizer and cfg.use_precision_aware_optimizer
        assert cfg.use_precision_aware_optimizer_no_fp8_or_ds_fp8  # the hybrid optimizer's code path


#: flags of reference B.1 that are not Megatron-Core dataclass fields (training-loop arguments)
MEGATRON_B1_FLAGS = {
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--micro-batch-size",
    "--global-batch-size",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy",
    "--group-query-attention",
    "--seq-length",
    "--max-position-embeddings",
    "--swiglu",
    "--position-embedding-type",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--num-experts",
    "--moe-router-topk",
    "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size",
    "--moe-layer-freq",
    "--moe-token-dispatcher-type",
    "--moe-grouped-gemm",
    "--bf16",
    "--fp8-format",
    "--tp-comm-overlap",
    "--sequence-parallel",
}
#: not in the reference and not a dataclass field: Megatron-LM arguments.py, from memory
MEGATRON_OTHER_FLAGS = {"--grad-reduce-in-bf16"}
#: Megatron-LM arguments.py training-loop and checkpoint flags: --rotary-base (int; MLATransformerConfig
#: has rotary_base, TransformerConfig not), --norm-epsilon (layernorm_epsilon's argparse name in
#: megatron-core 0.16.1 transformer_config.py), --make-vocab-size-divisible-by (reference B.1),
#: --save-interval and --ckpt-format (checkpointing), --no-gradient-accumulation-fusion (store_false)
MEGATRON_OTHER_FLAGS |= {"--rotary-base", "--norm-epsilon", "--make-vocab-size-divisible-by", "--save-interval"}
MEGATRON_OTHER_FLAGS |= {"--ckpt-format", "--no-gradient-accumulation-fusion"}


def test_every_megatron_flag_is_known() -> None:
    _, TransformerConfig, MLATransformerConfig, DDP, _ = _core()
    from megatron.core.optimizer import OptimizerConfig

    classes = (TransformerConfig, MLATransformerConfig, DDP, OptimizerConfig)
    fields = {f.name for cls in classes for f in dataclasses.fields(cls)}
    known = MEGATRON_B1_FLAGS | MEGATRON_OTHER_FLAGS | {"--" + f.replace("_", "-") for f in fields}
    emitted = set()
    for case in MEGATRON_CASES:
        argv = read_bash_array(render(case, "megatron").text("megatron_args.sh"), "AUTOPAR_ARGS")
        emitted |= {a for a in argv if a.startswith("--")}
    assert emitted - known == set()


BRIDGE_CASES = accepted("bridge")


@pytest.mark.parametrize("case", BRIDGE_CASES, ids=[c.id for c in BRIDGE_CASES])
def test_bridge_overrides_build_megatron_core_configs(case) -> None:
    from autopar.export.bridge import hydra_value, parse_bridge_overrides
    from autopar.export.recipe_values import recipe_values

    _, TransformerConfig, _, DDP, _ = _core()
    bundle = render(case, "bridge")
    ov = bundle.meta["overrides"]  # every field the plan sets
    written = parse_bridge_overrides(bundle.text("bridge_overrides.txt"))
    recipe = recipe_values("bridge", bundle.meta["recipe"])
    # the file writes what the recipe does not already hold: the rest are the recipe's own values
    # (offload_modules is read only with offloading on)
    for k, v in ov.items():
        if k in written:
            assert hydra_value(written[k]) == hydra_value(v), k
        elif k != "model.offload_modules" or ov.get("model.fine_grained_activation_offloading"):
            assert hydra_value(recipe[k]) == hydra_value(v), k
    assert set(written) <= set(ov)
    model = {k.removeprefix("model."): v for k, v in ov.items() if k.startswith("model.")}
    provider_only = {"seq_length", "rotary_base", "make_vocab_size_divisible_by"}  # GPTModelProvider fields
    tc_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert set(model) - provider_only <= tc_fields
    assert model.pop("num_layers") == case.spec.num_layers
    _check_core_config(case, {k: v for k, v in model.items() if k not in provider_only})
    ddp = {k.removeprefix("ddp."): v for k, v in ov.items() if k.startswith("ddp.")}
    DDP(**ddp)
    _check_optimizer_config(
        case, **{k.removeprefix("optimizer."): v for k, v in ov.items() if k.startswith("optimizer.")}
    )


def test_bridge_override_paths_exist_in_the_installed_release() -> None:
    from megatron.core.optimizer import OptimizerConfig

    from autopar.export.bridge import BRIDGE_RECIPES, MIXED, MIXED_BACK, parse_bridge_overrides
    from autopar.spec.fp8_recipes import BRIDGE_PARAM_GATHER

    config = refs_file("megatron/bridge/training/config.py")
    provider = refs_file("megatron/bridge/models/gpt_provider.py")
    groups = ast_fields(config, "ConfigContainer")
    train = ast_fields(config, "TrainingConfig")
    assert {"model", "train", "ddp", "optimizer", "dataset", "mixed_precision"} <= groups
    assert "seq_length" in ast_fields(provider, "GPTModelProvider")
    assert "seq_length" in (REFS / "megatron/bridge/training/config.py").read_text().split("class GPTDatasetConfig")[1]
    optimizer_fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    for case in BRIDGE_CASES:
        ov = parse_bridge_overrides(render(case, "bridge").text("bridge_overrides.txt"))
        for k in ov:
            group, _, name = k.partition(".")
            assert group in groups, k
            if group == "train":
                assert name in train, k
            if group == "optimizer":
                assert name in optimizer_fields, k
    registered = {
        n.name
        for n in ast.parse(refs_file("megatron/bridge/training/mixed_precision.py").read_text()).body
        if isinstance(n, ast.FunctionDef) and any(getattr(d, "id", None) == "register" for d in n.decorator_list)
    }
    assert set(MIXED.values()) <= registered
    # each registered recipe sets the fp8_recipe it is keyed by (`cfg.fp8_recipe = "..."`; none: no FP8)
    for fn in ast.parse(refs_file("megatron/bridge/training/mixed_precision.py").read_text()).body:
        if isinstance(fn, ast.FunctionDef) and fn.name in MIXED_BACK:
            sets = [
                n.value.value
                for n in ast.walk(fn)
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "attr", None) == "fp8_recipe"
            ]
            assert sets == ([MIXED_BACK[fn.name][1]] if MIXED_BACK[fn.name][1] else []), fn.name
            # and the FP8 parameter gather autopar prices for it (autopar.spec.fp8_recipes)
            gathers = [
                n.value.value
                for n in ast.walk(fn)
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "attr", None) == "fp8_param_gather"
            ]
            if MIXED_BACK[fn.name][1]:
                assert gathers == [BRIDGE_PARAM_GATHER[MIXED_BACK[fn.name][1]]], fn.name
    recipes = set()
    for path in (REFS / "megatron/bridge/recipes").rglob("*.py"):
        recipes |= ast_functions(path)
    assert set(BRIDGE_RECIPES.values()) <= recipes, set(BRIDGE_RECIPES.values()) - recipes


NEMO_CASES = accepted("nemo")


@pytest.mark.parametrize("case", NEMO_CASES, ids=[c.id for c in NEMO_CASES])
def test_nemo_overrides_build_megatron_core_configs(case) -> None:
    from autopar.export.nemo import parse_nemo_script
    from autopar.export.recipe_values import recipe_values

    _, _, _, DDP, _ = _core()
    bundle = render(case, "nemo")
    ov = bundle.meta["overrides"]  # every field the plan sets
    written, _, recipe_name = parse_nemo_script(bundle.text("nemo_pretrain.py"))
    recipe = recipe_values("nemo", recipe_name)
    # the script writes what the recipe does not already hold: the rest are the recipe's own values
    # (offload_modules is read only with offloading on)
    for k, v in ov.items():
        if k in written:
            assert written[k] == v, k
        elif k != "model.config.offload_modules" or ov.get("model.config.fine_grained_activation_offloading"):
            assert recipe[k] == v or list(recipe[k]) == list(v), k
    assert set(written) <= set(ov)
    strategy = {
        k.removeprefix("trainer.strategy."): v
        for k, v in ov.items()
        if k.startswith("trainer.strategy.") and k.count(".") == 2 and k != "trainer.strategy.fsdp"
    }
    # MegatronStrategy hands its optimizer-instance count to Megatron-Core's DDP config, not the model's
    instances = {k: strategy.pop(k) for k in ("num_distributed_optimizer_instances",) if k in strategy}
    model = {k.removeprefix("model.config."): v for k, v in ov.items() if k.startswith("model.config.")}
    assert model.pop("num_layers") == case.spec.num_layers and model.pop("seq_length") == case.seq
    _check_core_config(case, strategy | model)
    ddp = {k.removeprefix("trainer.strategy.ddp."): v for k, v in ov.items() if k.startswith("trainer.strategy.ddp.")}
    DDP(**ddp, **instances)
    # MXFP8 parameters gather into the gradient buffer (MegatronMixedPrecision hands it to the DDP config)
    plan = case.plan.with_(trainer="nemo")
    mxfp8_params = plan.fp8_recipe_used == "mxfp8" and bool(plan.fp8_param_gather_used)
    assert ov.get("trainer.plugins.reuse_grad_buf_for_mxfp8_param_ag", False) == mxfp8_params
    _check_optimizer_config(
        case, **{k.removeprefix("optim.config."): v for k, v in ov.items() if k.startswith("optim.config.")}
    )


def test_nemo_override_paths_exist_in_the_installed_release() -> None:
    from megatron.core.optimizer import OptimizerConfig

    from autopar.export.nemo import NEMO_RECIPES, parse_nemo_script

    strategy = ast_init_params(refs_file("nemo/lightning/pytorch/strategies/megatron_strategy.py"), "MegatronStrategy")
    plugins = ast_init_params(refs_file("nemo/lightning/pytorch/plugins/mixed_precision.py"), "MegatronMixedPrecision")
    data = ast_init_params(refs_file("nemo/collections/llm/gpt/data/mock.py"), "MockDataModule")
    refs_file("nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py")
    _, TransformerConfig, _, DDP, _ = _core()
    tc = {f.name for f in dataclasses.fields(TransformerConfig)}
    tc |= ast_fields(refs_file("nemo/collections/llm/gpt/model/base.py"), "GPTConfig")  # model.config is a GPTConfig
    ddp = {f.name for f in dataclasses.fields(DDP)}
    opt = {f.name for f in dataclasses.fields(OptimizerConfig)}
    for case in NEMO_CASES:
        bundle = render(case, "nemo")
        written, _, _ = parse_nemo_script(bundle.text("nemo_pretrain.py"))
        ov = bundle.meta["overrides"]
        assert set(written) <= set(ov)
        for k in ov:
            parts = k.split(".")
            if parts[:2] == ["trainer", "strategy"]:
                assert (parts[2] in strategy) if len(parts) == 3 else (parts[2] == "ddp" and parts[3] in ddp), k
            elif parts[:2] == ["trainer", "plugins"]:
                assert parts[2] in plugins, k
            elif parts[0] == "trainer":
                assert parts[1] in ("num_nodes", "devices"), k
            elif parts[0] == "data":
                assert parts[1] in data, k
            elif parts[:2] == ["model", "config"]:
                assert parts[2] in tc, k
            elif parts[:2] == ["optim", "config"]:
                assert parts[2] in opt, k
            else:
                raise AssertionError(f"unexpected override {k}")
    for module in set(NEMO_RECIPES.values()):
        assert "pretrain_recipe" in ast_functions(refs_file(f"nemo/collections/llm/recipes/{module}.py")), module


def test_megatron_layout_strings_parse_with_megatron_core() -> None:
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    from autopar.export.layouts import layout_string, stages_from_layout_string

    for stages, pp in [
        ((19, 21, 19, 21), 4),
        ((9,) + (10,) * 6 + (11,), 4),
        ((0, 5, 5, 5, 5, 0), 2),
        ((1,) + (2,) * 62 + (1,), 16),
        ((3, 1, 1, 1, 4), 5),
    ]:
        text = layout_string(stages)
        real = PipelineParallelLayerLayout.parse_str_to_list(text)
        assert tuple(s.count(LayerType.decoder) for s in real) == stages == stages_from_layout_string(text)
        PipelineParallelLayerLayout(text, pp).validate_layer_layout(num_layers=sum(stages), mtp_num_layers=None)


# ---- torchtitan 0.3 (Python config) ---------------------------------------------------------------

TITAN_CASES = accepted("torchtitan")


@pytest.fixture(scope="module")
def meta_models():
    """One meta-device model per torchtitan base config (module names for the FQN check)."""
    return {}


@pytest.mark.parametrize("case", TITAN_CASES, ids=[c.id for c in TITAN_CASES])
def test_torchtitan_python_config_builds_a_trainer_config(case, tmp_path, monkeypatch, meta_models) -> None:
    import importlib

    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.parallel_dims import ParallelDims

    p = case.plan
    if p.dtype == "fp8":  # the converters check the GPU when configured: pretend an H100 (SM90) or a B200 (SM100)
        monkeypatch.setattr("torchtitan.components.quantization.float8.has_cuda_capability", lambda *a: True)
        monkeypatch.setattr("torchtitan.components.quantization.mx.has_cuda_capability", lambda *a: True)
    bundle = render(case, "torchtitan")
    bundle.write(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "autopar_torchtitan", raising=False)
    cfg = importlib.import_module("autopar_torchtitan").autopar_plan()
    par, tr = cfg.parallelism, cfg.training
    assert (
        par.tensor_parallel_degree,
        par.pipeline_parallel_degree,
        par.context_parallel_degree,
        par.expert_parallel_degree,
    ) == (p.tp, p.pp, p.cp, p.ep)
    assert par.enable_sequence_parallel == p.sequence_parallel
    dims = ParallelDims.from_config(par, world_size=p.num_gpus)
    assert dims.dp_replicate * dims.dp_shard == p.dp
    assert tr.seq_len == case.seq and tr.global_batch_size == p.global_batch_size
    if p.pp > 1:
        assert par.pipeline_parallel_microbatch_size == p.micro_batch_size
        assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == p.num_microbatches
        assert len(par.module_fqns_per_model_part) == p.pp * p.vpp
    else:
        assert tr.local_batch_size == p.micro_batch_size
        assert tr.global_batch_size // (tr.local_batch_size * p.dp) == p.num_microbatches
    ac = cfg.activation_checkpoint
    assert {"none": ac is None, "selective": isinstance(ac, SelectiveAC.Config), "full": isinstance(ac, FullAC.Config)}[
        p.recompute
    ]
    assert cfg.compile.enable_async_tensor_parallel == p.tp_comm_overlap
    assert cfg.compile.enable == p.compile and "model" in cfg.compile.components
    from torchtitan.components.quantization.float8 import Float8Linear
    from torchtitan.components.quantization.mx import MXFP8Linear
    from torchtitan.models.common.moe import GroupedExperts

    recipe = p.with_(trainer="torchtitan").fp8_recipe_used if p.dtype == "fp8" else None
    model_cfg = cfg.model_spec.model
    float8 = list(model_cfg.traverse(Float8Linear.Config))
    mx = list(model_cfg.traverse(MXFP8Linear.Config))
    assert bool(float8) == (recipe not in (None, "mxfp8")) and bool(mx) == (recipe == "mxfp8")
    if float8:  # torchao's config of the plan's recipe (rowwise_with_gw_hp: the weight gradient in BF16)
        from torchao.float8 import Float8LinearConfig

        want = Float8LinearConfig.from_recipe_name(recipe)
        assert all(c._torchao_config == want for _, c, _, _ in float8)
    # the LM head stays BF16 (the cost model prices it so); the layers' linears are all converted
    assert all(fqn.split(".")[-1] != "lm_head" for fqn, _, _, _ in float8 + mx)
    if recipe:
        from torchtitan.models.common.linear import Linear

        plain = [fqn for fqn, c, _, _ in model_cfg.traverse(Linear.Config) if type(c) is Linear.Config]
        assert all("layers" not in fqn for fqn in plain), plain
    experts = [type(c).__qualname__ for _, c, _, _ in model_cfg.traverse(GroupedExperts.Config)]
    if case.spec.moe is not None:  # a MoE model's expert GEMMs in the plan's precision too
        quantized = {None: "GroupedExperts", "mxfp8": "MXFP8GroupedExperts"}.get(recipe, "Float8GroupedExperts")
        assert experts and all(q.split(".")[-2] == quantized for q in experts), experts
    from torchtitan.models.common.token_dispatcher import DeepEPTokenDispatcher

    deepep = case.spec.moe is not None and p.moe_dispatcher == "deepep"
    assert bool(list(cfg.model_spec.model.traverse(DeepEPTokenDispatcher.Config))) == deepep
    # the real command line path: --module/--config through ConfigManager (tyro)
    parsed = ConfigManager().parse_args(["--module", "autopar_torchtitan", "--config", "autopar_plan"])
    assert parsed.parallelism == par and parsed.training == tr
    # every module name of the pipeline split exists in the model
    if p.pp > 1:
        key = (case.model, case.seq)
        if key not in meta_models:
            with torch.device("meta"):
                meta_models[key] = cfg.model_spec.model.build()
        model = meta_models[key]
        assert len(model.get_submodule("layers")) == case.spec.num_layers
        for part in par.module_fqns_per_model_part:
            for name in part:
                model.get_submodule(name)


# ---- torchtitan 0.2.2 (TOML), in a subprocess with the 0.2.2 sources first on the path ---------

TOML_DRIVER = r"""
import json, sys, torch
from torchtitan.config import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.protocols.train_spec import get_train_spec
import torchtitan.components.quantization.float8, torchtitan.components.quantization.mx  # register the converters
from torchtitan.protocols.model_converter import _registry_model_converter_cls as registry
out = {}
models = {}
for path, world in json.loads(sys.argv[1]):
    c = ConfigManager().parse_args(["--job.config_file", path])
    par = c.parallelism
    dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                       cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                       ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree, world_size=world)
    spec = get_train_spec(c.model.name)
    args = spec.model_args[c.model.flavor]
    missing = []
    if par.module_fqns_per_model_part:
        key = (c.model.name, c.model.flavor)
        if key not in models:
            with torch.device("meta"):
                models[key] = spec.model_cls(args)
        for part in par.module_fqns_per_model_part:
            for name in part:
                try:
                    models[key].get_submodule(name)
                except AttributeError:
                    missing.append(name)
    out[path] = {"torchtitan": __import__("torchtitan").__file__, "n_layers": args.n_layers,
                 "dp": dims.dp_replicate * dims.dp_shard, "missing": missing,
                 "parallelism": {k: getattr(par, k) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                 "context_parallel_degree", "expert_parallel_degree", "expert_tensor_parallel_degree",
                                 "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                                 "fsdp_reshard_after_forward", "enable_async_tensor_parallel")},
                 "training": {k: getattr(c.training, k) for k in ("local_batch_size", "global_batch_size", "seq_len")},
                 "ac": c.activation_checkpoint.mode, "converters": list(c.model.converters),
                 "registered": all(n in registry for n in c.model.converters),
                 "float8_recipe": c.quantize.linear.float8.recipe_name, "mx_recipe": c.quantize.linear.mx.recipe_name,
                 "float8_moe": c.quantize.grouped_mm.float8.fqns, "mx_moe": c.quantize.grouped_mm.mx.fqns}
print("RESULT " + json.dumps(out))
"""

TOML_CASES = accepted("torchtitan-toml")


def test_torchtitan_toml_loads_with_torchtitan_0_2_2(tmp_path) -> None:
    refs_file("torchtitan/config/job_config.py")
    jobs = []
    for case in TOML_CASES:
        d = tmp_path / case.id
        render(case, "torchtitan", torchtitan_version="0.2.2").write(d)
        jobs.append((str(d / "torchtitan.toml"), case.plan.num_gpus))
    env = dict(os.environ, PYTHONPATH=str(REFS) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", TOML_DRIVER, json.dumps(jobs)], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    results = json.loads(lines[-1].removeprefix("RESULT "))
    from autopar.export.torchtitan import SCHEDULES

    for case, (path, _) in zip(TOML_CASES, jobs):
        r, p = results[path], case.plan
        assert str(REFS) in r["torchtitan"]
        assert r["n_layers"] == case.spec.num_layers
        assert r["missing"] == []
        assert r["dp"] == p.dp
        par = r["parallelism"]
        assert (
            par["tensor_parallel_degree"],
            par["pipeline_parallel_degree"],
            par["context_parallel_degree"],
            par["expert_parallel_degree"],
        ) == (p.tp, p.pp, p.cp, p.ep)
        if p.ep > 1:
            assert par["expert_tensor_parallel_degree"] == p.etp
        if p.pp > 1:
            assert par["pipeline_parallel_schedule"] == SCHEDULES[p.pp_schedule]
            assert r["training"]["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == p.num_microbatches
        assert r["training"]["global_batch_size"] == p.global_batch_size and r["training"]["seq_len"] == case.seq
        assert r["ac"] == p.recompute
        assert par["enable_async_tensor_parallel"] == p.tp_comm_overlap
        # every converter named is one torchtitan 0.2.2 registered (model.converters is looked up by name)
        assert r["registered"], r["converters"]
        recipe = p.with_(trainer="torchtitan").fp8_recipe_used if p.dtype == "fp8" else None
        kind = {None: None, "mxfp8": "mx"}.get(recipe, "float8")
        linear = [c for c in r["converters"] if c.startswith("quantize.linear.")]
        assert linear == ([f"quantize.linear.{kind}"] if kind else [])
        if kind == "float8":  # the recipe torchao builds its Float8LinearConfig from
            assert r["float8_recipe"] == recipe
        grouped = [c for c in r["converters"] if c.startswith("quantize.grouped_mm.")]
        moe = kind is not None and case.spec.moe is not None
        assert grouped == ([f"quantize.grouped_mm.{kind}"] if moe else [])
        if moe:  # the MoE layers' experts, by name
            assert r[f"{kind}_moe"] == ["experts"]
