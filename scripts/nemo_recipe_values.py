"""Write autopar/export/data/nemo_recipes.json: what each NeMo 2 pretrain recipe autopar names (the
capability table's [nemo.recipes]) sets, read from its source without running it (NeMo needs torch,
TE and nemo_run to build a config), for the paths autopar's NeMo export writes:

- trainer.strategy.<field>: the run.Config(nl.MegatronStrategy, field=...) call of the trainer
  function the recipe's run.Partial(...) calls (the module's own or one imported from another
  recipes module), each value a literal or a parameter resolved to the argument the recipe passes,
  else the parameter's default; ddp=run.Config(DistributedDataParallelConfig, k=v) gives
  trainer.strategy.ddp.<k>;
- data.<field>: the run.Config(MockDataModule, ...) arguments, resolved the same way;
- optim.config.<field>: the OptimizerConfig(...) literals of the optimizer helper
  (nemo/collections/llm/recipes/optim/adam.py distributed_fused_adam_with_cosine_annealing);
- the recipe's top-level `recipe.<path> = <literal>` statements after it, in order (one under a
  condition, e.g. `if performance_mode:`, makes its path unknown: autopar's export calls the recipe
  with its defaults, and writes what it cannot know).

Beside them, `defaults`: the recompute and offload fields of model.config at megatron-core's
TransformerConfig defaults (no NeMo model config of autopar's presets sets them otherwise) and the
pipeline-split arguments of MegatronStrategy at theirs. Usage:

    make recipes   # or: python scripts/nemo_recipe_values.py .venv/trainer-refs
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

VERSION = "2.7.3"
OUT = Path(__file__).resolve().parents[1] / "autopar/export/data/nemo_recipes.json"
RECIPES = "nemo/collections/llm/recipes"
UNKNOWN = object()


def _literal(node: ast.AST | None):
    try:
        return ast.literal_eval(node) if node is not None else UNKNOWN
    except (ValueError, SyntaxError):
        return UNKNOWN


def _defs(path: Path) -> tuple[dict[str, ast.FunctionDef], dict[str, str]]:
    """A module's functions, and the recipes-module each imported name comes from."""
    tree = ast.parse(path.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {}
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("nemo.collections.llm.recipes"):
            for a in n.names:
                imported[a.asname or a.name] = n.module or ""
    return funcs, imported


def _params(fn: ast.FunctionDef) -> dict:
    """Each parameter's default (UNKNOWN where it has none or it is not a literal)."""
    args = fn.args.args + fn.args.kwonlyargs
    defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + list(fn.args.defaults)
    defaults += list(fn.args.kw_defaults)
    return {a.arg: _literal(d) for a, d in zip(args, defaults)}


def _value(node: ast.AST, scope: dict):
    """A literal, or a name of `scope` (the function's resolved parameters)."""
    if isinstance(node, ast.Name):
        return scope.get(node.id, UNKNOWN)
    return _literal(node)


def _config_kwargs(call: ast.Call, scope: dict) -> dict:
    return {kw.arg: _value(kw.value, scope) for kw in call.keywords if kw.arg}


def _is_config_of(node: ast.AST, name: str) -> bool:
    """run.Config(<...>.name, ...)"""
    return (
        isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("Config")
        and bool(node.args)
        and ast.unparse(node.args[0]).split(".")[-1] == name
    )


def _strategy(fn: ast.FunctionDef, scope: dict) -> dict:
    out = {}
    for node in ast.walk(fn):
        if _is_config_of(node, "MegatronStrategy"):
            for k, v in _config_kwargs(node, scope).items():  # type: ignore[arg-type]
                if k != "ddp":
                    out[f"trainer.strategy.{k}"] = v
            for kw in node.keywords:  # type: ignore[attr-defined]
                if kw.arg == "ddp" and _is_config_of(kw.value, "DistributedDataParallelConfig"):
                    for k, v in _config_kwargs(kw.value, scope).items():  # type: ignore[arg-type]
                        out[f"trainer.strategy.ddp.{k}"] = v
    return out


def _partial_call(fn: ast.FunctionDef) -> ast.Call:
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "run.Partial":
            return node
    raise AssertionError(f"{fn.name} builds no run.Partial")


def _trainer_values(call: ast.Call, scope: dict, root: Path, funcs: dict, imported: dict) -> dict:
    name = ast.unparse(call.func)
    if name in funcs:
        fn = funcs[name]
    else:
        module = imported[name].replace(".", "/")
        fn = _defs(root / f"{module}.py")[0][name]
    inner = _params(fn) | {kw.arg: _value(kw.value, scope) for kw in call.keywords if kw.arg}
    return _strategy(fn, inner)


def _optimizer(root: Path) -> dict:
    funcs, _ = _defs(root / RECIPES / "optim/adam.py")
    fn = funcs["distributed_fused_adam_with_cosine_annealing"]
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Config") and node.args:
            if ast.unparse(node.args[0]).split(".")[-1] == "OptimizerConfig":
                for kw in node.keywords:
                    v = _literal(kw.value)
                    if kw.arg and v is not UNKNOWN:
                        out[f"optim.config.{kw.arg}"] = v
    return out


def _statements(fn: ast.FunctionDef, values: dict) -> dict:
    for node in fn.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = ast.unparse(node.targets[0])
            if target.startswith("recipe."):
                v = _literal(node.value)
                path = target.removeprefix("recipe.")
                if v is UNKNOWN:
                    values.pop(path, None)
                else:
                    values[path] = v
            continue
        for inner in ast.walk(node):  # under a condition: unknown
            for t in inner.targets if isinstance(inner, ast.Assign) else ():
                values.pop(ast.unparse(t).removeprefix("recipe."), None)
    return values


#: the pipeline-split fields, MegatronStrategy arguments in NeMo 2
SPLIT = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
)


