"""The whole run of a search: days to train, GPU-hours, cost and goodput for each plan kept
(autopar.cost.goodput), and the answers a what-if gives about it: the cheapest plan that finishes
by the deadline, the fastest plan within the budget. A deadline or budget no plan meets is an
answer (UnmetGoal: one line and exit 1), saying what the best plan needs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from autopar.cost.goodput import finish_problem, run_time_columns
from autopar.errors import InputError, UnmetGoal
from autopar.figures import (
    COST,
    DAYS,
    ENERGY_MWH,
    GOODPUT,
    GPU_HOURS,
    LOST_TO_CHECKPOINTS,
    LOST_TO_RESTARTS,
    LOST_TO_REWORK,
    PLAN_NAME,
    TOKENS_PER_S,
    TRAIN_DAYS,
)
from autopar.spec.plan import DTYPES
from autopar.spec.training_run import TrainingRun, deadline_text, gpu_hours_text, money_text, tokens_text


def run_columns(question, run: TrainingRun, tokens_per_s, dtype, verdicts: bool = True) -> dict:
    """The whole run of plans priced for `question` (autopar.cost.goodput.run_time_columns), with
    meets_deadline and within_budget when `verdicts`."""
    cluster = question.cluster
    return run_time_columns(
        tokens_per_s,
        dtype,
        question.num_gpus,
        question.model.params_total,
        run.tokens,
        cluster.reliability,
        run.price_for(cluster.gpu),
        run.deadline_s if verdicts else None,
        run.budget if verdicts else None,
        cluster.operating_gpu.power_w,
    )


def with_run_columns(df: pd.DataFrame, question, run: TrainingRun | None) -> pd.DataFrame:
    """`df` (plans priced for `question`) with the run columns when a run is given."""
    if run is None or df is None or not len(df):
        return df
    return df.assign(**run_columns(question, run, df[TOKENS_PER_S].to_numpy(), df["dtype"].to_numpy()))


def check_question_run(questions: list, run: TrainingRun | None, dtypes) -> None:
    """Before any plan is priced, one line when the run of these questions (a what-if's scenarios)
    cannot be priced (TrainingRun.check_prices) or can never finish on a question's cluster
    (autopar.cost.goodput.finish_problem, with the smallest checkpoint the space's `dtypes` allow)."""
    if run is None:
        return
    run.check_prices([q.cluster.gpu for q in questions])
    fp32 = all(d == "fp32" for d in dtypes)
    for q in questions:
        run.check_one_step(q.batch, q.seq_len)
        why = finish_problem(q.cluster.reliability, q.num_gpus, q.model.params_total, fp32)
        if why:
            raise InputError(why)


#: the run columns plans.parquet gets for every plan (the rows shown get all of RUN_COLUMNS)
PLAN_FILE_COLUMNS = (DAYS, GOODPUT, GPU_HOURS, COST)


def plan_file_columns(question, run: TrainingRun | None):
    """For PlansWriter: (table, estimate) -> the whole run's days, goodput, GPU-hours and cost of
    every plan of a priced chunk; None without a run."""
    if run is None:
        return None
    run.price_for(question.cluster.gpu)  # a missing price is one line before any plan is priced
    dtypes = np.asarray(DTYPES, dtype=object)

    def columns(table, est: dict) -> dict:
        cols = run_columns(question, run, est[TOKENS_PER_S], dtypes[table.columns["dtype"]], verdicts=False)
        return {k: cols[k] for k in PLAN_FILE_COLUMNS}

    return columns


@dataclass
class RunAnswer:
    """What the whole run takes on the best plan of each scenario, and the deadline and budget
    answers: lines for the terminal, rows for JSON and the report."""

    run: TrainingRun
    lines: list[str] = field(default_factory=list)
    picks: dict = field(default_factory=dict)  # "cheapest_by_deadline" / "fastest_within_budget" -> scenario index

    def to_dict(self) -> dict:
        return {"training_run": self.run.to_dict(), "answers": self.lines, "picks": self.picks}


def _where(r) -> str:
    q, w = r.question, r.winner
    return f"{w[PLAN_NAME]} on {q.num_gpus:,} x {q.cluster.gpu.key}"


def _with(r) -> str:
    q, w = r.question, r.winner
    return f"with {w[PLAN_NAME]} on {q.num_gpus:,} x {q.cluster.gpu.key}"


def _costs(r, run: TrainingRun) -> str:
    w = r.winner
    cost = f", cost {money_text(w[COST])}" if run.priced else ""
    return f"{w[DAYS]:.1f} days, {gpu_hours_text(w[GPU_HOURS])} GPU-hours{cost}"


def summary_line(r, run: TrainingRun) -> str:
    """'Training 15T tokens with dp256 on 256 x h100-sxm takes 535.9 days (530.4 days of steps at 99.0 %
    goodput: ...): 3.29M GPU-hours, cost 8.23M.'"""
    w = r.winner
    cost = f", cost {money_text(w[COST])}" if run.priced else ""
    energy = w.get(ENERGY_MWH, math.nan)
    cost += f", {energy:,.0f} MWh of GPU energy" if energy is not None and math.isfinite(energy) else ""
    return (
        f"Training {tokens_text(run.tokens)} tokens {_with(r)} takes {w[DAYS]:.1f} days ({w[TRAIN_DAYS]:.1f} "
        f"days of steps at {100 * w[GOODPUT]:.1f} % goodput: checkpoints {100 * w[LOST_TO_CHECKPOINTS]:.1f} %, "
        f"rework {100 * w[LOST_TO_REWORK]:.1f} %, restarts {100 * w[LOST_TO_RESTARTS]:.1f} %): "
        f"{gpu_hours_text(w[GPU_HOURS])} GPU-hours{cost}."
    )


def choose(days, cost, run: TrainingRun) -> dict[str, int | None]:
    """Positions of the scenarios (their best plans; NaN days: nothing fits) that answer the run's
    questions: the fastest, the cheapest (cost, else GPU-hours in `cost`), the cheapest that meets the
    deadline, the fastest within the budget, the cheapest meeting both (None where none does)."""
    days, cost = np.asarray(days, dtype=float), np.asarray(cost, dtype=float)
    ok = np.isfinite(days) & np.isfinite(cost)
    meets = ok & (days * 86_400 <= run.deadline_s if run.deadline_s is not None else ok)
    within = ok & (cost <= run.budget if run.budget is not None else ok)

    def best(mask, key):
        return int(np.flatnonzero(mask)[np.argmin(key[mask])]) if mask.any() else None

    return {
        "fastest": best(ok, days),
        "cheapest": best(ok, cost),
        "cheapest_by_deadline": best(meets, cost),
        "fastest_within_budget": best(within, days),
        "both": best(meets & within, cost),
    }


def check_run(results: list, run: TrainingRun | None) -> RunAnswer | None:
    """The run's answers over the scenarios' best plans; UnmetGoal when no plan meets the deadline,
    the budget, or both."""
    if run is None or all(r.winner is None for r in results):
        return None
    answer = RunAnswer(run)
    nan = float("nan")
    days = [nan if r.winner is None else r.winner[DAYS] for r in results]
    money = COST if run.priced else GPU_HOURS
    c = choose(days, [nan if r.winner is None else r.winner[money] for r in results], run)
    deadline = None if run.deadline_s is None else deadline_text(run.deadline_s)
    budget = None if run.budget is None else f"the budget of {money_text(run.budget)}"
    tokens = tokens_text(run.tokens)
    if deadline and c["cheapest_by_deadline"] is None:
        assert c["fastest"] is not None  # some scenario has a best plan
        fastest = results[c["fastest"]]
        more = "" if len(results) > 1 else f"; try a what-if with more GPUs, e.g. --gpus {_more(fastest)}"
        raise UnmetGoal(
            f"no plan meets {deadline}: the fastest, {_where(fastest)}, needs "
            f"{fastest.winner[DAYS]:.1f} days for {tokens} tokens{more}"
        )
    if budget and c["fastest_within_budget"] is None:
        assert c["cheapest"] is not None  # some scenario has a best plan
        cheapest = results[c["cheapest"]]
        raise UnmetGoal(
            f"no plan fits {budget}: the cheapest, {_where(cheapest)}, costs "
            f"{money_text(cheapest.winner[COST])} for {tokens} tokens; raise --budget or train on "
            f"fewer tokens"
        )
    if deadline and budget and c["both"] is None:
        # each has a plan, else the lines above raised
        assert c["cheapest_by_deadline"] is not None and c["fastest_within_budget"] is not None
        raise UnmetGoal(
            f"no plan meets both {deadline} and {budget}: the cheapest by the deadline costs "
            f"{money_text(results[c['cheapest_by_deadline']].winner[COST])}, the fastest within the "
            f"budget needs {results[c['fastest_within_budget']].winner[DAYS]:.1f} days"
        )
    answer.lines = answer_lines(results, c, run, deadline, budget)
    answer.picks = {k: v for k, v in c.items() if v is not None}
    return answer


def answer_lines(results: list, c: dict, run: TrainingRun, deadline: str | None, budget: str | None) -> list[str]:
    """One scenario: what its run takes (and the deadline's and budget's margins); several: the
    cheapest by the deadline and the fastest within the budget."""
    if len(results) == 1:
        w = results[0].winner
        lines = [summary_line(results[0], run)]
        margins = []
        if deadline:
            assert run.deadline_s is not None  # `deadline` is its text
            margins.append(f"{(run.deadline_s / 86_400 - w[DAYS]):.1f} days to spare")
        if budget:
            margins.append(f"{money_text(run.budget - w[COST])} under budget")
        if margins:
            lines.append("Meets " + " and ".join(x for x in (deadline, budget) if x) + ": " + ", ".join(margins) + ".")
        return lines
    pick = results[c["cheapest_by_deadline"]]
    lines = [f"{'Cheapest by ' + deadline if deadline else 'Cheapest'}: {_where(pick)}, {_costs(pick, run)}."]
    pick = results[c["fastest_within_budget"]]
    lines.append(f"{'Fastest within ' + budget if budget else 'Fastest'}: {_where(pick)}, {_costs(pick, run)}.")
    return lines


def _more(r) -> str:
    n = r.question.num_gpus
    return f"{n},{2 * n},{4 * n}"
