"""torchtitan checks that depend on the export options, beyond its capability table
(autopar/spec/data/trainers.toml [torchtitan], applied before rendering): the release format that
--torchtitan-version asks for, the <= 0.2.2 TOML format's own limits, and the base config a model
needs (--torchtitan-base, or the built-in config of an autopar preset)."""

from __future__ import annotations

from autopar.errors import InputError, quoted
from autopar.export.base import Context
from autopar.quoting import check_identifier

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
    if m.moe is None:
        return
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
