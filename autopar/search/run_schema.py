"""The schema of a run directory's JSON files, as typed models: top.json, search.json and the trial
documents of trials/*.json hold at least what these models say, of the types they say (autopar
writes more: extra fields pass). The report, compare, export and calibrate read the files only
after `check` has validated them (autopar.search.run_dir.read_json), so a wrong type is one line
that names the file and the field: "corrupt run directory 'DIR': top.json top[0].plan is null
(expected an object); rerun `autopar search` to rewrite the run directory", never an
AttributeError.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from autopar.errors import InputError, quoted
from autopar.spec.plan import FIELDS
from autopar.spec.plan_fields import BOOL, CATEGORY, FLOAT, INT
from autopar.spec.schema import MAX_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN

#: an index or a count of plans, GPUs, tokens
Count = Annotated[int, Field(ge=0)]
#: a parallel size (tp, pp, ...) or a GPU count
Size = Annotated[int, Field(ge=1, le=MAX_GPUS)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]


class Doc(BaseModel):
    """Strict types (no "8" for 8, no true for 1), finite numbers, other fields allowed."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


#: the bounds a plan file keeps, where a field has them; every other field of the plan
#: (autopar.spec.plan) is of its kind's type, None allowed where its default is None
_PLAN_BOUNDS: dict[str, Any] = {
    "tp": Size,
    "pp": Size,
    "dp": Size,
    "cp": Size,
    "ep": Size,
    "etp": Size | None,
    "vpp": Annotated[int, Field(ge=1, le=MAX_LAYERS)],
    "micro_batch_size": Batch,
    "global_batch_size": Batch,
    "recompute_layers": Annotated[int, Field(ge=0, le=MAX_LAYERS)] | None,
    "recompute_modules": list[str] | None,  # names, checked by the plan (autopar.spec.recompute_modules)
    "offload_modules": list[str] | None,  # names, checked by the plan (autopar.spec.offload_modules)
    "layout": list[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] | None,
}
_KIND_TYPES = {INT: int, BOOL: bool, FLOAT: float, CATEGORY: str}


def _plan_type(f) -> Any:
    if f.name in _PLAN_BOUNDS:
        return _PLAN_BOUNDS[f.name]
    return _KIND_TYPES[f.kind] | None if f.default is None else _KIND_TYPES[f.kind]


if TYPE_CHECKING:
    # its fields come from the plan's one declaration (autopar.spec.plan) at import time
    PlanDoc = Doc
else:
    PlanDoc = create_model(
        "PlanDoc",
        __base__=Doc,
        __module__=__name__,
        __doc__="A ParallelPlan as to_dict writes it (autopar.spec.plan: the values are checked there).",
        **{f.name: (_plan_type(f), f.default) for f in FIELDS},
    )


#: a figure of a plan the search priced: a finite number, at least 0 (null where it has none)
PlanFigure = Annotated[float, Field(ge=0)] | None
#: an interval of a figure: its low and high ends
Interval = Annotated[list[Annotated[float, Field(ge=0)]], Field(min_length=2, max_length=2)] | None
#: the level of the intervals: a probability, not a percentage
Level = Annotated[float, Field(gt=0, lt=1)]


class TopEntry(Doc):
    plan: PlanDoc
    plan_name: str
    trainer: str = "megatron"
    trainers: list[str] = []
    plan_index: Count | None = None
    # the figures every reader shows (finite: a NaN or infinite step time is a corrupt file)
    step_time_s: PlanFigure = None
    tokens_per_s: PlanFigure = None
    peak_memory_bytes: PlanFigure = None
    mfu: PlanFigure = None
    step_time_s_interval: Interval = None
    tokens_per_s_interval: Interval = None
    peak_memory_bytes_interval: Interval = None
    interval_level: Level | None = None
    support: Literal["calibrated", "extrapolated"] | None = None
    support_reason: str = ""


class TopFile(Doc):
    why: str = ""
    top: list[TopEntry]


class ModelDoc(Doc):
    """The model's fields are checked by autopar.spec.model_file.model_from_dict where it is rebuilt."""

    name: str


