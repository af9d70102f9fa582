"""A published run as a case autopar can predict: model, cluster, plan, and the measured throughput
in the units the row has (tokens/s/GPU, step time, TFLOP/s/GPU or MFU under its source's FLOP
convention). Every field a row leaves empty gets a recorded assumption; a row that cannot be
turned into a plan is skipped with the reason."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from autopar.calibration.flop_conventions import CONVENTIONS, flops_per_token
from autopar.calibration.run_checks import row_problem
from autopar.calibration.run_plan import run_plan
from autopar.calibration.run_rows import FAMILY_PROFILE, PublishedRow, num, row_cluster, row_model, text
from autopar.calibration.sources import declared, nvidia_recipes, row_kernels
from autopar.cost.price import prepare, price
from autopar.cost.profiles import priced_cluster
from autopar.errors import InputError
from autopar.figures import FITS
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan, PlanError
from autopar.spec.routing import FORCED_BALANCED, REAL_ROUTER_IMBALANCE
from autopar.spec.rules import plan_problems
from autopar.spec.table import PlanTable

if TYPE_CHECKING:  # (autopar.cost.step imports the pricing modules; the cases only hold its result)
    from autopar.cost.step import StepInputs

LONG_CONTEXT = 32768  # sequence length from which a run counts as long-context


@dataclass
class RunCase:
    row_id: str
    source: str  # short key of the publication (the leave-one-source-out fold)
    family: str  # megatron | fsdp | nanotron | meta | deepspeed
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan  # its trainer is the family's (autopar.calibration.run_rows.FAMILY_TRAINER)
    seq_len: int
    metric: str  # "tokens/s/GPU" | "step time s" | "TFLOP/s/GPU" | "MFU"
    published: float
    flops_per_token: float  # under the row's convention (TFLOP/s and MFU rows)
    routing_imbalance: float = 1.0  # busiest expert rank / mean (forced-balanced routing: 1)
    #: a second measurement of a row's layout with the real router (reported on its own)
    dropless: bool = False
    #: the throughput is a whole run's average (interruptions, checkpoints): priced x the goodput
    whole_run: bool = False
    assumptions: list[str] = field(default_factory=list)
    profile: str = ""  # the performance profile that prices it (autopar.calibration.run_rows.FAMILY_PROFILE)
    #: kernel facts the source documents that differ from today's trainer (its attention kernels)
    kernel_overrides: dict = field(default_factory=dict)
    inputs: StepInputs | None = field(default=None, repr=False, compare=False)  # cached (case_batch)

    @property
    def workload(self) -> str:
        return "moe" if self.model.moe else "dense"

    @property
    def long_context(self) -> bool:
        return self.seq_len >= LONG_CONTEXT

    def categories(self) -> list[str]:
        """The acceptance categories the row counts in. A dropless figure a row prints in its notes is
        a second measurement, reported on its own (autopar.calibration.validation)."""
        if self.dropless:
            return []
        out = []
        if self.family == "megatron" and not self.model.moe:
            out.append("dense Megatron-family")
        if self.family == "fsdp":
            out.append("FSDP-family")
        if self.model.moe:
            out.append("MoE")
        if self.long_context:
            out.append("long context")
        return out


def build_cases(rows: list[dict]) -> tuple[list[RunCase], list[tuple[str, str, str]]]:
    """Every row as a case (plus the dropless sub-cases a row prints in its notes), or skipped with
    the reason."""
    cases: list[RunCase] = []
    skipped: list[tuple[str, str, str]] = []
    built: dict[tuple, RunCase | str] = {}  # a row's content without its id -> its case, or why not
    for row in rows:
        if why := row_problem(row):  # a value no real run has (autopar.calibration.run_checks)
            skipped.append((row.get("row_id", "?"), row.get("model", "?"), why))
            continue
        key = tuple((k, v) for k, v in row.items() if k != "row_id")
        if key not in built:
            try:
                built[key] = build_case(row)
            except (ValueError, PlanError, InputError) as e:
                built[key] = str(e)
        case = built[key]
        if isinstance(case, str):
            skipped.append((row.get("row_id", "?"), row.get("model", "?"), case))
            continue
        if case.row_id != (rid := str(int(num(row, "row_id") or 0))):  # the same run in another row
            case = RunCase(**{**case.__dict__, "row_id": rid, "assumptions": list(case.assumptions)})
        cases.append(case)
        dropless = _dropless_case(case, row)
        if dropless is not None:
            cases.append(dropless)
    return cases, skipped


def build_case(row: dict) -> RunCase:
    r = PublishedRow.of(row)
    rid, src, fam, notes = r.row_id, r.source, r.family, r.notes
    s = r.integer("seq_len")
    if not s:
        raise ValueError("sequence length not stated")
    model = row_model(r, s)
    cluster = row_cluster(r)
    plan = run_plan(r, model, cluster)
    problems = plan_problems(
        plan, model, num_gpus=plan.num_gpus, cluster=cluster, seq_len=s, trainer_capabilities=False
    )  # the run ran on its own framework
    if problems:
        raise ValueError("; ".join(problems))
    plan = _recompute_that_fits(r, plan, model, cluster, s)
    metric, published, fpt = _metric(r, model, s, plan.tp)
    imbalance = _routing(r, model)
    whole_run = re.search(r"average over the whole", text(row, "notes"), re.I) is not None
    if whole_run:
        notes.append("a whole run's average throughput: the step's times the goodput of its interruptions")
    overrides, why = row_kernels(src, text(row, "notes"))
    if why:
        notes.append(why)
    return RunCase(
        row_id=str(rid),
        source=src,
        family=fam,
        name=text(row, "model"),
        model=model,
        cluster=cluster,
        plan=plan,
        seq_len=s,
        metric=metric,
        published=published,
        flops_per_token=fpt,
        assumptions=notes,
        kernel_overrides=dict(overrides),
        profile=declared(src).profile or FAMILY_PROFILE[fam],
        routing_imbalance=imbalance,
        whole_run=whole_run,
    )


def _recompute_that_fits(r: PublishedRow, plan: ParallelPlan, model, cluster, seq_len: int) -> ParallelPlan:
    """A published run fit in its GPUs' memory: where its row leaves recompute unstated and the plan
    without it does not fit, the lightest recompute that does (selective, then full), noted. The
    program's own memory stack prices it (autopar.calibration.sources)."""
    if "recompute not stated: assumed none" not in r.notes or _fits(r, plan, model, cluster, seq_len):
        return plan
    for choice in ("selective", "full"):
        lighter = plan.with_(recompute=choice, recompute_layers=None, recompute_modules=None)
        if _fits(r, lighter, model, cluster, seq_len):
            r.notes.remove("recompute not stated: assumed none")
            r.notes.append(f"recompute not stated: {choice}, the lightest that fits (the run fit in memory)")
            return lighter
    return plan


