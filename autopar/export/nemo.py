"""NeMo 2: overrides of a `nemo.collections.llm` pretraining recipe, as a Python script that applies
them (nemo_pretrain.py) and as `nemo llm pretrain --factory` CLI overrides (nemo_overrides.txt).

Override paths are those of NeMo 2 recipes (NVIDIA/NeMo `nemo/collections/llm/recipes/llama3_70b.py`):
`trainer.strategy.*` are `nemo.lightning.MegatronStrategy` arguments (tensor/pipeline/virtual/
context/expert parallel sizes, sequence_parallel, the uneven-layout fields), `data.*` the batch,
`model.config.*` the TransformerConfig (recompute), `optim.config.use_distributed_optimizer`,
`trainer.strategy.ddp.*` the DDP config and `trainer.plugins.*` MegatronMixedPrecision (fp8).
NeMo 2 runs Megatron-Core: what it cannot run, and which recipe each preset uses, is its capability
table (autopar/spec/data/trainers.toml [nemo], applied by autopar.export.capabilities before
rendering; `--recipe` stands in for a preset without one).
The last NeMo release with NeMo 2 LLM recipes is nemo-toolkit 2.7.x (3.0 moved them to Megatron-Bridge).
"""

from __future__ import annotations

import ast

from autopar.export.base import Context, ExportBundle, Exporter, ExportFile
from autopar.export.header import comment_header, tp_overlap
from autopar.export.launch import Entry, launch_files, parse_world, run_hint
from autopar.export.megatron_core import (
    FSDP_STRATEGY_ZERO,
    ZERO_FSDP_STRATEGY,
    core_moe_fields,
    core_parallel_fields,
    core_recompute_fields,
    dp_shard_from_instances,
    fp8_settings,
    mxfp8_param_settings,
    offload_from,
    offload_settings,
    optimizer_instances,
    view_from_core_fields,
)
from autopar.export.production import megatron_family_env
from autopar.export.recipe_values import changes, recipe_values
from autopar.export.short_run import short_run
from autopar.export.view import normalize
from autopar.quoting import check_identifier
from autopar.spec.trainers import get_trainer

#: autopar preset -> nemo.collections.llm.recipes module (the capability table's [nemo.recipes])
NEMO_RECIPES = dict(get_trainer("nemo").recipes.value)  # type: ignore[union-attr]  # the table has [nemo.recipes]

SCRIPT = "nemo_pretrain.py"
OVERRIDES = "nemo_overrides.txt"


def recipe_name(ctx: Context) -> str:
    """--recipe, else the preset's recipe in the capability table (Context.make has refused a model
    without one unless --recipe was given); a Python name, since it is pasted into an import line
    and a command (anything else is refused in one line)."""
    name = ctx.options.recipe_for(ctx.plan.trainer) or get_trainer(ctx.plan.trainer).recipe_for(ctx.model.name)
    assert name is not None  # Context.make refused the model
    return check_identifier(name, "--recipe", example="llama3_70b")


def nemo_overrides(ctx: Context) -> dict:
    p = ctx.plan
    out: dict = {"trainer.num_nodes": ctx.nodes, "trainer.devices": ctx.gpus_per_node}
    out.update({f"trainer.strategy.{k}": v for k, v in core_parallel_fields(ctx).items()})
    out.update(
        {
            "data.micro_batch_size": p.micro_batch_size,
            "data.global_batch_size": p.global_batch_size,
            "data.seq_length": ctx.seq_len,
            "model.config.seq_length": ctx.seq_len,
            # restated so the layer split above and the recipe's model agree (a no-op for the preset's recipe)
            "model.config.num_layers": ctx.model.num_layers,
        }
    )
    out.update({f"model.config.{k}": v for k, v in core_recompute_fields(ctx).items()})
    out.update({f"model.config.{k}": v for k, v in core_moe_fields(ctx).items()})
    out.update(
        {
            "optim.config.use_distributed_optimizer": p.zero_stage >= 1,
            "trainer.strategy.ddp.overlap_grad_reduce": True,
            "trainer.strategy.ddp.overlap_param_gather": p.zero_stage >= 1,
            "trainer.strategy.ddp.grad_reduce_in_fp32": p.main_grads_fp32,
            "trainer.plugins.grad_reduce_in_fp32": p.main_grads_fp32,
        }
    )
    if (instances := optimizer_instances(p)) > 1:  # hybrid sharding: MegatronStrategy's argument
        out["trainer.strategy.num_distributed_optimizer_instances"] = instances
    # the optimizer shard's share in host memory: Megatron-Core OptimizerConfig fields
    out.update({f"optim.config.{k}": v for k, v in offload_settings(p).items()})
    if p.zero_stage >= 2:
        out.update(
            {
                "trainer.strategy.fsdp": "megatron",
                "trainer.strategy.ddp.data_parallel_sharding_strategy": ZERO_FSDP_STRATEGY[p.zero_stage],
            }
        )
    out["trainer.plugins.fp8"] = "hybrid" if p.dtype == "fp8" else None
    # the scaling recipe: MegatronMixedPrecision's fp8_recipe / amax arguments (nemo/lightning/pytorch/
    # plugins/mixed_precision.py), the TransformerConfig fields Megatron-LM's flags set
    out.update({f"trainer.plugins.{k}": v for k, v in fp8_settings(ctx).items()})
    if p.dtype == "fp8":  # explicit: a recipe's own FP8 plugin may set it either way
        out["trainer.plugins.fp8_param_gather"] = bool(p.fp8_param_gather_used)
        out.update({f"trainer.plugins.{k}": v for k, v in mxfp8_param_settings(ctx).items()})
    return out