class ClusterDoc(Doc):
    """The cluster's fields are checked by autopar.spec.hardware.cluster_from_dict where it is rebuilt."""

    gpu: str | dict[str, Any]
    gpus_per_node: Size | None = None
    intra_node_gbps: float | None = None
    inter_node_gbps: float | None = None
    constants: dict[str, float] = {}


def _ranked_by(value: str) -> str:
    """A rank_by the search knows (autopar.search.limits RANK_BY)."""
    from autopar.search.limits import RANK_BY

    if value not in RANK_BY:
        raise ValueError(f"one of {', '.join(RANK_BY)}")
    return value


class QuestionDoc(Doc):
    model: ModelDoc
    cluster: ClusterDoc
    num_gpus: Size
    seq_len: Annotated[int, Field(ge=1, le=MAX_SEQ_LEN)]
    global_batch_size: Batch
    trainers: list[str] = []
    recipes: dict[str, str] = {}
    rank_by: Annotated[str, AfterValidator(_ranked_by)] = "expected"
    routing_imbalance: Annotated[float, Field(ge=1)] = 1.0


class SpaceDoc(Doc):
    name: str = ""
    knobs: dict[str, Any] = {}
    constraints: dict[str, Any] = {}


class TrainingDoc(Doc):
    """A TrainingRun (autopar.spec.training_run) as search.json records it."""

    tokens: Annotated[float, Field(gt=0)]
    deadline_s: Annotated[float, Field(gt=0)] | None = None
    price_per_gpu_hour: Annotated[float, Field(gt=0)] | None = None
    prices_by_gpu: dict[str, Annotated[float, Field(gt=0)]] = {}
    budget: Annotated[float, Field(gt=0)] | None = None


class OptionsDoc(Doc):
    top_k: Annotated[int, Field(ge=1)] = 10
    training: TrainingDoc | None = None


class HistoryDoc(Doc):
    """One Optuna trial of the search (autopar.search.optuna_driver.study_history)."""

    number: Count
    step_time_s: float | None = None
    feasible: bool = False
    best_so_far: float | None = None


class SearchFile(Doc):
    schema_version: int
    autopar_version: str = "?"
    question: QuestionDoc
    space: SpaceDoc = SpaceDoc()
    options: OptionsDoc = OptionsDoc()
    method: str = "?"
    plans_evaluated: Count = 0
    plans_valid: Count = 0
    plans_fit: Count = 0
    rejected_by: dict[str, Count] = {}
    why: str = ""
    timings_s: dict[str, float] = {}
    history: list[HistoryDoc] = []
    sureness: list[str] = []  # the answer's lines on how sure it is


#: a measured or predicted figure: a finite number, 0 where nothing was measured
Figure = Annotated[float, Field(ge=0)]
#: a figure the calibration fits: above 0
Measure = Annotated[float, Field(gt=0)]


class FiguresDoc(Doc):
    """A trial's predicted or measured figures (those the report and the calibration read)."""

    step_time_s: Figure | None = None
    peak_memory_bytes: Figure | None = None


class MeasuredDoc(FiguresDoc):
    proxy: FiguresDoc | None = None  # a proxy's own figures, before they are scaled back


class OkMeasuredDoc(MeasuredDoc):
    """What a trial that ran ("status": "ok") measured: the calibration fits both figures."""

    step_time_s: Measure
    peak_memory_bytes: Measure


class ProxyDoc(Doc):
    summary: str = ""
    changes: list[str] = []
    cross_hardware: bool = False


class TrialDoc(Doc):
    """A trial document (autopar.measured.measure; autopar.measured.trials adds its key)."""

    key: str = ""
    plan: PlanDoc
    predicted: FiguresDoc
    measured: MeasuredDoc
    status: str | None = None
    kind: str | None = None
    reasons: list[str] = []
    proxy: ProxyDoc | None = None
    #: the trainer that ran the plan (autopar.measured.own_run; None: autopar's built-in model)
    measured_with: Literal["megatron", "bridge", "nemo", "torchtitan", "deepspeed"] | None = None
    cross_hardware: bool = False  # measured on other hardware than the plan is priced on


class Scenarios(Doc):
    """whatif.json: the scenario directories, relative to this run directory or absolute."""

    model_config = ConfigDict(strict=True, extra="allow")
    scenarios: list[str]


