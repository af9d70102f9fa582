"""Optuna drives the search where the space is too large to enumerate (or when asked with
`--max-exhaustive 0`): each trial proposes one plan, the analytic estimate scores it, infeasible
plans are reported through `constraints_func`, and every trial keeps its plan and estimate as user
attributes. The study lives in a persistent storage (SQLite in the run directory by default, any
Optuna storage URL or a journal file otherwise), so reruns resume and many workers share one study.

This is the only module of the search layer that imports optuna.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
import optuna
from optuna.trial import TrialState

from autopar.errors import InputError, quoted
from autopar.figures import (
    BUBBLE_FRACTION,
    FITS,
    MEMORY_CAPACITY_BYTES,
    MEMORY_MISS_GIB,
    MFU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    RANK_TIME_S,
    REJECTED_BY,
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    VALID,
)
from autopar.processes import start_time
from autopar.search.enumerate import INNER as WALK_INNER
from autopar.search.enumerate import Enumerator, build_table
from autopar.search.limits import SAMPLERS
from autopar.search.results import row_plan
from autopar.search.space import SearchSpace
from autopar.secrets import mask_secrets
from autopar.spec.hardware import GIB
from autopar.spec.question import Question
from autopar.spec.read_file import check_regular

#: an objective's direction, as optuna names it
Direction = Literal["minimize", "maximize"]

#: the estimate figures every trial keeps (with its plan) as user attributes
ESTIMATE_ATTRS = (
    STEP_TIME_S,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    MFU,
    PEAK_MEMORY_BYTES,
    MEMORY_CAPACITY_BYTES,
    BUBBLE_FRACTION,
)
INFEASIBLE_STEP_TIME = 1e9  # objective of a plan that is not a plan (divisibility) or not valid


@contextmanager
def quiet_optuna():
    """Optuna at most at WARNING inside the block (its INFO line per study and per trial would drown
    autopar's own output), its log level as it was after. Also a decorator: @quiet_optuna()."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(before, optuna.logging.WARNING))
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def storage_url(storage: str | None, run_dir: Path) -> str:
    """Default: SQLite in the run directory. A path ending in .log/.jsonl is a journal file."""
    if storage is None:
        return f"sqlite:///{run_dir / 'study.db'}"
    return storage


#: SQL dialect -> the SQLAlchemy drivers autopar can switch between, and the module each imports
_DRIVERS = {
    "postgresql": (("psycopg2", "psycopg2"), ("psycopg", "psycopg")),
    "mysql": (("mysqldb", "MySQLdb"), ("pymysql", "pymysql")),
}


def _default_driver(dialect: str) -> str:
    """The driver SQLAlchemy picks for `dialect://` (psycopg2 before SQLAlchemy 2.1, psycopg 3 since)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(f"{dialect}://").get_dialect().driver
    except Exception:  # noqa: BLE001 - an unknown dialect: SQLAlchemy will say so when opened
        return ""


def with_driver(url: str) -> str:
    """The URL naming a database driver that is installed: SQLAlchemy 2.1 reads `postgresql://` as
    psycopg 3, 2.0 as psycopg2; with only the other one installed the URL is rewritten to it (e.g.
    `postgresql+psycopg2://`; the same for MySQL). No driver at all: one line saying what to install."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    dialect, _, driver = scheme.partition("+")
    dialect = "postgresql" if dialect.lower() == "postgres" else dialect.lower()
    drivers = dict(_DRIVERS.get(dialect, ()))
    wanted = driver.lower() or _default_driver(dialect)
    if not sep or wanted not in drivers:
        return url  # not a server database, or a driver autopar does not switch: SQLAlchemy says
    installed = [d for d, module in drivers.items() if importlib.util.find_spec(module) is not None]
    if wanted in installed:
        return f"{dialect}+{wanted}://{rest}"
    if installed:
        return f"{dialect}+{installed[0]}://{rest}"
    raise InputError(
        mask_secrets(
            f"cannot open storage '{url}': no {dialect} driver is installed (SQLAlchemy needs "
            f"{' or '.join(drivers.values())}); pip install "
            f"{'psycopg2-binary' if dialect == 'postgresql' else 'pymysql'}, or use sqlite:///FILE "
            f"or a journal file (FILE.log)"
        )
    )


def open_storage(url: str):
    """An Optuna storage for the URL; a journal file for *.log / *.jsonl paths. Bad URLs are
    one-line InputErrors."""
    if url.endswith((".log", ".jsonl")) and "://" not in url:
        check_regular(url, f"--storage journal file {quoted(url)}", "give a journal file name (FILE.log)")
    elif url.startswith("sqlite:///"):
        check_regular(url.removeprefix("sqlite:///"), f"the SQLite file of {quoted(url)}", "give another file")
    try:
        if url.endswith((".log", ".jsonl")) and "://" not in url:
            from optuna.storages.journal import JournalFileBackend, JournalStorage

            Path(url).parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(url))
        return _rdb_storage(url)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - any driver error is a bad storage for the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(
            mask_secrets(f"cannot open storage '{url}': {first}; check the URL, the server and its driver")
        ) from None


