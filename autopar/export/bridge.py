"""Megatron-Bridge: Hydra-style overrides of a recipe's ConfigContainer, one per line
(bridge_overrides.txt), for `scripts/training/run_recipe.py --recipe <name> key=value ...`.

Paths (NVIDIA-NeMo/Megatron-Bridge `docs/megatron-lm-to-megatron-bridge.md` and the recipes):
`model.*` are the GPT model provider's TransformerConfig fields, `train.micro_batch_size` /
`train.global_batch_size` the batch, `ddp.*` Megatron-Core's DistributedDataParallelConfig,
`optimizer.use_distributed_optimizer` (kept equal to ddp's), `dataset.seq_length`, and
`mixed_precision` a registered recipe name (bf16_mixed, or one per FP8 recipe: MIXED).
Megatron-Bridge runs Megatron-Core: what it cannot run, and which recipe each preset uses, is its
capability table (autopar/spec/data/trainers.toml [bridge], applied before rendering).
"""

from __future__ import annotations

import shlex

from autopar.cost.flops import VOCAB_DIVISOR
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
    offload_from,
    offload_settings,
    optimizer_instances,
    view_from_core_fields,
)
from autopar.export.nemo import recipe_name
from autopar.export.presubmit import Required
from autopar.export.production import checkpoint_interval, megatron_family_env
from autopar.export.recipe_values import changes, recipe_values
from autopar.export.short_run import NOTE, short_run
from autopar.export.view import normalize
from autopar.spec.fp8_recipes import BRIDGE_PARAM_GATHER
from autopar.spec.trainers import get_trainer

#: autopar preset -> megatron.bridge.recipes function (the capability table's [bridge.recipes])
BRIDGE_RECIPES = dict(get_trainer("bridge").recipes.value)  # type: ignore[union-attr]  # the table has [bridge.recipes]

FILE = "bridge_overrides.txt"
#: (dtype, FP8 recipe) -> Megatron-Bridge 0.3.1's registered mixed-precision recipe (training/
#: mixed_precision.py; each sets fp8_recipe to the autopar recipe it is keyed by)
MIXED = {
    ("bf16", None): "bf16_mixed",
    ("fp8", "delayed"): "bf16_with_fp8_delayed_scaling_mixed",
    ("fp8", "tensorwise"): "bf16_with_fp8_current_scaling_mixed",
    ("fp8", "blockwise"): "bf16_with_fp8_subchannel_scaling_mixed",
    ("fp8", "mxfp8"): "bf16_with_mxfp8_mixed",
}
MIXED_BACK = {v: k for k, v in MIXED.items()}


def bridge_overrides(ctx: Context) -> dict:
    p = ctx.plan
    out = {f"model.{k}": v for k, v in core_parallel_fields(ctx).items()}
    out.update(
        {
            "model.num_layers": ctx.model.num_layers,
            "model.seq_length": ctx.seq_len,
            "dataset.seq_length": ctx.seq_len,
            "train.micro_batch_size": p.micro_batch_size,
            "train.global_batch_size": p.global_batch_size,
        }
    )
    out.update({f"model.{k}": v for k, v in core_recompute_fields(ctx).items()})
    out.update({f"model.{k}": v for k, v in core_moe_fields(ctx).items()})
    out.update(
        {
            "ddp.use_distributed_optimizer": p.zero_stage >= 1,
            "optimizer.use_distributed_optimizer": p.zero_stage >= 1,
            "ddp.overlap_grad_reduce": True,
            "ddp.overlap_param_gather": p.zero_stage >= 1,
            "ddp.grad_reduce_in_fp32": p.main_grads_fp32,
            "ddp.use_megatron_fsdp": p.zero_stage >= 2,
            "ddp.data_parallel_sharding_strategy": ZERO_FSDP_STRATEGY.get(p.zero_stage, "no_shard"),
            "model.tp_comm_overlap": tp_overlap(p),
            "mixed_precision": MIXED[(p.dtype, p.fp8_recipe_used)],
        }
    )
    if (instances := optimizer_instances(p)) > 1:  # hybrid sharding (megatron/bridge/training/initialize.py)
        out["ddp.num_distributed_optimizer_instances"] = instances
    # the optimizer shard's share in host memory: Megatron-Core OptimizerConfig fields
    out.update({f"optimizer.{k}": v for k, v in offload_settings(p).items()})
    m = ctx.model
    # model facts (GPTModelProvider.rotary_base / make_vocab_size_divisible_by, TransformerConfig
    # layernorm_epsilon), restated so a recipe's own values cannot differ from the spec's
    if not m.learned_position_embeddings and m.rope_theta is not None:
        out["model.rotary_base"] = int(m.rope_theta) if float(m.rope_theta).is_integer() else m.rope_theta
    if m.norm_epsilon is not None:
        out["model.layernorm_epsilon"] = m.norm_epsilon
    out["model.make_vocab_size_divisible_by"] = VOCAB_DIVISOR
    steps = checkpoint_interval(ctx).steps  # the goodput model's Young/Daly interval
    if steps is not None:
        out["checkpoint.save_interval"] = steps
    if p.zero_stage >= 2:
        # Megatron-FSDP: fsdp_dtensor checkpoints only, no gradient-accumulation fusion (Megatron-Bridge
        # 0.3.1 training/config.py ConfigContainer.validate asserts the one and turns off the other)
        out["checkpoint.ckpt_format"] = "fsdp_dtensor"
        out["model.gradient_accumulation_fusion"] = False
    return out


def minimal_overrides(ov: dict, recipe: str) -> dict:
    """The overrides that change the recipe (autopar.export.recipe_values): a field the recipe sets to
    the same value is left to it; offload_modules goes with offloading off (TransformerConfig reads it
    only with fine_grained_activation_offloading on)."""
    out = changes(ov, recipe_values("bridge", recipe))
    if not ov.get("model.fine_grained_activation_offloading"):
        out.pop("model.offload_modules", None)
    return out


