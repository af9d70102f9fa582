"""Turn command-line style values into specs: the cluster, and a plan with dp and the global batch
derived when not given. Shared by every command that takes a plan (estimate, compare, export, trial).

The plan flags are one typed value, `PlanRequest` (None = not given); `resolve_plan` turns a request
into a ParallelPlan for a model and GPU count, and `rebase_plan` applies a request on top of an
existing plan (a search run's ranked plan), letting what follows a changed degree follow it.
"""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from autopar.errors import InputError, did_you_mean, quoted
from autopar.spec.hardware import LOCAL, ClusterSpec, default_cluster, load_cluster_file
from autopar.spec.layout import balanced_layout, first_last_layout, parse_layout
from autopar.spec.model import ModelSpec
from autopar.spec.plan import GRADS as GRADS  # the --grads values (re-exported)
from autopar.spec.plan import GRID_FIRST, ParallelPlan, PlanError
from autopar.spec.plan_fields import BOOL, CATEGORY, FLOAT, INT, PlanField
from autopar.spec.schema import check_flag, check_number

#: tokens per step when no global batch is given (a common pre-training setting)
DEFAULT_TOKENS_PER_STEP = 4 * 1024 * 1024
#: sanity bound on every size (GPUs, degrees, batch, sequence): keeps numbers inside int64
MAX_SIZE = 1 << 30
MAX_CAPACITY_FACTOR = 64.0

#: the plan's fields that have a flag (autopar.spec.plan), in the flags' order: the layout key first
FLAGGED = tuple(f for f in GRID_FIRST if f.flag)
#: the flags that give the pipeline layout (autopar.spec.layout), not a field each; in --help they
#: follow the precision flags (--dtype, --grads)
LAYOUT_FLAGS = {
    "pp_layout": str,
    "pp_first": int,
    "pp_last": int,
    "pp_embedding_as_layer": bool,
    "pp_loss_as_layer": bool,
}
_LAYOUT_FLAGS_AFTER = "grads"
_TYPES = {INT: int, BOOL: bool, FLOAT: float, CATEGORY: str}


def flag_type(f: PlanField) -> type:
    """The value type of a field's flag."""
    return f.cli.type or _TYPES[f.kind]


def _request_fields() -> list:
    out = []
    for f in FLAGGED:
        out.append((f.cli.name, Optional[flag_type(f)], field(default=None)))
        if f.cli.name == _LAYOUT_FLAGS_AFTER:
            out += [(name, Optional[t], field(default=None)) for name, t in LAYOUT_FLAGS.items()]
    return out