def _rdb_storage(url: str, attempts: int = 5):
    """An RDB storage; retried when another worker is creating the same schema at that moment
    (two workers starting on a fresh database race on CREATE TABLE); the URL names an installed
    driver (with_driver)."""
    url = with_driver(url)
    kwargs = {} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as e:  # noqa: BLE001
            text = str(e)
            racing = any(w in text for w in ("UniqueViolation", "already exists", "duplicate key", "IntegrityError"))
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def make_sampler(name: str, seed: int | None, multi_objective: bool):
    if name not in SAMPLERS:
        raise InputError(f"unknown sampler '{name}'; choose from {', '.join(SAMPLERS)}")
    if name == "nsga2" or (multi_objective and name == "tpe"):
        return optuna.samplers.NSGAIISampler(seed=seed, **_constraints_kw())
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=20, **_constraints_kw())


def _new_optuna() -> bool:
    return int(optuna.__version__.split(".")[0]) >= 5


def _constraints_kw() -> dict:
    """Optuna >= 5 reads constraints set on the trial (Trial.set_constraint); older versions need
    a constraints_func reading our user attribute."""
    if _new_optuna():
        return {}
    return {"constraints_func": lambda t: (t.user_attrs.get("estimate", {}).get("constraint", 1.0),)}


def set_constraint(trial, value: float) -> None:
    """Feasible when <= 0 (memory misses are positive: 1 + GiB over). Optuna < 5 reads it back
    from the trial's "estimate" user attribute through `constraints_func`."""
    if _new_optuna():
        trial.set_constraint("memory", value)


@quiet_optuna()
def load_or_create_study(url: str, study_name: str, sampler, directions: list[Direction]) -> optuna.Study:
    storage = open_storage(url)
    try:
        return optuna.create_study(
            storage=storage, study_name=study_name, sampler=sampler, directions=directions, load_if_exists=True
        )
    except ValueError as e:  # e.g. the study exists with other directions
        raise InputError(
            mask_secrets(f"study '{study_name}' in '{url}' cannot be used: {e}; pick another --study-name")
        ) from None


