"""Optuna mode (`--max-exhaustive 0`, autopar/search/optuna_driver.py).

(a) Forced Optuna on Llama 3 70B / 256 H100: the trial budget is exact, the best found is close to
    the exhaustive optimum, the history is a running minimum, every trial records its structure,
    and what the result reports agrees with the study.
(b) Resume after SIGKILL: a killed `autopar search` is rerun with the same command; the study ends
    with exactly the budget of finished trials, keeps every trial finished before the kill as it
    was, and does not redo them.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from autopar.search.enumerate import enumerate_plans, knob_choices
from autopar.search.evaluate import evaluate
from autopar.search.optuna_driver import OUTER
from autopar.search.results import ranked
from autopar.search.run import SearchOptions, run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)

pytestmark = [pytest.mark.slow]  # Optuna searches, some killed and resumed: about 18 s

N_TRIALS = 40
# Measured with this space and TPE (multivariate, 20 startup trials): at 40 trials seed 0 lands 3.3 %
# above the exhaustive optimum (seeds 0-2: 3.3 %, 0 %, 3.3 %); the benchmark shows 0 % at 200 trials.
GAP_BOUND = 0.05


def journal_study(path: Path, name: str) -> optuna.Study:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(path))))


@pytest.fixture(scope="module")
def question(sh):
    return sh.question("llama3-70b", 256, "default", 8192)


@pytest.fixture(scope="module")
def exhaustive_best(question):
    q, space = question
    df = evaluate(enumerate_plans(space, q), q, float(space.constraints["memory_headroom_gib"]))
    return float(ranked(df).iloc[0]["step_time_s"])


@pytest.fixture(scope="module")
def forced(question, tmp_path_factory):
    q, space = question
    d = tmp_path_factory.mktemp("optuna40")
    res = run_search(
        q,
        SearchOptions(
            space=space,
            max_exhaustive=0,
            n_trials=N_TRIALS,
            seed=0,
            storage=str(d / "study.log"),
            study_name="forced",
            run_dir=d,
        ),
    )
    return res, journal_study(d / "study.log", "forced")


def test_method_and_files(forced):
    res, _ = forced
    assert res.method == "optuna-tpe"
    for name in ("plans.parquet", "scatter.parquet", "top.json", "search.json", "study.log"):
        assert (res.run_dir / name).is_file(), name
    assert not (res.run_dir / "study.db").exists()  # the journal file was the storage
    info = json.loads((res.run_dir / "search.json").read_text())
    assert info["method"] == "optuna-tpe" and info["options"]["n_trials"] == N_TRIALS
    assert info["history"] == res.history


def test_trial_budget_is_exact(forced):
    _, study = forced
    trials = study.get_trials(deepcopy=False)
    states = collections.Counter(t.state for t in trials)
    assert states[TrialState.COMPLETE] == N_TRIALS, states
    assert states[TrialState.RUNNING] == 0
    assert len(trials) == N_TRIALS  # one worker: no surplus, no failures
    assert sorted(t.number for t in trials) == list(range(N_TRIALS))


def test_best_is_close_to_exhaustive_optimum(forced, exhaustive_best):
    res, _ = forced
    assert res.winner is not None
    found = float(res.top["step_time_s"].min())  # what Optuna found (the headroom rule may rank another first)
    assert found >= exhaustive_best * (1 - 1e-12)  # Optuna cannot beat the exhaustive optimum
    assert found <= exhaustive_best * (1 + GAP_BOUND), f"{100 * (found / exhaustive_best - 1):.2f}% above"


def test_history_is_a_running_minimum(forced):
    res, study = forced
    h = res.history
    assert len(h) == N_TRIALS
    assert [e["number"] for e in h] == sorted(e["number"] for e in h)
    best = [e["best_so_far"] for e in h]
    assert all(b2 <= b1 for b1, b2 in zip(best, best[1:])), "best_so_far increased"
    running = np.minimum.accumulate([e["step_time_s"] if e["feasible"] else np.inf for e in h])
    assert np.array_equal(np.asarray(best), running)
    assert best[-1] == float(res.top["step_time_s"].min())  # the fastest (the headroom rule may rank another first)


def test_every_trial_records_its_structure(forced, question):
    res, study = forced
    q, space = question
    choices = knob_choices(space, q)
    for t in study.get_trials(deepcopy=False):
        assert "outer" in t.user_attrs, f"trial {t.number} has no 'outer'"
        outer = t.user_attrs["outer"]
        assert set(outer) == set(OUTER)
        assert all(0 <= v < len(choices[k]) for k, v in outer.items())


def _structure_rows(df, outer: dict, choices: dict):
    """The rows of `df` that complete one structure (the OUTER knobs as indices into the choices)."""
    v = {k: choices[k][i] for k, i in outer.items()}
    etp = v["tp"] if v["etp"] == 0 else v["etp"]
    from autopar.spec.plan import DTYPES

    return df[
        (df["tp"] == v["tp"])
        & (df["cp"] == v["cp"])
        & (df["pp"] == v["pp"])
        & (df["ep"] == v["ep"])
        & (df["etp"] == etp)
        & (df["dtype"] == DTYPES[v["dtype"]])
        & (df["tp_comm_overlap"] == bool(v["tp_comm_overlap"]))
    ]


def test_trial_values_are_their_structures_best_completion(forced, question):
    """A trial's value is the fastest fitting completion of its structure, and the result's plans
    hold the completions of every structure the study tried (and nothing else)."""
    res, study = forced
    q, space = question
    choices = knob_choices(space, q)
    # every completion as written (res.plans keeps only the ranked pool, the sample and the Pareto set)
    df = pd.read_parquet(res.run_dir / "plans.parquet")
    feasible = {h["number"]: h["feasible"] for h in res.history}
    covered = np.zeros(len(df), dtype=bool)
    for t in study.get_trials(deepcopy=False):
        rows = _structure_rows(df, t.user_attrs["outer"], choices)
        assert len(rows) > 0, f"trial {t.number}: its structure is missing from .plans"
        covered[df.index.get_indexer(rows.index)] = True
        fit = rows[rows["fits"]]
        if feasible[t.number]:
            assert t.values[0] == fit["step_time_s"].min(), f"trial {t.number}"
        else:
            assert fit.empty, f"trial {t.number} is infeasible but its structure has plans that fit"
    assert covered.all(), f"{(~covered).sum()} rows of .plans belong to no trial's structure"
    best_feasible = min(t.values[0] for t in study.get_trials(deepcopy=False) if feasible[t.number])
    assert float(res.top["step_time_s"].min()) == best_feasible


def test_seeded_runs_repeat(forced, question, tmp_path):
    res, study = forced
    q, space = question
    again = run_search(
        q,
        SearchOptions(
            space=space,
            max_exhaustive=0,
            n_trials=N_TRIALS,
            seed=0,
            storage=str(tmp_path / "study.log"),
            study_name="forced",
            run_dir=tmp_path,
        ),
    )
    other = journal_study(tmp_path / "study.log", "forced")
    assert [t.params for t in other.get_trials()] == [t.params for t in study.get_trials()]
    assert again.winner["plan_name"] == res.winner["plan_name"]


# ---- (b) resume after SIGKILL -----------------------------------------------------------------------

RESUME_TRIALS = 60
KILL_AFTER = 10
STALE_AFTER_S = 5.0  # run.py: od.fail_stale(study, older_than_s=5.0)
#: bounds on the searches these tests start: they check what a kill and a rerun leave, not speed.
#: Alone on this machine the rerun takes about 7 s; beside `make test`'s other worker (torchrun
#: trials of up to 8 ranks on 2 cores) one took more than 120 s
SEARCH_TIMEOUT_S = 600


def _search_cmd(sh, run_dir: Path, storage: str | None) -> list[str]:
    args = [
        "search",
        "--model",
        "llama3-70b",
        "--gpus",
        "256",
        "--seq-len",
        "8192",
        "--max-exhaustive",
        "0",
        "--n-trials",
        RESUME_TRIALS,
        "--seed",
        "0",
        "--study-name",
        "resume",
        "--run-dir",
        run_dir,
        "--json",
    ]
    if storage:
        args += ["--storage", storage]
    return sh.cmd(*args)


def _rdb(url: str) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(url, skip_table_creation=True)


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    rdb = _rdb(url)
    try:
        return rdb.get_all_trials(rdb.get_study_id_from_name("resume"), deepcopy=True)
    finally:
        rdb.engine.dispose()


def _start_and_kill(sh, run_dir: Path, storage: str | None, url: str, db: Path, tmp_path: Path):
    """Start the search, wait (bounded) until KILL_AFTER trials are COMPLETE and the next one is
    RUNNING, SIGKILL the process. Returns the trials as they were after the kill and its time."""
    log = open(tmp_path / "first.stderr", "w")
    proc = subprocess.Popen(
        _search_cmd(sh, run_dir, storage), stdout=subprocess.DEVNULL, stderr=log, cwd=tmp_path, env=sh.env()
    )
    rdb = None
    try:
        deadline = time.monotonic() + SEARCH_TIMEOUT_S / 2
        done = 0
        while True:
            if time.monotonic() > deadline:
                pytest.fail(f"only {done} trials completed within {SEARCH_TIMEOUT_S / 2:.0f} s")
            if proc.poll() is not None:
                pytest.fail(
                    f"the search exited (rc {proc.returncode}) before {KILL_AFTER} trials: "
                    f"{(tmp_path / 'first.stderr').read_text()[-2000:]}"
                )
            if rdb is None and db.exists():
                try:  # one storage, reused: polling must not slow the search down
                    rdb = _rdb(url)
                    sid = rdb.get_study_id_from_name("resume")
                except Exception:  # noqa: BLE001 - the tables or the study may not exist yet
                    rdb = None
            if rdb is not None:
                trials = rdb.get_all_trials(sid, deepcopy=False)
                done = sum(t.state == TrialState.COMPLETE for t in trials)
                if done >= KILL_AFTER and any(t.state == TrialState.RUNNING for t in trials):
                    break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        if rdb is not None:
            rdb.engine.dispose()
    assert proc.returncode == -signal.SIGKILL
    return _trials(url), killed_at


def _rerun(sh, run_dir: Path, storage: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    """The same search command again, to its end (bounded by SEARCH_TIMEOUT_S)."""
    return subprocess.run(
        _search_cmd(sh, run_dir, storage),
        capture_output=True,
        text=True,
        timeout=SEARCH_TIMEOUT_S,
        cwd=tmp_path,
        env=sh.env(),
    )


def _check_resumed(before, after):
    done_before = {t.number: t for t in before if t.state == TrialState.COMPLETE}
    assert len(done_before) >= KILL_AFTER
    numbers = [t.number for t in after]
    assert len(numbers) == len(set(numbers)), "a trial number appears twice"
    states = collections.Counter(t.state.name for t in after)
    assert states["RUNNING"] == 0, f"trials left RUNNING: {[t.number for t in after if t.state == TrialState.RUNNING]}"
    counted = [
        t
        for t in after
        if t.state == TrialState.COMPLETE or (t.state == TrialState.PRUNED and not t.user_attrs.get("surplus"))
    ]
    assert len(counted) == RESUME_TRIALS, states
    # the rerun did not redo the trials finished before the kill: COMPLETE is the budget, not budget + those
    assert states["COMPLETE"] == RESUME_TRIALS, states
    by_number = {t.number: t for t in after}
    for n, t in done_before.items():
        assert n in by_number, f"trial {n} finished before the kill and is gone"
        a = by_number[n]
        assert a.state == TrialState.COMPLETE
        assert a.params == t.params, f"trial {n} params changed"
        assert a.values == t.values, f"trial {n} values changed"
        assert a.user_attrs["outer"] == t.user_attrs["outer"]
    # the trial the kill interrupted is marked failed, not left running or counted
    for t in before:
        if t.state == TrialState.RUNNING:
            assert by_number[t.number].state == TrialState.FAIL


def test_resume_after_sigkill(sh, tmp_path):
    """Kill, wait past the stale-trial window, rerun the same command to completion."""
    run_dir = tmp_path / "run"
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    before, killed_at = _start_and_kill(sh, run_dir, url, url, db, tmp_path)
    time.sleep(max(0.0, STALE_AFTER_S + 1.0 - (time.monotonic() - killed_at)))
    r = _rerun(sh, run_dir, url, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["method"] == "optuna-tpe" and out["top"]
    _check_resumed(before, _trials(url))


def test_resume_right_after_sigkill(sh, tmp_path):
    """The same, rerun at once (as a user or a job scheduler would), with the default storage
    (study.db in the run directory)."""
    run_dir = tmp_path / "run"
    db = run_dir / "study.db"
    url = f"sqlite:///{db}"
    before, _ = _start_and_kill(sh, run_dir, None, url, db, tmp_path)
    running = [t for t in before if t.state == TrialState.RUNNING]
    if not running:
        pytest.skip("the kill landed between two trials: nothing was interrupted")
    r = _rerun(sh, run_dir, None, tmp_path)
    if r.returncode != 0:  # not the known bug: fail outright (pytest.fail is not an AssertionError)
        pytest.fail(f"the rerun exited {r.returncode}: {r.stderr[-3000:]}")
    after = _trials(url)
    # the rerun's stale check ran before its first new trial started: only if that was within the
    # stale window of the killed trial's start does this test exercise an immediate resume
    last_before = max(t.number for t in before)
    new = [t for t in after if t.number > last_before and t.datetime_start is not None]
    if new:
        age = (min(new, key=lambda t: t.number).datetime_start - running[0].datetime_start).total_seconds()
        if age >= STALE_AFTER_S:
            pytest.skip(f"the rerun started {age:.1f} s after the killed trial: not an immediate resume")
    _check_resumed(before, after)


def test_a_reused_pid_is_not_the_dead_worker():
    """A trial's worker is host:pid+start: a pid the kernel gave to a later process (pid_max 32768
    wraps in minutes on a busy host) must not keep a dead worker's trial RUNNING, where a rerun
    would wait for it (wait_for_running) instead of redoing it."""
    from autopar.search import optuna_driver as od

    host = socket.gethostname()
    me = os.getpid()
    started = Path(f"/proc/{me}/stat").read_text().rpartition(")")[2].split()[19]  # proc(5) field 22
    assert od.WORKER == f"{host}:{me}+{started}"
    assert od._alive(od.WORKER)
    assert not od._alive(f"{host}:{me}+{int(started) + 1}")  # this pid, another process's start
    assert od._alive(f"{host}:{me}")  # a record without a start time: the pid alone decides
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not od._alive(f"{host}:{dead.pid}")
    assert od._alive(f"another-{host}:{dead.pid}")  # other hosts' processes are not visible here


def test_a_trial_its_killed_worker_never_claimed_gives_its_budget_back(question):
    """A worker killed between asking for a trial and recording itself on it leaves a RUNNING
    trial with no worker. A rerun at once counted it in the budget until the end, and ended one
    trial short (the CI of 2026-12-07: 59 of 60, after waiting 120 s for it): it is failed once
    unclaimed for `UNCLAIMED_S` and the budget is drawn again."""
    from autopar.search import optuna_driver as od

    q, space = question
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    orphan = study.ask()  # no "worker" attribute: its process died at once
    assert od.fail_stale(study, older_than_s=120.0) == 0  # younger than UNCLAIMED_S: maybe alive
    headroom = float(space.constraints["memory_headroom_gib"])
    od.run_study(space, q, study, 3, lambda table: evaluate(table, q, headroom), multi_objective=False)
    states = collections.Counter(t.state.name for t in study.get_trials(deepcopy=False))
    assert study.trials[orphan.number].state == TrialState.FAIL
    assert len(od.finished(study)) == 3, states
    assert states["RUNNING"] == 0, states
