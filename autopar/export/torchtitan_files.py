"""The torchtitan config files, written and read back: a TOML job file (releases <= 0.2.2,
`--job.config_file`) and a Python config function (releases >= 0.3, `--module/--config`), both
holding the settings of autopar/export/torchtitan_values.py."""

from __future__ import annotations

import ast
import tomllib

from autopar.export.base import Context
from autopar.export.header import comment_header
from autopar.export.torchtitan_checks import TORCHTITAN_MODELS, base_config
from autopar.export.torchtitan_values import torchtitan_values
from autopar.quoting import toml_string

# ---- TOML (<= 0.2.2) ----------------------------------------------------------------------------


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        if v and isinstance(v[0], list):
            return "[\n" + "".join(f"  {_toml_value(x)},\n" for x in v) + "]"
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def render_toml(ctx: Context) -> str:
    name, flavor = base_config(ctx, toml=True)
    v = torchtitan_values(ctx, toml=True)
    out = [
        comment_header(ctx).rstrip("\n"),
        "# torchtitan <= 0.2.2 job config: torchrun ... -m torchtitan.train --job.config_file torchtitan.toml",
        "",
        "[job]",
        f"description = {_toml_value('autopar ' + ctx.plan.describe())}",
        "",
        "[model]",
        f"name = {_toml_value(name)}",
        f"flavor = {_toml_value(flavor)}",
        '# hf_assets_path = "./assets/hf/<model>"  # set to your tokenizer/assets',
    ]
    if v["float8"]:
        out.append('converters = ["float8"]')
    out += ["", "[training]"]
    out += [f"{k} = {_toml_value(x)}" for k, x in v["training"].items()]
    out += ["steps = 1000", 'dataset = "c4"', "", "[parallelism]"]
    out += [f"{k} = {_toml_value(x)}" for k, x in v["parallelism"].items()]
    out += ["", "[activation_checkpoint]", f'mode = "{v["activation_checkpoint"]}"']
    if v["activation_checkpoint"] == "selective":
        out.append('selective_ac_option = "op"')
    out += ["", "[compile]"]
    out += [f"{k} = {_toml_value(x)}" for k, x in v["compile"].items()]
    if v["float8"]:
        out += ["", "[quantize.linear.float8]", 'filter_fqns = ["output"]']
    return "\n".join(out) + "\n"


def parse_torchtitan_toml(text: str) -> dict:
    d = tomllib.loads(text)
    par, tr, ac = d["parallelism"], d["training"], d["activation_checkpoint"]
    return {
        "parallelism": par,
        "training": tr,
        "activation_checkpoint": ac.get("mode", "selective"),
        "compile": d.get("compile", {}),
        "float8": "float8" in d.get("model", {}).get("converters", []),
        "etp": par.get("expert_tensor_parallel_degree", 1),
        "output": "output",
        "moe_comm_backend": par.get("expert_parallel_comm_backend", "standard"),
    }


# ---- Python config (>= 0.3) ---------------------------------------------------------------------


def render_py(ctx: Context) -> str:
    module, fn = base_config(ctx, toml=False)
    v = torchtitan_values(ctx, toml=False)
    model_pkg = module.rsplit(".", 1)[0]
    flavor = TORCHTITAN_MODELS.get(ctx.model.name, (None, None, None))[1]
    lines = [
        comment_header(ctx).rstrip("\n"),
        '"""torchtitan (>= 0.3) config for the autopar plan.',
        "",
        "Run from this directory (every node):",
        "  PYTHONPATH=. torchrun ... -m torchtitan.train --module autopar_torchtitan --config autopar_plan",
        "(launch_torchrun.sh and launch_slurm.sbatch do this.)",
        '"""',
        "",
        "import dataclasses",
        "",
        "from torchtitan.config import CompileConfig, ParallelismConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "from torchtitan.trainer import Trainer",
        "",
        f"from {module} import {fn} as base_config",
        "",
    ]
    rebuild = v["float8"] or v["moe_comm_backend"] != "standard"
    if rebuild:
        if flavor is None:
            raise ctx.refuse(
                "FP8 and the DeepEP dispatcher need the model's torchtitan flavor to rebuild its model "
                "spec; autopar knows it only for its presets"
            )
        lines += ["from torchtitan.components.quantization import Float8LinearConverter"] if v["float8"] else []
        lines += [f"from {model_pkg} import model_registry", ""]
    lines += [
        f"PARALLELISM = {_py_literal(v['parallelism'])}",
        "",
        f"TRAINING = {_py_literal(v['training'])}",
        "",
        f"ACTIVATION_CHECKPOINT = {v['activation_checkpoint']!r}  # none | selective | full",
        "",
        f"COMPILE = {_py_literal(v['compile'])}",
        "",
        f"FLOAT8 = {v['float8']!r}",
        "",
        f"MOE_COMM_BACKEND = {v['moe_comm_backend']!r}  # standard (all-to-all) | deepep",
        "",
        "",
        "def autopar_plan() -> Trainer.Config:",
        f'    """{fn} with the parallel layout, batch and recompute of the autopar plan."""',
        "    cfg = base_config()",
        "    cfg.parallelism = ParallelismConfig(**PARALLELISM)",
        "    cfg.training = dataclasses.replace(cfg.training, **TRAINING)",
        '    cfg.activation_checkpoint = {"none": None, "selective": SelectiveAC.Config(),',
        '                                 "full": FullAC.Config()}[ACTIVATION_CHECKPOINT]',
        "    cfg.compile = CompileConfig(**COMPILE)",
    ]
    if rebuild:
        backend = ", moe_comm_backend=MOE_COMM_BACKEND" if v["moe_comm_backend"] != "standard" else ""
        if v["float8"]:
            lines += [
                f"    cfg.model_spec = model_registry({flavor!r}{backend}, converters=[",
                '        Float8LinearConverter.Config(filter_fqns=["lm_head"],',
                "                                     model_compile_enabled=COMPILE['enable'])])",
            ]
        else:
            lines += [f"    cfg.model_spec = model_registry({flavor!r}{backend})"]
    lines += ["    return dataclasses.replace(cfg)  # re-runs Trainer.Config's checks", ""]
    return "\n".join(lines)


def _py_literal(d: dict) -> str:
    items = []
    for k, x in d.items():
        if isinstance(x, list) and x and isinstance(x[0], list):
            inner = "".join(f"        {x_!r},\n" for x_ in x)
            items.append(f"    {k!r}: [\n{inner}    ],")
        else:
            items.append(f"    {k!r}: {x!r},")
    return "{\n" + "\n".join(items) + "\n}"


def parse_torchtitan_py(text: str) -> dict:
    tree = ast.parse(text)
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id.isupper():
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return {
        "parallelism": found["PARALLELISM"],
        "training": found["TRAINING"],
        "activation_checkpoint": found["ACTIVATION_CHECKPOINT"],
        "compile": found["COMPILE"],
        "float8": found["FLOAT8"],
        "etp": None,
        "output": "lm_head",
        "moe_comm_backend": found.get("MOE_COMM_BACKEND", "standard"),
    }