def _counts(t: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial uses up budget: finished (complete, or pruned but not surplus)."""
    return t.state == TrialState.COMPLETE or (t.state == TrialState.PRUNED and not t.user_attrs.get("surplus"))


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if _counts(t)]


#: this process, as trials record it: host:pid, and +start time where /proc has it
_STARTED = start_time(os.getpid())
WORKER = f"{socket.gethostname()}:{os.getpid()}" + (f"+{_STARTED}" if _STARTED else "")


def _alive(worker: str) -> bool:
    """Whether the worker (host:pid[+start]) that ran a trial still runs; other hosts are assumed
    alive. A pid now held by a process that started at another time is a dead worker's."""
    host, _, tail = worker.rpartition(":")
    pid, _, started = tail.partition("+")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not started or start_time(pid) in (None, started)


#: a worker records itself on a trial right after asking for it (run_study): a RUNNING trial with
#: no worker this long after its start was asked by a process that died in between
UNCLAIMED_S = 5.0


def fail_stale(study: optuna.Study, older_than_s: float, unclaimed_s: float = UNCLAIMED_S) -> int:
    """Mark RUNNING trials failed whose process died: at once when it ran on this host (its pid is
    gone), after `older_than_s` for other hosts, after `unclaimed_s` for a trial no worker recorded
    itself on. A rerun then redoes them."""
    import datetime as dt

    now = dt.datetime.now()
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker", "")
        age = (now - t.datetime_start).total_seconds() if t.datetime_start is not None else 0.0
        if (
            (worker and not _alive(worker))
            or (not worker and age > min(older_than_s, unclaimed_s))
            or (worker and age > older_than_s and not worker.startswith(socket.gethostname() + ":"))
        ):
            study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            n += 1
    return n


def wait_for_running(study: optuna.Study, timeout_s: float = 120.0, poll_s: float = 0.1) -> bool:
    """Wait until no trial is RUNNING: another worker's trial still being evaluated belongs to the
    shared study every worker reports (a worker that stopped first would otherwise answer without it,
    and two workers give two winners). A trial whose process died is failed meanwhile (fail_stale);
    after `timeout_s` the answer goes on with what has finished. True when none is left running."""
    deadline = time.monotonic() + timeout_s
    while study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) and time.monotonic() < deadline:
        fail_stale(study, older_than_s=timeout_s)
        time.sleep(poll_s)
    return not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def _budget_taken_before(study: optuna.Study, number: int) -> int:
    """Budget used by trials numbered before `number`: finished ones and those still running."""
    return sum(
        1
        for t in study.get_trials(deepcopy=False)
        if t.number < number and (_counts(t) or t.state == TrialState.RUNNING)
    )


#: knobs Optuna chooses (the structure of the layout) and knobs each trial completes exhaustively
#: (cheap to evaluate side by side, vectorised): a trial is one structure plus its best completion
OUTER = ("tp", "cp", "pp", "ep", "etp", "dtype", "tp_comm_overlap")
_COMPLETED_FIRST = ("sched_vpp", "zero", "mbs", "recompute", "recompute_layers", "pp_layout")
#: the schedule, ZeRO, micro-batch, recompute and layout choices, then every other inner axis of the
#: exhaustive walk (autopar.search.enumerate.INNER: the rest of the plan's knobs, the trainer last)
INNER = _COMPLETED_FIRST + tuple(a for a in WALK_INNER if a not in _COMPLETED_FIRST + OUTER)


def suggest_outer(trial: optuna.Trial, choices: dict, moe: bool) -> dict[str, int]:
    """Define-by-run: the structural knobs as ordinal integers (positions in the sorted choices,
    so TPE's kernels see that tp 4 lies between 2 and 8); expert knobs only for MoE models, the
    TP-overlap switch only with tp > 1."""

    def pick(axis: str, when: bool = True) -> int:
        n = len(choices[axis])
        return trial.suggest_int(axis, 0, n - 1) if when and n > 1 else 0

    v = {
        "tp": pick("tp"),
        "cp": pick("cp"),
        "pp": pick("pp"),
        "ep": pick("ep", moe),
        "etp": pick("etp", moe),
        "dtype": pick("dtype"),
    }
    v["tp_comm_overlap"] = pick("tp_comm_overlap", choices["tp"][v["tp"]] > 1)
    return v


def completion_values(outer: dict[str, int], choices: dict) -> dict[str, np.ndarray]:
    """Index arrays for every completion of one structure: the product of the INNER choices."""
    grids = np.meshgrid(*[np.arange(len(choices[a])) for a in INNER], indexing="ij")
    n = grids[0].size
    values = {a: g.ravel() for a, g in zip(INNER, grids)}
    values.update({a: np.full(n, x) for a, x in outer.items()})
    tp = choices["tp"][outer["tp"]]
    values["sp"] = np.full(n, choices["sp"].index(tp > 1) if (tp > 1) in choices["sp"] else 0)
    return values


def structures_table(space: SearchSpace, q: Question, outers: list[dict[str, int]]):
    """One PlanTable holding every completion of the given structures."""
    enumerator = Enumerator(space, q)
    choices = enumerator.choices
    parts = [completion_values(o, choices) for o in outers]
    values = {a: np.concatenate([p[a] for p in parts]) for a in parts[0]}
    return build_table(space, q, values, choices, enumerator)