class _Request:
    """The plan flags of `autopar estimate / compare / export / trial`, one field each (the plan's
    flagged fields, autopar.spec.plan, and the layout flags); None = not given (the default
    applies, or, on top of a run's plan, the run's value)."""

    if TYPE_CHECKING:
        # The fields come from the one declaration (autopar.spec.plan_fields) at import time, which
        # a type checker cannot see: it sees a dataclass whose fields are typed Any.
        __dataclass_fields__: ClassVar[dict[str, Any]]

        def __init__(self, **fields: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

    def given(self) -> dict:
        """The flags that were given, field -> value."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def flag_names(self) -> list[str]:
        """The given flags as options, e.g. ['--pp-schedule', '--zero']."""
        return [option(name) for name in self.given()]

    def with_defaults(self, **defaults) -> "PlanRequest":
        """A copy with the given fields filled in where not given (e.g. dtype from the hardware)."""
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    def check(self) -> None:
        """Raise InputError naming the option and the value for the first bad value."""
        for name in ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "mbs", "gbs"):
            _check_int(name, getattr(self, name), 1, MAX_SIZE, f"a positive integer up to {MAX_SIZE:,}")
        _check_int("zero", self.zero, 0, 3, "0, 1, 2 or 3 (0 DDP, 1 distributed optimizer, 2 + gradients, 3 FSDP)")
        for name in ("recompute_layers", "pp_first", "pp_last"):
            _check_int(name, getattr(self, name), 0, MAX_SIZE, "a non-negative integer")
        for f in FLAGGED:
            if f.cli.choices or f.choices:
                _check_choice(f.cli.name, getattr(self, f.cli.name), f.cli.choices or f.choices)
        if self.pp_layout is not None and not self.pp_layout.strip():
            raise InputError("--pp-layout is empty; give layers per virtual stage, e.g. --pp-layout 4,5,5,4")
        both = [n for n in ("pp_first", "pp_last") if self.pp_layout is not None and getattr(self, n) is not None]
        if both:
            flag = option(both[0])
            raise InputError(
                f"--pp-layout {quoted(self.pp_layout)} and {flag} {getattr(self, both[0])} both set "
                f"the stages' layers; give --pp-layout alone, or {flag} without it"
            )
        cf = self.capacity_factor
        if cf is not None:
            if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 1.0 <= cf <= MAX_CAPACITY_FACTOR:
                raise InputError(
                    f"--capacity-factor {cf!r} must be a number from 1 to {MAX_CAPACITY_FACTOR:g} "
                    f"(expert capacity / mean expert load); e.g. --capacity-factor 1.25"
                )
            if self.moe_dispatch == "dropless":
                raise InputError(
                    f"--capacity-factor {cf:g} needs --moe-dispatch capacity (dropless dispatch drops "
                    f"no token); drop one of them"
                )


if TYPE_CHECKING:
    PlanRequest = _Request
else:
    PlanRequest = make_dataclass("PlanRequest", _request_fields(), bases=(_Request,), frozen=True, kw_only=True)
    PlanRequest.__module__, PlanRequest.__doc__ = __name__, _Request.__doc__


def option(name: str) -> str:
    """The command-line option of a PlanRequest field."""
    return "--" + name.replace("_", "-")


def _check_int(name: str, v, lo: int, hi: int, what: str) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InputError(f"{option(name)} {quoted(v)} is out of range; {option(name)} must be {what}")


def _check_choice(name: str, v, choices) -> None:
    if v is not None and v not in choices:
        raise InputError(
            f"{option(name)} {quoted(str(v))} is not one of {', '.join(choices)}{did_you_mean(str(v), choices)}; "
            f"choose one of them"
        )


#: the keyword names of the old resolve_plan(..., tp=, embedding_as_layer=, ...) form
_LEGACY_NAMES = {"embedding_as_layer": "pp_embedding_as_layer", "loss_as_layer": "pp_loss_as_layer"}


def request_from_keywords(**flags) -> PlanRequest:
    """A PlanRequest from the old keyword form of resolve_plan (tp=8, embedding_as_layer=True, ...);
    False for the layout switches and None mean not given."""
    out = {}
    for k, v in flags.items():
        name = _LEGACY_NAMES.get(k, k)
        if name in ("pp_embedding_as_layer", "pp_loss_as_layer") and v is False:
            v = None
        out[name] = v
    try:
        return PlanRequest(**out)
    except TypeError as e:
        raise TypeError(f"resolve_plan: {e}") from None


def resolve_cluster(
    gpu: str = "h100-sxm",
    gpus_per_node: int | None = None,
    cluster_file: str | None = None,
    power_limit_w: float | None = None,
) -> ClusterSpec:
    """The cluster of --gpu (or --cluster FILE), with --gpus-per-node and --power-limit on top."""
    check_flag("--gpus-per-node", gpus_per_node)
    if cluster_file:
        cluster = load_cluster_file(cluster_file)
        if gpus_per_node:
            cluster = replace(cluster, gpus_per_node=gpus_per_node)
    else:
        cluster = default_cluster(gpu, gpus_per_node)
    if power_limit_w is not None:
        check_number(power_limit_w, "--power-limit", 0.0, 1e5, above=True, fix="give watts per GPU, e.g. 500")
        cluster = replace(cluster, power_limit_w=float(power_limit_w))
    return cluster


def default_dtype(cluster: ClusterSpec) -> str:
    """What the hardware trains in when the user does not say: bf16 on GPUs, fp32 on this machine's
    CPU profile (`--gpu local`), as its trials run."""
    return "fp32" if cluster.gpu.key == LOCAL else "bf16"


def default_global_batch(seq_len: int, micro_batch_size: int, dp: int) -> int:
    """The smallest multiple of mbs*dp reaching DEFAULT_TOKENS_PER_STEP tokens."""
    unit = micro_batch_size * dp
    sequences = -(-DEFAULT_TOKENS_PER_STEP // seq_len)
    return -(-sequences // unit) * unit


def resolve_plan(
    model: ModelSpec, num_gpus: int, seq_len: int, request: PlanRequest | None = None, **flags
) -> ParallelPlan:
    """A ParallelPlan from the plan flags. dp defaults to gpus / (tp*pp*cp); the global batch to
    DEFAULT_TOKENS_PER_STEP tokens; the trainer to Megatron-LM. `flags` is the old keyword form
    (tp=8, ...), kept for callers that have not moved to PlanRequest yet (cli/trial.py)."""
    r = request or PlanRequest()
    if flags:
        r = replace(r, **request_from_keywords(**flags).given())
    r.check()
    check_flag("--gpus", num_gpus)
    check_flag("--seq-len", seq_len)
    tp, pp, cp, vpp, mbs = r.tp or 1, r.pp or 1, r.cp or 1, r.vpp or 1, r.mbs or 1
    dp = r.dp
    if dp is None:
        if num_gpus % (tp * pp * cp):
            raise InputError(
                f"{num_gpus} GPUs do not divide by tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp}; "
                f"change the degrees or --gpus"
            )
        dp = num_gpus // (tp * pp * cp)
    dispatch = r.moe_dispatch or ("capacity" if r.capacity_factor is not None else "dropless")
    values = {f.name: _value(r, f) for f in FLAGGED} | {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "vpp": vpp,
        "micro_batch_size": mbs,
        "global_batch_size": r.gbs or default_global_batch(seq_len, mbs, dp),
        "main_grads_fp32": (r.grads or "fp32") == "fp32",
        "moe_dispatch": dispatch,
    }
    _check_moe_flags(model, values)
    try:
        return ParallelPlan(**values, layout=_layout(model, r, pp, vpp))
    except PlanError as e:
        raise InputError(f"{e}; change the plan flags") from None


def _value(r: PlanRequest, f: PlanField):
    """A field's value as its flag gives it (a switch as a bool), or the field's default."""
    v = getattr(r, f.cli.name)
    return f.default if v is None else bool(v) if f.kind == BOOL else v


def _check_moe_flags(model: ModelSpec, values: dict) -> None:
    """The MoE-only flags need a mixture-of-experts model (a choice or a switch off its default)."""
    if model.moe is not None:
        return
    given = [
        option(f.cli.name) + (f" {values[f.name]}" if f.kind == CATEGORY else "")
        for f in FLAGGED
        if f.moe and f.kind in (CATEGORY, BOOL) and values[f.name] != f.default
    ]
    if given:
        raise InputError(
            f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} a mixture-of-experts model; "
            f"{model.name} is dense (drop {'it' if len(given) == 1 else 'them'})"
        )


def _layout(model: ModelSpec, r: PlanRequest, pp: int, vpp: int):
    if r.pp_layout:
        return parse_layout(r.pp_layout)
    if r.pp_first is not None or r.pp_last is not None:
        return first_last_layout(model.num_layers, pp, vpp, r.pp_first, r.pp_last)
    if r.pp_embedding_as_layer or r.pp_loss_as_layer:
        return balanced_layout(
            model.num_layers,
            pp * vpp,
            embedding_as_layer=bool(r.pp_embedding_as_layer),
            loss_as_layer=bool(r.pp_loss_as_layer),
        )
    return None


_LAYOUT_FLAGS = ("pp_layout", "pp_first", "pp_last", "pp_embedding_as_layer", "pp_loss_as_layer")


def rebase_plan(
    base: ParallelPlan, request: PlanRequest, model: ModelSpec, num_gpus: int, seq_len: int
) -> ParallelPlan:
    """`base` (e.g. a search run's ranked plan) with the given flags on top, re-resolved. What
    follows a changed degree follows it unless given: dp (tp, pp, cp), etp (tp), sequence
    parallelism (tp), the schedule (vpp), recompute layers and modules (recompute), the layout (pp, vpp), the
    capacity factor (dispatch). Without flags, `base` itself."""
    g = request.given()
    if not g:
        return base

    def pick(name, default):
        return g.get(name, default)

    tp, pp, cp, vpp = pick("tp", base.tp), pick("pp", base.pp), pick("cp", base.cp), pick("vpp", base.vpp)
    same_split = (tp, pp, cp) == (base.tp, base.pp, base.cp)
    recompute = pick("recompute", base.recompute)
    dispatch = pick("moe_dispatch", "capacity" if "capacity_factor" in g else base.moe_dispatch)
    layout = {k: g.get(k) for k in _LAYOUT_FLAGS}
    if not any(layout.values()) and base.layout is not None and (pp, vpp) == (base.pp, base.vpp):
        layout["pp_layout"] = ",".join(str(x) for x in base.layout.stages)
    kept = {f.cli.name: pick(f.cli.name, getattr(base, f.name)) for f in FLAGGED}  # the rest: as it was
    full = replace(
        request,
        **kept
        | {
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "vpp": vpp,
            "dp": pick("dp", base.dp if same_split else None),
            "etp": pick("etp", None if base.etp == base.tp else base.etp),
            "sp": pick("sp", base.sequence_parallel if tp == base.tp else None),
            "pp_schedule": pick("pp_schedule", base.pp_schedule if vpp == base.vpp else None),
            "recompute": recompute,
            "recompute_layers": pick(
                "recompute_layers", base.recompute_layers if recompute == base.recompute else None
            ),
            "recompute_modules": pick(
                "recompute_modules", base.recompute_modules if recompute == base.recompute else None
            ),
            "grads": pick("grads", "fp32" if base.main_grads_fp32 else "bf16"),
            "moe_dispatch": dispatch,
            "capacity_factor": pick("capacity_factor", base.capacity_factor if dispatch == base.moe_dispatch else None),
        }
        | layout,
    )
    return resolve_plan(model, num_gpus, seq_len, full)