def _fits(r: PublishedRow, plan: ParallelPlan, model, cluster, seq_len: int) -> bool:
    """Whether the plan fits as its program ran it: its memory stack, and NVIDIA's performance
    recipes' bf16 gradient buffer (autopar.calibration.memory_facts memory_plan)."""
    priced = priced_cluster(cluster, plan.trainer)
    stack = declared(r.source).stack
    if stack is not None:
        priced = replace(priced, training_stack=stack)
    if nvidia_recipes(r.source):
        plan = plan.with_(main_grads_fp32=False)
    table = PlanTable.from_plans([plan])
    prepared = prepare(table, model, priced, num_gpus=plan.num_gpus, seq_len=seq_len, trainer_capabilities=False)
    return bool(price(prepared, priced)[FITS][0])


def _routing(r: PublishedRow, model) -> float:
    """The busiest expert rank's tokens over the mean (autopar.spec.routing): forced-balanced where
    the row says so or states nothing (NVIDIA's benchmark tables), a real router's where it says the
    routing was learned (aux-loss or aux-loss-free balancing). Megatron-Core had no way to force it
    before 0.13.0 (`moe_router_force_load_balancing` first appears in that release's
    transformer_config.py), so an aux-loss run of MCore v0.8 (row 411) ran its real router."""
    if model.moe is None:
        return FORCED_BALANCED
    words = r.text("notes")
    if re.search(r"real \(not forced|aux-loss", words, re.I):
        r.notes.append(f"real router, dropless: routing imbalance {REAL_ROUTER_IMBALANCE} (autopar.spec.routing)")
        return REAL_ROUTER_IMBALANCE
    if re.search(r"force-load-balancing|forced balance|force-balanced", words, re.I) is None:
        r.notes.append("routing not stated: assumed forced-balanced (a benchmark table)")
    return FORCED_BALANCED


def _dropless_case(case: RunCase, row: dict) -> RunCase | None:
    """ModelZoo long-context rows print forced-balance and dropless TFLOP/s ('295 (forced balance) /
    237 (dropless)'): the dropless one is a second measurement of the same layout with real routing."""
    m = re.search(r"/\s*([\d.]+)\s*\(dropless\)", text(row, "notes"))
    if m is None or case.metric != "TFLOP/s/GPU":
        return None
    return RunCase(
        **{
            **case.__dict__,
            "row_id": f"{case.row_id}d",
            "published": float(m.group(1)),
            "dropless": True,
            "routing_imbalance": REAL_ROUTER_IMBALANCE,
            "assumptions": case.assumptions + ["dropless (real routing): the row's notes"],
            "inputs": None,
        }
    )


# ---- metric --------------------------------------------------------------------------------------


def _metric(r: PublishedRow, model, s, tp) -> tuple[str, float, float]:
    """The measure to compare, best first: tokens/s/GPU, step time, TFLOP/s/GPU, MFU (the last two
    need the source's FLOP convention: autopar.calibration.sources, else current Megatron's)."""
    convention = declared(r.source).convention
    fpt = flops_per_token(convention, model, s, tp)
    tok, step, tfl, mfu = (r.num(k) for k in ("tokens_per_sec_per_gpu", "step_time_s", "tflops_per_gpu", "mfu"))
    if tok:
        return "tokens/s/GPU", tok, fpt
    if step:
        return "step time s", step, fpt
    if tfl:
        r.notes.append(f"TFLOP/s per {CONVENTIONS[convention]}")
        return "TFLOP/s/GPU", tfl, fpt
    if mfu:
        r.notes.append(f"MFU against the dense BF16 peak, FLOPs per {CONVENTIONS[convention]} (assumed)")
        return "MFU", mfu / 100.0, fpt
    raise ValueError("no throughput measure (tokens/s, step time, TFLOP/s or MFU)")
