"""Write autopar/export/data/bridge_recipes.json: what each Megatron-Bridge pretrain recipe autopar
names (the capability table's [bridge.recipes]) sets explicitly, read from the recipe's source
without running it (Bridge needs torch, TE and the HF hub to build a config):

- `_pretrain_common()`'s ConfigContainer(...) keyword arguments: train=TrainingConfig(k=v),
  ddp=DistributedDataParallelConfig(k=v), dataset=..., checkpoint=..., mixed_precision="name";
- the recipe function's `cfg.<section>.<field> = <literal>` statements at its top level, in order
  (one under a condition or set to a non-literal makes the field unknown);
- `cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=X, ...)`: model.tp_comm_overlap = X (Bridge
  hands comm_overlap.tp_comm_overlap to the model config).

- the optimizer helper `_pretrain_common` calls (distributed_fused_adam_with_cosine_annealing):
  its OptimizerConfig(k=literal) arguments.

Beside them, `defaults`: the class defaults of the layout, recompute and offload fields (DEFAULTED)
in megatron-core's TransformerConfig (megatron/core/transformer/transformer_config.py, the installed
megatron-core) with Bridge's GPTModelProvider on top: no HF provider sets those. Any other field a
recipe does not set explicitly (the HF provider's architecture, MoE settings) is left out: the
exporter then always writes it. Usage:

    make recipes   # or: python scripts/bridge_recipe_values.py .venv/trainer-refs
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

VERSION = "0.3.1"
OUT = Path(__file__).resolve().parents[1] / "autopar/export/data/bridge_recipes.json"
SECTIONS = ("model", "train", "ddp", "dataset", "checkpoint", "optimizer")
#: model fields whose class default holds for every recipe's model (no HF provider sets them)
DEFAULTED = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "fine_grained_activation_offloading",
    "tp_comm_overlap",
)


def _class_defaults(path: Path, cls: str) -> dict:
    """`field: type = literal` defaults of one dataclass in a source file."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    ok, v = _literal(item.value)
                    if ok:
                        out[item.target.id] = v
    return out


def _core_source(rel: str) -> Path:
    """A file of the installed megatron-core, found without importing it (its import warns)."""
    import importlib.util

    spec = importlib.util.find_spec("megatron.core")
    assert spec is not None and spec.submodule_search_locations, "megatron-core is not installed"
    return Path(list(spec.submodule_search_locations)[0]) / rel


def _defaults(bridge: Path) -> dict:
    core = _class_defaults(_core_source("transformer/transformer_config.py"), "TransformerConfig")
    gpt = _class_defaults(bridge / "megatron/bridge/models/gpt_provider.py", "GPTModelProvider")
    merged = core | gpt
    return {f"model.{k}": merged[k] for k in DEFAULTED if k in merged}


def _optimizer_values(funcs: dict) -> dict:
    _, fn = funcs["distributed_fused_adam_with_cosine_annealing"]
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "OptimizerConfig":
            for kw in node.keywords:
                ok, v = _literal(kw.value)
                if ok and kw.arg:
                    out[f"optimizer.{kw.arg}"] = v
    return out


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return False, None


def _functions(root: Path) -> dict[str, tuple[Path, ast.FunctionDef]]:
    out = {}
    for path in sorted((root / "megatron/bridge/recipes").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, (path, node))
    return out


def _common_values(fn: ast.FunctionDef) -> dict:
    values: dict = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ConfigContainer":
            for kw in node.keywords:
                if kw.arg in SECTIONS and isinstance(kw.value, ast.Call):
                    for inner in kw.value.keywords:
                        ok, v = _literal(inner.value)
                        if ok and inner.arg:
                            values[f"{kw.arg}.{inner.arg}"] = v
                elif kw.arg == "mixed_precision":
                    ok, v = _literal(kw.value)
                    if ok:
                        values["mixed_precision"] = v
    return values