@quiet_optuna()
def run_study(
    space: SearchSpace,
    q: Question,
    study: optuna.Study,
    n_trials: int,
    evaluate: Callable,
    multi_objective: bool,
    on_trial: Callable | None = None,
) -> None:
    """Run trials until the study holds `n_trials` finished ones. Each trial: Optuna proposes a
    structure, `evaluate(table)` scores all its completions (a DataFrame), the best that fits is
    the trial's value. Trial numbers are handed out by the storage, so concurrent workers never
    run the same trial; a worker that draws a trial beyond the budget marks it pruned ('surplus'),
    waits for the running trials that hold the budget and stops, or draws again where some of them
    failed."""
    enumerator = Enumerator(space, q)  # its layout registry, built once for every trial's table
    choices = enumerator.choices
    moe = q.model.moe is not None
    while len(finished(study)) < n_trials:
        trial = study.ask()
        trial.set_user_attr("worker", WORKER)
        if _budget_taken_before(study, trial.number) >= n_trials:
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=TrialState.PRUNED)
            # the budget may be held by running trials that fail (a killed worker's, failed once
            # stale): wait for them, then draw again if they left it short
            if wait_for_running(study):
                continue
            break
        outer = suggest_outer(trial, choices, moe)
        trial.set_user_attr("outer", outer)
        table = build_table(space, q, completion_values(outer, choices), choices, enumerator)
        values = _score(trial, table, evaluate, multi_objective)
        study.tell(trial, values)
        if on_trial is not None:
            on_trial(trial.number + 1)


def _score(trial, table, evaluate: Callable, multi_objective: bool) -> list[float]:
    """The structure's value: its fastest completion that fits (or, if none fits, the valid one
    closest to fitting, marked infeasible through the constraint). `evaluate(table)` gives the
    completions that can be it, in full (autopar.search.evaluate.best_completion: that one row).
    The trial keeps that plan and its estimate as user attributes (few writes: each is a storage
    round trip)."""
    infeasible = [INFEASIBLE_STEP_TIME] + ([0.0] if multi_objective else [])
    if len(table) == 0:
        set_constraint(trial, 1.0)
        trial.set_user_attr("estimate", {REJECTED_BY: "tp*pp*cp does not divide the GPUs", "constraint": 1.0})
        return infeasible
    df = evaluate(table)
    fit, valid = df[df[FITS]], df[df[VALID]]
    if len(fit):
        best, constraint = fit.loc[fit[RANK_TIME_S].idxmin()], 0.0
    elif len(valid):
        best = valid.loc[valid[MEMORY_MISS_GIB].idxmin()]
        constraint = 1.0 + float(best[MEMORY_MISS_GIB])
    else:
        set_constraint(trial, 1.0)
        trial.set_user_attr(
            "estimate", {REJECTED_BY: str(df[REJECTED_BY].iloc[0]), "constraint": 1.0, "completions": len(table)}
        )
        return infeasible
    set_constraint(trial, constraint)
    trial.set_user_attr("plan", row_plan(best, table.layouts).to_dict())
    trial.set_user_attr(
        "estimate",
        {k: float(best[k]) for k in ESTIMATE_ATTRS}
        | {
            FITS: bool(best[FITS]),
            PLAN_NAME: str(best[PLAN_NAME]),
            REJECTED_BY: str(best[REJECTED_BY]),
            "completions": len(table),
            "constraint": constraint,
        },
    )
    headroom = float((best[MEMORY_CAPACITY_BYTES] - best[PEAK_MEMORY_BYTES]) / GIB)
    return [float(best[RANK_TIME_S])] + ([headroom] if multi_objective else [])


def study_history(study: optuna.Study) -> list[dict]:
    """Trial number, objective and best-so-far, for reports."""
    out, best = [], math.inf
    for t in study.get_trials(deepcopy=False):
        if t.state != TrialState.COMPLETE or not t.values:
            continue
        v = t.values[0]
        feasible = t.user_attrs.get("estimate", {}).get("constraint", 1.0) <= 0
        if feasible:
            best = min(best, v)
        out.append({"number": t.number, STEP_TIME_S: v, "feasible": feasible, "best_so_far": best})
    return out
