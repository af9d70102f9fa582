"""torchtitan: a Python config function (releases >= 0.3, `--module/--config`) or a TOML job file
(releases <= 0.2.2, `--job.config_file`), chosen by `--torchtitan-version`.

Field names are the released packages' (torchtitan 0.3.0 `torchtitan/config/configs.py` and
`trainer.py`; torchtitan 0.2.2 `torchtitan/config/job_config.py`), checked by
tests/export/test_export_trainers.py against the installed packages. What torchtitan 0.3 cannot run
is its capability table (autopar/spec/data/trainers.toml [torchtitan], applied before rendering);
the checks below keep only what depends on the export options: the <= 0.2.2 TOML format's own
limits and choices, and the base config a model needs (--torchtitan-base). Then come the settings
of a plan (both formats write them) and their reading back, the two file formats, and the
exporter. Mapping:
- dp: ZeRO-0 -> data_parallel_replicate_degree = dp (DDP); ZeRO-2 -> data_parallel_shard_degree = dp
  with fsdp_reshard_after_forward "never"; ZeRO-3 -> the same with "always". torchtitan has no
  ZeRO-1 (FSDP2 shards gradients too), and it always applies FSDP over the CP ranks, so ZeRO-0
  with cp > 1 cannot be expressed either.
- pp: pipeline_parallel_degree, the schedule by name (1F1B, Interleaved1F1B, GPipe, and
  InterleavedZeroBubble with one stage per rank for zero-bubble, PyTorch's ZB1P), and the exact
  layout as module_fqns_per_model_part; a step's microbatches all run in one pipeline step
  (local_batch_size = mbs * microbatches, pipeline_parallel_microbatch_size = mbs).
- no pp: local_batch_size = mbs and global_batch_size makes the gradient accumulation.
- ep / etp: <= 0.2.2 has expert_tensor_parallel_degree in {1, tp}; >= 0.3 dropped it: experts
  are TP-sharded only without EP (etp = tp), and EP borrows the TP ranks (etp = 1).
- recompute: none / selective (per-op SAC) / full (every block); no partial full recompute.
- compile: [compile] enable with components model and loss (torch.compile of each transformer
  block and of the loss); tp-comm-overlap: async TP, which needs it (the plan must say --compile).
- fp8: torchao's converters (torchao needed): the float8 one for the linear layers (its recipe_name),
  the MX one for mxfp8 (SM100 and later), the LM head left in BF16; a MoE model's grouped experts
  through the matching grouped converter (the cost model prices its expert GEMMs in FP8 too).
"""

from __future__ import annotations

import ast
import tomllib

from autopar.errors import InputError, quoted
from autopar.export.base import Context, ExportBundle, Exporter, ExportFile
from autopar.export.header import comment_header, tp_overlap
from autopar.export.launch import Entry, launch_files, parse_world, run_hint
from autopar.export.layouts import stages_from_fqns, torchtitan_fqns
from autopar.export.short_run import short_run
from autopar.export.view import normalize
from autopar.figures import NUM_MICROBATCHES
from autopar.quoting import check_identifier, toml_string

# ---- checks that depend on the export options ----------------------------------------------------
# torchtitan checks that depend on the export options, beyond its capability table
# (autopar/spec/data/trainers.toml [torchtitan], applied before rendering): the release format that
# --torchtitan-version asks for, the <= 0.2.2 TOML format's own limits, and the base config a model
# needs (--torchtitan-base, or the built-in config of an autopar preset).