def _mixed_precision_name(node: ast.AST) -> str | None:
    """The registered mixed-precision recipe a value names: "bf16_mixed", bf16_mixed() or
    get_mixed_precision_config("bf16_mixed") (training/mixed_precision.py). A field the recipe then
    tweaks (cfg.mixed_precision.grad_reduce_in_fp32 = False) stays the recipe's: an override naming
    the same recipe would reset it, so the exporter leaves it alone."""
    ok, v = _literal(node)
    if ok:
        return v if isinstance(v, str) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "get_mixed_precision_config" and len(node.args) == 1:
            ok, v = _literal(node.args[0])
            return v if ok and isinstance(v, str) else None
        if not node.args and not node.keywords:
            return node.func.id
    return None


def _assigned(fn: ast.FunctionDef, values: dict) -> dict:
    for node in fn.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            for inner in ast.walk(node):  # set under a condition or in a loop: not known statically
                for t in inner.targets if isinstance(inner, ast.Assign) else ():
                    parts = ast.unparse(t).split(".")
                    if parts[0] == "cfg" and len(parts) == 3:
                        values.pop(f"{parts[1]}.{parts[2]}", None)
            continue
        target = ast.unparse(node.targets[0])
        parts = target.split(".")
        if parts[0] != "cfg":
            continue
        if len(parts) == 3 and parts[1] in SECTIONS:
            ok, v = _literal(node.value)
            if ok:
                values[f"{parts[1]}.{parts[2]}"] = v
            else:
                values.pop(f"{parts[1]}.{parts[2]}", None)  # set to something not a literal: unknown
        elif len(parts) == 2 and parts[1] in SECTIONS:  # a new section object: its earlier fields are gone
            for k in [k for k in values if k.startswith(parts[1] + ".")]:
                del values[k]
            built = isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)  # Class(k=v)
            for kw in node.value.keywords if built else ():  # type: ignore[union-attr]
                ok, v = _literal(kw.value)
                if ok and kw.arg:
                    values[f"{parts[1]}.{kw.arg}"] = v
        elif target == "cfg.mixed_precision":
            name = _mixed_precision_name(node.value)
            if name is not None:
                values["mixed_precision"] = name
            else:
                values.pop("mixed_precision", None)
        elif target == "cfg.comm_overlap" and isinstance(node.value, ast.Call):
            for kw in node.value.keywords:
                ok, v = _literal(kw.value)
                if kw.arg == "tp_comm_overlap" and ok:
                    values["model.tp_comm_overlap"] = v
    return values


def recipe_values(root: str) -> dict:
    """The JSON's content from a tree holding megatron/bridge (a wheel unpacked, or trainer-refs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from autopar.spec.trainers import get_trainer

    recipes = dict(get_trainer("bridge").recipes.value)  # type: ignore[union-attr]
    funcs = _functions(Path(root))
    common_path, common = funcs["_pretrain_common"]
    base = _common_values(common) | _optimizer_values(funcs)

    out: dict = {
        "defaults": {
            "source": f"megatron/core/transformer/transformer_config.py TransformerConfig (megatron-core "
            f"{core_version()}), megatron/bridge/models/gpt_provider.py GPTModelProvider (megatron-bridge {VERSION})",
            "values": _defaults(Path(root)),
        },
        "recipes": {},
    }
    for name in sorted(set(recipes.values())):
        path, fn = funcs[name]
        rel = path.relative_to(root).as_posix()
        out["recipes"][name] = {
            "source": f"{rel} {name}, {common_path.relative_to(root).as_posix()} _pretrain_common and "
            "recipes/utils/optimizer_utils.py distributed_fused_adam_with_cosine_annealing "
            f"(megatron-bridge {VERSION})",
            "values": _assigned(fn, dict(base)),
        }
    return out


def core_version() -> str:
    """The installed megatron-core's version (its defaults are what the files record)."""
    from importlib.metadata import version

    return version("megatron-core")


def write(out: dict, path: Path) -> None:
    """One recipes file, as both scripts write it."""
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({len(out['recipes'])} recipes)")


def main(root: str) -> None:
    write(recipe_values(root), OUT)


if __name__ == "__main__":
    main(sys.argv[1])