def _init_defaults(path: Path, cls: str) -> dict:
    """The literal defaults of a class's __init__ parameters."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return {k: v for k, v in _params(item).items() if v is not UNKNOWN}
    raise AssertionError(f"no {cls}.__init__ in {path}")


def recipe_values(root: str) -> dict:
    """The JSON's content from a tree holding nemo/ (a wheel unpacked, or trainer-refs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bridge_recipe_values import _class_defaults, _core_source, core_version

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from autopar.spec.trainers import get_trainer

    base = Path(root)
    recipes = dict(get_trainer("nemo").recipes.value)  # type: ignore[union-attr]
    core = _class_defaults(_core_source("transformer/transformer_config.py"), "TransformerConfig")
    from bridge_recipe_values import DEFAULTED

    strategy = _init_defaults(base / "nemo/lightning/pytorch/strategies/megatron_strategy.py", "MegatronStrategy")
    # the pipeline split is MegatronStrategy's (the export writes it under trainer.strategy), the
    # recompute and offload fields the model config's
    defaults = {f"trainer.strategy.{k}": strategy[k] for k in SPLIT if k in strategy}
    defaults |= {
        f"model.config.{k}": core[k] for k in DEFAULTED if k in core and k not in SPLIT and k != "tp_comm_overlap"
    }
    optimizer = _optimizer(base)
    out: dict = {
        "defaults": {
            "source": "megatron/core/transformer/transformer_config.py TransformerConfig (megatron-core "
            f"{core_version()}), nemo/lightning/pytorch/strategies/megatron_strategy.py MegatronStrategy "
            f"(nemo-toolkit {VERSION})",
            "values": defaults,
        },
        "recipes": {},
    }
    for name in sorted(set(recipes.values())):
        path = base / RECIPES / f"{name}.py"
        funcs, imported = _defs(path)
        fn = funcs["pretrain_recipe"]
        scope = _params(fn)
        call = _partial_call(fn)
        values = dict(optimizer)
        for kw in call.keywords:
            if kw.arg == "trainer" and isinstance(kw.value, ast.Call):
                values |= _trainer_values(kw.value, scope, base, funcs, imported)
            elif kw.arg == "data" and _is_config_of(kw.value, "MockDataModule"):
                values |= {f"data.{k}": v for k, v in _config_kwargs(kw.value, scope).items()}  # type: ignore[arg-type]
        values = {k: v for k, v in _statements(fn, values).items() if v is not UNKNOWN}
        out["recipes"][name] = {
            "source": f"{RECIPES}/{name}.py pretrain_recipe and the trainer it calls, {RECIPES}/optim/adam.py "
            f"(nemo-toolkit {VERSION})",
            "values": values,
        }
    return out


def main(root: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bridge_recipe_values import write

    write(recipe_values(root), OUT)


if __name__ == "__main__":
    main(sys.argv[1])