#: autopar preset -> (torchtitan model name, flavor (<= 0.2.2), config_registry function (>= 0.3))
TORCHTITAN_MODELS = {
    "llama3-8b": ("llama3", "8B", "llama3_8b"),
    "llama3-70b": ("llama3", "70B", "llama3_70b"),
    "llama3.1-405b": ("llama3", "405B", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "671B", "deepseek_v3_671b"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B", None),
}


def toml_era(version: str) -> bool:
    """True for releases <= 0.2.2 (TOML job files), False for >= 0.3 (Python config functions)."""
    v = version.strip().lower().lstrip("v")
    if v in ("toml",):
        return True
    if v in ("current", "latest", "python", "head", "main"):
        return False
    parts = v.split(".")
    try:
        nums = tuple(int(x) for x in parts)
    except ValueError:
        raise InputError(
            f"--torchtitan-version {quoted(version)} must be a release like 0.3.0 or 0.2.2 (or 'toml' / 'current')"
        ) from None
    return nums <= (0, 2, 2) if len(nums) >= 3 else nums <= (0, 2)


#: capability lines of torchtitan 0.3 that the <= 0.2.2 TOML export replaces by its own check (check_toml):
#: 0.2.2 still has expert_tensor_parallel_degree (etp = tp or 1 with EP)
TOML_WAIVED = frozenset({"torchtitan:etp", "torchtitan:ep_in_fsdp"})


def check_toml(ctx: Context) -> None:
    """torchtitan <= 0.2.2 limits beyond the 0.3 capability table (torchtitan 0.2.2
    torchtitan/distributed/parallel_dims.py, config/job_config.py)."""
    p, m = ctx.plan, ctx.model
    if p.tp > 1 and not p.sequence_parallel:
        raise ctx.refuse(
            "torchtitan <= 0.2.2 always uses sequence parallelism with TP; use --sp or --torchtitan-version 0.3"
        )
    if p.dtype == "fp8" and p.fp8_recipe_used == "mxfp8" and p.compile and p.tp > 1:
        raise ctx.refuse(
            "torchtitan <= 0.2.2 refuses MXFP8 with torch.compile and TP ('TP not yet supported with "
            "torch.compile for mxfp8', components/quantization/mx.py); drop --compile, use tp 1 or "
            "--torchtitan-version 0.3"
        )
    if m.moe is None:
        return
    if p.dtype == "fp8" and p.fp8_recipe_used != "mxfp8" and (p.pp > 1 or p.cp > 1):
        raise ctx.refuse(
            "torchtitan <= 0.2.2's float8 MoE converter refuses pipeline and context parallelism "
            "(components/quantization/float8.py Float8GroupedMMConverter); use --torchtitan-version 0.3"
        )
    if p.ep > 1 and p.etp not in (1, p.tp):
        raise ctx.refuse(f"torchtitan <= 0.2.2 supports only etp = tp or etp = 1 (parallel_dims.py), got etp={p.etp}")
    if p.ep == 1 and p.etp != p.tp:
        raise ctx.refuse("without EP torchtitan shards experts over TP (etp = tp); use --etp tp")
    shard = p.dp if p.zero_stage >= 2 else 1
    assert p.etp is not None  # ParallelPlan.__post_init__ resolves None to tp
    etp = p.etp if p.ep > 1 else 1
    if p.ep > 1 and (shard * p.cp * p.tp) % (p.ep * etp):
        raise ctx.refuse(
            f"torchtitan carves EP out of the FSDP x CP x TP ranks (dp_shard*cp*tp = "
            f"{shard}*{p.cp}*{p.tp}), which ep*etp = {p.ep * etp} does not divide"
            + ("; ZeRO-0 has no FSDP ranks: use --zero 2 or 3" if shard == 1 and p.dp > 1 else "")
        )


def check_base(given: str, toml: bool) -> tuple[str, str]:
    """--torchtitan-base as (name, flavor) for TOML or (module, function) for the Python config, or
    one line (checked whether or not the torchtitan format is written)."""
    if ":" not in given:
        raise InputError(
            f"--torchtitan-base {quoted(given)} must be name:flavor (<= 0.2.2, e.g. llama3:70B) or "
            f"module:function (>= 0.3, e.g. torchtitan.models.llama3.config_registry:llama3_70b)"
        )
    a, b = given.split(":", 1)
    if not toml:  # pasted into `from MODULE import FUNCTION`
        check_identifier(
            a, "--torchtitan-base module", dotted=True, example="torchtitan.models.llama3.config_registry:llama3_70b"
        )
        check_identifier(b, "--torchtitan-base function", example="llama3_70b")
    return a, b


def base_config(ctx: Context, toml: bool) -> tuple[str, str]:
    """(name, flavor) for TOML, or (module, function) for the Python config."""
    given = ctx.options.torchtitan_base
    if given:
        return check_base(given, toml)
    known = TORCHTITAN_MODELS.get(ctx.model.name)
    if known is None or (not toml and known[2] is None):
        raise ctx.refuse(
            f"torchtitan has no built-in config for {ctx.model.name}; pass --torchtitan-base "
            f"{'name:flavor' if toml else 'module:function'} naming a torchtitan config with this "
            f"model's shape"
        )
    name, flavor, fn = known
    if toml:
        return name, flavor
    assert fn is not None  # refused above: no Python config function
    return f"torchtitan.models.{name}.config_registry", fn


# ---- the settings of a plan, and back ------------------------------------------------------------
# The torchtitan job layout of a plan, and back: the settings (section -> {field: value}) that
# both config formats write (`torchtitan_values`), and the plan those settings express once read back
# from the files (`view_from_torchtitan`). The mapping is listed in autopar/export/torchtitan.py.

SCHEDULES = {
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "gpipe": "GPipe",
    "zero-bubble": "InterleavedZeroBubble",
}
SCHEDULES_BACK = {v: k for k, v in SCHEDULES.items()}
RESHARD = {2: "never", 3: "always"}
RESHARD_BACK = {v: k for k, v in RESHARD.items()}


def torchtitan_values(ctx: Context, toml: bool) -> dict:
    """The torchtitan settings of the plan, section -> {field: value}."""
    p = ctx.plan
    replicate, shard = (p.dp, 1) if p.zero_stage == 0 else (1, p.dp)
    if p.dp_shard:  # HSDP: FSDP2 over the fsdp mesh (data_parallel_shard_degree x cp), replicated outside it
        if p.dp_shard % p.cp:
            raise InputError(
                f"torchtitan shards over data_parallel_shard_degree x cp ranks: --dp-shard {p.dp_shard} is not a "
                f"multiple of cp {p.cp}; give a multiple of cp"
            )
        replicate, shard = p.dp * p.cp // p.dp_shard, p.dp_shard // p.cp
    par: dict = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": RESHARD.get(p.zero_stage, "default"),
        "tensor_parallel_degree": p.tp,
    }
    if not toml:
        par["enable_sequence_parallel"] = bool(p.sequence_parallel)
    if toml:
        par["enable_async_tensor_parallel"] = tp_overlap(p)
    par["pipeline_parallel_degree"] = p.pp
    if p.pp > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[str(p.pp_schedule)]  # set by the plan (fill_followers)
        par["pipeline_parallel_microbatch_size"] = p.micro_batch_size
        par["module_fqns_per_model_part"] = torchtitan_fqns(ctx.stages, "output" if toml else "lm_head")
    par["context_parallel_degree"] = p.cp
    par["expert_parallel_degree"] = p.ep
    if toml:
        par["expert_tensor_parallel_degree"] = p.etp if p.ep > 1 else 1
    backend = "deepep" if ctx.model.moe is not None and p.moe_dispatcher == "deepep" else "standard"
    if toml and ctx.model.moe is not None:
        par["expert_parallel_comm_backend"] = backend
    local = p.micro_batch_size * p.num_microbatches if p.pp > 1 else p.micro_batch_size
    training = {
        "local_batch_size": local,
        "global_batch_size": p.global_batch_size,
        "seq_len": ctx.seq_len,
        "mixed_precision_param": "float32" if p.dtype == "fp32" else "bfloat16",
        "mixed_precision_reduce": "float32",
    }
    if not toml and (p.pp > 1 or p.ep > 1):
        # torchtitan >= 0.3 captures CUDA graphs by default and refuses them with PP or the all-to-all
        # EP dispatcher (Trainer.Config._validate_cuda_graphs); autopar's estimate assumes none
        training["disable_cuda_graphs"] = True
    # torch.compile of the transformer blocks and the loss (torchtitan's default components); async
    # TP needs it (0.3 CompileConfig.__post_init__ refuses it otherwise; 0.2.2: "only effective
    # when compile is enabled"), which the capability table's tp_comm_overlap "with-compile" says
    compile_ = {"enable": bool(p.compile), "components": ["model", "loss"]}
    if not toml:
        compile_["enable_async_tensor_parallel"] = tp_overlap(p)
    return {
        "parallelism": par,
        "training": training,
        "activation_checkpoint": p.recompute,
        "compile": compile_,
        "float8": p.fp8_recipe_used,  # the FP8 recipe (torchao's recipe_name, or mxfp8); None without FP8
        "moe_comm_backend": backend,
        "moe": ctx.model.moe is not None,  # FP8 converts the grouped experts too
    }