def _cli_value(v) -> str:
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (list, tuple)):  # a Python list literal without spaces: ['a','b']
        return "[" + ",".join(repr(x) for x in v) + "]"
    if isinstance(v, str):
        return repr(v) if any(c in v for c in "|*()[], ") else v
    return str(v)


class NemoExporter(Exporter):
    name = "nemo"
    title = "NeMo 2 recipe overrides: nemo_pretrain.py (applies them) + nemo_overrides.txt (nemo llm pretrain)"
    example = "autopar export --run reports/run --rank 3 --to nemo --out launch/"
    description = (
        "nemo_pretrain.py builds the NeMo 2 recipe (nemo.collections.llm.recipes.<model>.pretrain_recipe), "
        "sets trainer.strategy / data / model.config / optim overrides and runs it in-process under the "
        "launch scripts; nemo_overrides.txt holds the same overrides for `nemo llm pretrain --factory`."
    )

    def _render(self, ctx: Context) -> ExportBundle:
        recipe = recipe_name(ctx)
        meant = nemo_overrides(ctx)
        ov = minimal_nemo_overrides(meant, recipe)
        short = short_run(ctx.options.short_run_steps)
        if short:
            ov |= short.nemo_overrides()
        overlap = tp_overlap(ctx.plan)
        items = "".join(f"    {k!r}: {v!r},\n" for k, v in ov.items())
        summary = f"NeMo 2 pretraining with the autopar plan: the {recipe} recipe plus the overrides below."
        script = f'''{comment_header(ctx)}"""{summary}

Under the launch scripts every rank runs this file (torchrun, or one srun task per GPU); it
builds the recipe and runs it in-process (nemo_run direct mode).
"""

import nemo_run as run
from nemo.collections.llm.recipes import {recipe} as recipe_module

RECIPE = {recipe!r}
OVERRIDES = {{
{items}}}
TP_COMM_OVERLAP = {overlap!r}


def configure():
    recipe = recipe_module.pretrain_recipe(name="autopar", num_nodes=OVERRIDES["trainer.num_nodes"],
                                           num_gpus_per_node=OVERRIDES["trainer.devices"])
    for path, value in OVERRIDES.items():
        *parents, leaf = path.split(".")
        target = recipe
        for name in parents:
            target = getattr(target, name)
        setattr(target, leaf, value)
    if TP_COMM_OVERLAP:  # NeMo 2 turns TP overlap on through this callback
        from nemo.lightning.pytorch.callbacks.megatron_comm_overlap import MegatronCommOverlapCallback

        recipe.trainer.callbacks = list(recipe.trainer.callbacks or []) + [
            run.Config(MegatronCommOverlapCallback, tp_comm_overlap=True)]
    return recipe


if __name__ == "__main__":
    run.run(configure(), direct=True)
'''
        lines = [
            comment_header(ctx).rstrip("\n"),
            f"# NeMo 2 CLI form: nemo llm pretrain --factory {recipe} -y $(grep -v '^#' nemo_overrides.txt)",
        ]
        if overlap:
            lines.append(
                "# tp-comm-overlap needs MegatronCommOverlapCallback, which CLI overrides cannot add: "
                "run nemo_pretrain.py (it adds it)"
            )
        lines += [f"{k}={_cli_value(v)}" for k, v in ov.items()]
        env = megatron_family_env(ctx)
        entry = Entry(
            program='"$HERE/nemo_pretrain.py"',
            args="",
            one_task_per_gpu=False,
            env=env.set + (short.NEMO_ENV if short else ()),
            unset=env.unset,
        )
        return ExportBundle(
            format=self.name,
            files=(
                ExportFile(SCRIPT, script),
                ExportFile(OVERRIDES, "\n".join(lines) + "\n"),
                *launch_files(ctx, entry),
            ),
            run=run_hint(ctx),
            notes=(
                "needs nemo-toolkit 2.x (NeMo 2 LLM recipes) and nemo_run; set the recipe's data "
                "(the default is MockDataModule)",
            ),
            meta={"recipe": recipe, "overrides": meant},  # every field the plan sets, the recipe's included
        )

    def parse(self, bundle: ExportBundle) -> dict:
        ov, tp_overlap, recipe = parse_nemo_script(bundle.text(SCRIPT))
        txt = parse_nemo_overrides(bundle.text(OVERRIDES))
        if txt != ov:
            raise ValueError("nemo_overrides.txt and nemo_pretrain.py disagree")
        return view_from_nemo(recipe_values("nemo", recipe) | ov, tp_overlap, parse_world(bundle))