def hydra_value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):  # a Hydra list override: key=[a,b]
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, str) and any(c in v for c in "|*()[]{},=:' "):
        return "'" + v + "'"
    return str(v)


def parse_hydra_value(s: str):
    if s == "null":
        return None
    if s in ("true", "false"):
        return s == "true"
    if s.startswith("'") and s.endswith("'"):
        return s[1:-1]
    if s.startswith("[") and s.endswith("]"):
        return [parse_hydra_value(x) for x in s[1:-1].split(",") if x]
    for number in (int, float):
        try:
            return number(s)
        except ValueError:
            pass
    return s


def parse_bridge_overrides(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        k, v = line.split("=", 1)
        out[k] = parse_hydra_value(v)
    return out


class BridgeExporter(Exporter):
    name = "bridge"
    title = "Megatron-Bridge recipe overrides (run_recipe.py --recipe <name> key=value ...)"
    example = "autopar export --run reports/run --rank 3 --to bridge --out launch/"
    description = (
        "bridge_overrides.txt (model.* parallel sizes, layout and recompute, train.* batch, ddp.*, "
        "mixed_precision), and launch scripts running scripts/training/run_recipe.py with them. Set "
        "MEGATRON_BRIDGE to your Megatron-Bridge checkout."
    )

    def _render(self, ctx: Context) -> ExportBundle:
        recipe = recipe_name(ctx)
        meant = bridge_overrides(ctx)
        ov = minimal_overrides(meant, recipe)
        lines = [
            comment_header(ctx).rstrip("\n"),
            "# Megatron-Bridge overrides, one per line (Hydra syntax):",
            f"#   python scripts/training/run_recipe.py --recipe {recipe} $(grep -v '^#' bridge_overrides.txt)",
            f"# recipe: {recipe}",
        ]
        lines += [f"{k}={hydra_value(v)}" for k, v in ov.items()]
        short = short_run(ctx.options.short_run_steps)
        if short:
            lines.append(f"# {NOTE.format(steps=short.steps)}:")
            lines += [f"{k}={hydra_value(v)}" for k, v in short.bridge_overrides().items()]
        env = megatron_family_env(ctx)
        entry = Entry(
            program='"$MEGATRON_BRIDGE/scripts/training/run_recipe.py"',
            args=f'--recipe {shlex.quote(recipe)} "${{OVERRIDES[@]}}"',
            setup=(
                "MEGATRON_BRIDGE=${MEGATRON_BRIDGE:-/opt/Megatron-Bridge}",
                f"mapfile -t OVERRIDES < <(grep -v '^#' \"$HERE/{FILE}\")",
            ),
            env=env.set,
            unset=env.unset,
            requires=(
                Required(
                    "MEGATRON_BRIDGE",
                    "checkout",
                    "your Megatron-Bridge checkout",
                    "scripts/training/run_recipe.py",
                    "/opt/Megatron-Bridge",
                ),
            ),
        )
        return ExportBundle(
            format=self.name,
            files=(ExportFile(FILE, "\n".join(lines) + "\n"), *launch_files(ctx, entry)),
            run=run_hint(ctx),
            notes=("set MEGATRON_BRIDGE and the recipe's dataset/tokenizer before launching",),
            meta={"recipe": recipe, "overrides": meant},  # every field the plan sets, the recipe's included
        )

    def parse(self, bundle: ExportBundle) -> dict:
        text = bundle.text(FILE)
        # the recipe the overrides apply to (the file's "# recipe:" line; without it, the lines alone)
        recipe = next((ln.removeprefix("# recipe: ") for ln in text.splitlines() if ln.startswith("# recipe: ")), "")
        base = recipe_values("bridge", recipe) if recipe else {}
        return view_from_bridge(base | parse_bridge_overrides(text), parse_world(bundle))


def view_from_bridge(ov: dict, num_gpus: int) -> dict:
    model = {k.removeprefix("model."): v for k, v in ov.items() if k.startswith("model.")}
    if ov["ddp.use_distributed_optimizer"] != ov["optimizer.use_distributed_optimizer"]:
        raise ValueError("ddp.use_distributed_optimizer and optimizer.use_distributed_optimizer disagree")
    if ov["ddp.use_megatron_fsdp"]:
        zero = FSDP_STRATEGY_ZERO[ov["ddp.data_parallel_sharding_strategy"]]
    else:
        zero = 1 if ov["ddp.use_distributed_optimizer"] else 0
    dtype, recipe = MIXED_BACK[ov["mixed_precision"]]
    view = view_from_core_fields(
        model,
        num_layers=ov["model.num_layers"],
        num_gpus=num_gpus,
        mbs=ov["train.micro_batch_size"],
        gbs=ov["train.global_batch_size"],
        zero=zero,
        dtype=dtype,
        main_grads_fp32=ov["ddp.grad_reduce_in_fp32"],
        tp_comm_overlap=ov["model.tp_comm_overlap"],
    )
    instances = ov.get("ddp.num_distributed_optimizer_instances")
    offload = offload_from(ov.get("optimizer.optimizer_cpu_offload"), ov.get("optimizer.optimizer_offload_fraction"))
    return normalize(
        view
        | {
            "dp_shard": dp_shard_from_instances(instances, view["dp"], view["cp"]),
            "optimizer_offload": offload,
            "fp8_recipe": recipe,
            # the registered recipe's own setting (autopar.spec.fp8_recipes BRIDGE_PARAM_GATHER)
            "fp8_param_gather": BRIDGE_PARAM_GATHER[recipe] if recipe else None,
        }
    )