class PlanFile(Doc):
    """A plan file `autopar compare` reads (a trial file, `estimate --json` output, a hand-written
    plan): a plan, and what it says of its question (the rest comes from the other layouts)."""

    plan: PlanDoc
    model: str | ModelDoc | None = None
    num_gpus: Size | None = None
    gpu: str | None = None
    seq_len: Annotated[int, Field(ge=1, le=MAX_SEQ_LEN)] | None = None
    question: QuestionDoc | None = None


#: file name -> its model (trial documents: TrialDoc)
FILES: dict[str, type[Doc]] = {"top.json": TopFile, "search.json": SearchFile}

#: pydantic error types -> what the field should be
_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
    "finite_number": "a finite number",
    "none_required": "null",
    "literal_error": "one of the values autopar writes",
    "too_short": "a list of two numbers",
    "too_long": "a list of two numbers",
}


def _shown(value: object) -> str:
    """What a JSON value is, for the message: 'null', 'a string 'x'', 'a list', 'true', '0'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"a string {quoted(value, 40)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return quoted(value, 40)


def _expected(err: Mapping[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("above", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("below", "lt"),
    }
    if err["type"] in bounds:
        word, key = bounds[err["type"]]
        return f"{word} {ctx.get(key)}"
    if err["type"] == "value_error":  # a validator's own words: what the value must be
        return str(err.get("msg", "another value")).removeprefix("Value error, ")
    return _EXPECTED.get(err["type"], err.get("msg", "another value").removeprefix("Input should be "))


def _where(data: object, loc: tuple) -> tuple[str, int]:
    """'top[0].plan' for loc ('top', 0, 'plan'), and how many of its parts are keys of `data` (the
    rest name the members of a union: ('gpu', 'str'))."""
    text, node, used = "", data, 0
    for part in loc:
        if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
            text, node = f"{text}[{part}]", node[part]
        elif isinstance(part, str) and isinstance(node, dict) and (part in node or used == len(loc) - 1):
            text, node = f"{text}.{part}" if text else part, node.get(part)
        else:
            break
        used += 1
    return text or "the top level", used


def problem(data: object, e: ValidationError, within: tuple = ()) -> str:
    """The first thing wrong with `data`, in words: 'top[0].plan is null (expected an object)'
    (`within`: the path of the part of `data` that was validated)."""
    errors = e.errors(include_url=False)
    first = errors[0]
    where, used = _where(data, within + tuple(first["loc"]))
    used -= len(within)
    if first["type"] == "missing":
        return f"{where} is missing"
    # a union reports one error per member: what it could have been is all of them
    same = [x for x in errors if tuple(x["loc"])[:used] == tuple(first["loc"])[:used]]
    expected = " or ".join(dict.fromkeys(_expected(x) for x in same))
    return f"{where} is {_shown(first['input'])} (expected {expected})"


def check(data: object, model: type[Doc], what: str, fix: str) -> object:
    """`data` when it is valid for `model`, else one line: '{what} {where} is ... (expected ...); {fix}'."""
    try:
        model.model_validate(data)
    except ValidationError as e:
        raise InputError(f"{what} {problem(data, e)}; {fix}") from None
    except RecursionError:  # nesting within json's limit but past the validator's
        raise InputError(f"{what} is nested too deeply; {fix}") from None
    return data


def check_run_file(data: object, path: Path) -> object:
    """top.json or search.json of a run directory against its model."""
    return check(
        data,
        FILES[path.name],
        f"corrupt run directory '{path.parent}': {path.name}",
        "rerun `autopar search` to rewrite the run directory",
    )


def trial_problem(data: object) -> str | None:
    """Why a trial document cannot be used (None: it can)."""
    try:
        doc = TrialDoc.model_validate(data)
    except ValidationError as e:
        return problem(data, e)
    except RecursionError:
        return "nested too deeply"
    measured = data.get("measured") if isinstance(data, dict) else None
    if doc.status == "ok" and measured:
        try:  # a trainer's log may lack a memory figure (autopar.measured.trainer_logs)
            (FiguresDoc if doc.measured_with else OkMeasuredDoc).model_validate(measured)
        except ValidationError as e:
            return problem(data, e, ("measured",)) + " (a trial that ran measures both its step time and memory)"
    return None