def minimal_nemo_overrides(ov: dict, recipe: str) -> dict:
    """The overrides that change the recipe (autopar.export.recipe_values); the node and GPU counts
    always (nemo_pretrain.py hands them to pretrain_recipe); offload_modules goes with offloading off."""
    out = changes(ov, recipe_values("nemo", recipe), always=("trainer.num_nodes", "trainer.devices"))
    if not ov.get("model.config.fine_grained_activation_offloading"):
        out.pop("model.config.offload_modules", None)
    return out


def parse_nemo_script(text: str) -> tuple[dict, bool, str]:
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return found["OVERRIDES"], found["TP_COMM_OVERLAP"], found["RECIPE"]


def parse_nemo_overrides(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        k, v = line.split("=", 1)
        try:
            out[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k] = v
    return out


def view_from_nemo(ov: dict, tp_overlap: bool, num_gpus: int) -> dict:
    if ov["trainer.num_nodes"] * ov["trainer.devices"] != num_gpus:
        raise ValueError("trainer.num_nodes * trainer.devices is not the launch world size")
    strat = {k.removeprefix("trainer.strategy."): v for k, v in ov.items() if k.startswith("trainer.strategy.")}
    strat.update({k.removeprefix("model.config."): v for k, v in ov.items() if k.startswith("model.config.")})
    if ov.get("trainer.strategy.fsdp") == "megatron":
        zero = FSDP_STRATEGY_ZERO[ov["trainer.strategy.ddp.data_parallel_sharding_strategy"]]
    else:
        zero = 1 if ov["optim.config.use_distributed_optimizer"] else 0
    view = view_from_core_fields(
        strat,
        num_layers=ov["model.config.num_layers"],
        num_gpus=num_gpus,
        mbs=ov["data.micro_batch_size"],
        gbs=ov["data.global_batch_size"],
        zero=zero,
        dtype="fp8" if ov.get("trainer.plugins.fp8") else "bf16",
        main_grads_fp32=ov["trainer.strategy.ddp.grad_reduce_in_fp32"],
        tp_comm_overlap=tp_overlap,
    )
    instances = ov.get("trainer.strategy.num_distributed_optimizer_instances")
    offload = offload_from(
        ov.get("optim.config.optimizer_cpu_offload"), ov.get("optim.config.optimizer_offload_fraction")
    )
    return normalize(
        view
        | {
            "dp_shard": dp_shard_from_instances(instances, view["dp"], view["cp"]),
            "optimizer_offload": offload,
            # MegatronMixedPrecision's default recipe is delayed scaling
            "fp8_recipe": ov.get("trainer.plugins.fp8_recipe", "delayed"),
            "fp8_param_gather": ov.get("trainer.plugins.fp8_param_gather", False),  # the plugin's default
        }
    )
