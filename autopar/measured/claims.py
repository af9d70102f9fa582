"""Several workers on one measured-stage study: which worker measures which plan.

Optuna hands each enqueued (WAITING) trial to exactly one worker, but two workers can still pick
the same plan: both seed the analytic top-K when they start, and the sampler may propose a plan
another worker is measuring. So each trial is settled in trial-number order (numbers come from the
storage, so every worker sees the same order): it first waits, briefly, until every lower-numbered
running trial has decided; then it measures its plan only if no lower trial holds that plan
(enqueued, being measured, or measured) and the lower trials have not used up the budget. Otherwise
it is pruned with the user attribute `duplicate` or `surplus`, and a surplus worker stops.
"""

from __future__ import annotations

import datetime as dt
import socket
import time

import optuna
from optuna.trial import FrozenTrial, TrialState

from autopar.search import optuna_driver as od

#: longest wait for a lower-numbered trial to decide (a live worker decides in milliseconds; one
#: that died in between never does)
SETTLE_S = 10.0
DECISIONS = ("key", "duplicate", "surplus")


def trial_key(t: FrozenTrial) -> str | None:
    """The plan key a trial is about: its measured key, its sampled plan, or its enqueued one."""
    return t.user_attrs.get("key") or t.params.get("plan") or (t.system_attrs.get("fixed_params") or {}).get("plan")


def measured(t: FrozenTrial) -> bool:
    """Finished with a measurement: completed, pruned mid-run, or failed as data (oom, crash...)."""
    return "key" in t.user_attrs and (
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and "failure" in t.user_attrs)
    )


def _age_s(t: FrozenTrial) -> float:
    return (dt.datetime.now() - t.datetime_start).total_seconds() if t.datetime_start else 0.0


def live(t: FrozenTrial, stale_after_s: float) -> bool:
    """A RUNNING trial whose worker still runs (a dead local pid at once; another host's after
    `stale_after_s`; no worker recorded yet: only just asked)."""
    if t.state != TrialState.RUNNING:
        return False
    worker = t.user_attrs.get("worker", "")
    if not worker:
        return _age_s(t) < SETTLE_S
    local = worker.startswith(socket.gethostname() + ":")
    return od._alive(worker) and (local or _age_s(t) < stale_after_s)


def holds(t: FrozenTrial, stale_after_s: float) -> bool:
    """Whether a trial holds its plan: measured, being measured by a live worker, or enqueued."""
    if measured(t) or t.state == TrialState.WAITING:
        return True
    return "key" in t.user_attrs and live(t, stale_after_s)


def verdict(study: optuna.Study, number: int, key: str, target: int, stale_after_s: float) -> str:
    """ "measure", "duplicate" (a lower trial holds the plan) or "surplus" (the lower trials
    measure `target` plans already) for trial `number` about to measure `key`."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        below = [t for t in study.get_trials(deepcopy=False) if t.number < number]
        undecided = [t for t in below if live(t, stale_after_s) and not any(d in t.user_attrs for d in DECISIONS)]
        if not undecided or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    held = [t for t in below if holds(t, stale_after_s)]
    if any(trial_key(t) == key for t in held):
        return "duplicate"
    if len({trial_key(t) for t in held if t.state != TrialState.WAITING}) >= target:
        return "surplus"
    return "measure"


def held_keys(study: optuna.Study, stale_after_s: float) -> set[str | None]:
    """Plans some trial holds (so a worker does not enqueue them again; None: a trial with no plan key)."""
    return {trial_key(t) for t in study.get_trials(deepcopy=False) if holds(t, stale_after_s)}


def wait_for_others(study: optuna.Study, wait_s: float, stale_after_s: float, log) -> int:
    """Wait (up to `wait_s`) until no other live worker is measuring a plan, so the final ranking
    sees every measurement; returns how many were still running at the end."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        running = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if "key" in t.user_attrs and live(t, stale_after_s)
        ]
        if not running or time.monotonic() > deadline:
            return len(running)
        if not told:
            log(
                f"waiting for {len(running)} trial(s) of other workers: "
                + ", ".join(f"{t.user_attrs['key']} ({t.user_attrs.get('worker', '?')})" for t in running)
            )
            told = True
        time.sleep(0.5)