def view_from_torchtitan(cfg: dict, num_gpus: int) -> dict:
    """The plan from torchtitan settings (as parse_torchtitan_* return them) and the world size."""
    par, tr = cfg["parallelism"], cfg["training"]
    tp, pp, cp = (
        par.get("tensor_parallel_degree", 1),
        par.get("pipeline_parallel_degree", 1),
        par.get("context_parallel_degree", 1),
    )
    rep, shard = par.get("data_parallel_replicate_degree", 1), par.get("data_parallel_shard_degree", -1)
    if shard < 0:
        shard = num_gpus // (rep * cp * tp * pp)
    if rep * shard * cp * tp * pp != num_gpus:
        raise ValueError("dp_replicate * dp_shard * cp * tp * pp != world size")
    dp = rep * shard
    hsdp = rep > 1 and shard > 1  # replicate x shard: hybrid sharding over shard x cp ranks
    zero = 0 if rep > 1 and not hsdp else RESHARD_BACK.get(par.get("fsdp_reshard_after_forward", "default"), 3)
    local, gbs = tr["local_batch_size"], tr["global_batch_size"]
    if gbs < 0:
        gbs = local * dp
    accum = gbs // (local * dp)
    if pp > 1:
        mbs = par.get("pipeline_parallel_microbatch_size", 1)
        m = (local // mbs) * accum
        parts = par.get("module_fqns_per_model_part")
        stages = stages_from_fqns(parts) if parts else None
        vpp = len(parts) // pp if parts else 1
        schedule = SCHEDULES_BACK[par.get("pipeline_parallel_schedule", "1F1B")]
    else:
        mbs, m, stages, vpp, schedule = local, accum, None, 1, None
    ep = par.get("expert_parallel_degree", 1)
    etp = cfg["etp"] if cfg["etp"] is not None else (1 if ep > 1 else tp)
    if ep == 1:
        etp = tp
    return normalize(
        {
            "num_gpus": num_gpus,
            "tp": tp,
            "pp": pp,
            "vpp": vpp,
            "cp": cp,
            "dp": dp,
            "ep": ep,
            "etp": etp,
            "sequence_parallel": par.get("enable_sequence_parallel", True) if tp > 1 else False,
            "zero_stage": zero,
            "dp_shard": shard * cp if hsdp else None,
            "micro_batch_size": mbs,
            "global_batch_size": gbs,
            NUM_MICROBATCHES: m,
            "pp_schedule": schedule,
            "layout": stages,
            "recompute": cfg["activation_checkpoint"],
            "dtype": "fp8" if cfg["float8"] else ("fp32" if tr.get("mixed_precision_param") == "float32" else "bf16"),
            "fp8_recipe": cfg["float8"],
            "fp8_param_gather": False if cfg["float8"] else None,  # no FP8 all-gather of rowwise weights
            "main_grads_fp32": tr.get("mixed_precision_reduce", "float32") == "float32",
            "tp_comm_overlap": bool(
                par.get("enable_async_tensor_parallel") or cfg["compile"].get("enable_async_tensor_parallel")
            ),
            "compile": bool(cfg["compile"].get("enable", False)),
            "moe_dispatcher": "deepep" if cfg["moe_comm_backend"] == "deepep" else "alltoall",
            # no partial recompute, MoE dispatch dropless only, no EP all-to-all overlap across
            # microbatches: those fields read back as the plan's defaults (normalize)
        }
    )


# ---- the config files ----------------------------------------------------------------------------
# The torchtitan config files, written and read back: a TOML job file (releases <= 0.2.2,
# `--job.config_file`) and a Python config function (releases >= 0.3, `--module/--config`), both
# holding the settings above (`torchtitan_values`).

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
        out.append(f"converters = {_toml_value(toml_converters(v))}")
    out += ["", "[training]"]
    out += [f"{k} = {_toml_value(x)}" for k, x in v["training"].items()]
    out += ["steps = 1000", 'dataset = "c4"', "", "[parallelism]"]
    out += [f"{k} = {_toml_value(x)}" for k, x in v["parallelism"].items()]
    out += ["", "[activation_checkpoint]", f'mode = "{v["activation_checkpoint"]}"']
    if v["activation_checkpoint"] == "selective":
        out.append('selective_ac_option = "op"')
    out += ["", "[compile]"]
    out += [f"{k} = {_toml_value(x)}" for k, x in v["compile"].items()]
    if v["float8"] == MXFP8:
        out += ["", "[quantize.linear.mx]", f"recipe_name = {_toml_value(TOML_MX_RECIPE)}", 'filter_fqns = ["output"]']
        if v["moe"]:
            out += ["", "[quantize.grouped_mm.mx]", 'recipe_name = "mxfp8"', 'fqns = ["experts"]']
    elif v["float8"]:
        out += ["", "[quantize.linear.float8]", f"recipe_name = {_toml_value(v['float8'])}", 'filter_fqns = ["output"]']
        if v["moe"]:
            out += ["", "[quantize.grouped_mm.float8]", 'fqns = ["experts"]']
    return "\n".join(out) + "\n"


#: the FP8 recipe autopar calls mxfp8 (autopar.spec.fp8_recipes)
MXFP8 = "mxfp8"
#: torchtitan 0.2.2's MX recipe (config/job_config.py MXLinear.recipe_name default): MXFP8 on cuBLAS
TOML_MX_RECIPE = "mxfp8_cublas"
#: torchtitan 0.2.2's registered converter names (components/quantization/float8.py and mx.py
#: `register_model_converter`), which model.converters lists: (linear layers, grouped experts)
TOML_CONVERTERS = {
    "float8": ("quantize.linear.float8", "quantize.grouped_mm.float8"),
    MXFP8: ("quantize.linear.mx", "quantize.grouped_mm.mx"),
}


def toml_converters(v: dict) -> list[str]:
    linear, experts = TOML_CONVERTERS[MXFP8 if v["float8"] == MXFP8 else "float8"]
    return [linear, experts] if v["moe"] else [linear]


def parse_torchtitan_toml(text: str) -> dict:
    d = tomllib.loads(text)
    par, tr, ac = d["parallelism"], d["training"], d["activation_checkpoint"]
    return {
        "parallelism": par,
        "training": tr,
        "activation_checkpoint": ac.get("mode", "selective"),
        "compile": d.get("compile", {}),
        "float8": _toml_recipe(d),
        "etp": par.get("expert_tensor_parallel_degree", 1),
        "output": "output",
        "moe_comm_backend": par.get("expert_parallel_comm_backend", "standard"),
    }


def _toml_recipe(d: dict) -> str | None:
    """The FP8 recipe of a 0.2.2 job file: mxfp8 with the MX converter, else the float8 converter's
    recipe_name (None = torchao's tensorwise), else None."""
    converters = d.get("model", {}).get("converters", [])
    if TOML_CONVERTERS[MXFP8][0] in converters:
        return MXFP8
    if TOML_CONVERTERS["float8"][0] in converters:
        return d.get("quantize", {}).get("linear", {}).get("float8", {}).get("recipe_name") or "tensorwise"
    return None


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
        lines += (
            [f"from torchtitan.components.quantization import {', '.join(_py_converters(v))}"] if v["float8"] else []
        )
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
        f"FLOAT8 = {v['float8']!r}  # the FP8 recipe: torchao Float8LinearConfig recipe_name, or mxfp8 (the MX "
        "converters); None = no FP8",
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
            linear, *experts = _py_converters(v)
            # the LM head stays BF16: float8 filters it out, the MX converter takes the layers' only
            head = (
                'recipe_name=FLOAT8, filter_fqns=["lm_head"]'
                if linear == "Float8LinearConverter"
                else 'fqns=["layers"]'
            )
            lines += [
                f"    cfg.model_spec = model_registry({flavor!r}{backend}, converters=[",
                f"        {linear}.Config({head}, model_compile_enabled=COMPILE['enable']),",
                *(f"        {c}.Config(model_compile_enabled=COMPILE['enable'])," for c in experts),
                "    ])",
            ]
        else:
            lines += [f"    cfg.model_spec = model_registry({flavor!r}{backend})"]
    lines += ["    return dataclasses.replace(cfg)  # re-runs Trainer.Config's checks", ""]
    return "\n".join(lines)


def _py_converters(v: dict) -> list[str]:
    """torchtitan 0.3's converters of the plan's FP8 recipe (components/quantization): the linear
    layers', then a MoE model's grouped experts'."""
    mx = v["float8"] == MXFP8
    linear = "MXFP8LinearConverter" if mx else "Float8LinearConverter"
    experts = "MXFP8GroupedExpertsConverter" if mx else "Float8GroupedExpertsConverter"
    return [linear, experts] if v["moe"] else [linear]


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


# ---- the exporter --------------------------------------------------------------------------------
# TorchtitanExporter: the files of a plan, their launch scripts, and the plan read back.

PY_FILE = "autopar_torchtitan.py"
TOML_FILE = "torchtitan.toml"


class TorchtitanExporter(Exporter):
    name = "torchtitan"
    title = "torchtitan: Python config (>= 0.3, default) or TOML (<= 0.2.2, --torchtitan-version 0.2.2)"
    example = (
        "autopar export --run reports/run --rank 1 --to torchtitan --zero 3 --torchtitan-version 0.2.2 --out launch/"
    )
    description = (
        "autopar_torchtitan.py (a config function: --module autopar_torchtitan --config autopar_plan) or "
        "torchtitan.toml (--job.config_file), with [parallelism] degrees, schedule and exact layer split, "
        "batch and activation checkpointing; plus launch_torchrun.sh and launch_slurm.sbatch."
    )

    def waived(self, options) -> frozenset[str]:
        """The TOML export checks expert TP itself (check_toml)."""
        return TOML_WAIVED if toml_era(options.torchtitan_version) else frozenset()

    def _render(self, ctx: Context) -> ExportBundle:
        toml = toml_era(ctx.options.torchtitan_version)
        if toml:
            check_toml(ctx)
        notes = ["set the tokenizer / HF assets path and dataset of the base config before launching"]
        if ctx.plan.dtype == "fp8":
            notes.append("FP8 uses the float8 converter: install torchao")
        if ctx.plan.recompute == "selective":
            notes.append(
                "torchtitan's selective AC is per-op (it saves matmul outputs); autopar priced Megatron's "
                "selective (core-attention) recompute"
            )
        short = short_run(ctx.options.short_run_steps)
        short_args = " " + short.torchtitan_args(toml) if short else ""  # tyro flags, both config eras
        if toml:
            cfg = ExportFile(TOML_FILE, render_toml(ctx))
            entry = Entry(program="-m torchtitan.train", args='--job.config_file "$HERE/torchtitan.toml"' + short_args)
        else:
            cfg = ExportFile(PY_FILE, render_py(ctx))
            entry = Entry(
                program="-m torchtitan.train",
                args="--module autopar_torchtitan --config autopar_plan" + short_args,
                setup=('export PYTHONPATH="$HERE:${PYTHONPATH:-}"',),
            )
        return ExportBundle(
            format=self.name,
            files=(cfg, *launch_files(ctx, entry)),
            run=run_hint(ctx),
            notes=tuple(notes),
            meta={"toml": toml},
        )

    def parse(self, bundle: ExportBundle) -> dict:
        names = {f.name for f in bundle.files}
        cfg = (
            parse_torchtitan_toml(bundle.text(TOML_FILE))
            if TOML_FILE in names
            else parse_torchtitan_py(bundle.text(PY_FILE))
        )
        return view_from_torchtitan(cfg, parse_world(bundle))
