"""Several workers, one measured stage: the trial-number order settles who measures what (no plan
twice, budget shared, surplus trials pruned) — first on a study driven by hand, then with two
`autopar search --trials 4` processes started at once on one journal-file storage and run dir."""

from __future__ import annotations

import collections
import re
import socket
import time

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from autopar.measured import claims as claims

K = 4
DIST = {"plan": optuna.distributions.CategoricalDistribution(["a", "b", "c"])}


def test_verdicts_in_trial_order(tmp_path):
    """Seeds enqueued twice (two workers starting together): the lower-numbered trial of a plan
    measures it, the higher one is a duplicate; past the budget, surplus; a dead worker's trial
    holds nothing."""
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(tmp_path / "s.log"))))
    for _ in range(2):  # worker A seeds a, b; worker B, a moment later, the same
        for k in ("a", "b"):
            study.enqueue_trial({"plan": k})
    popped = [study.ask(DIST) for _ in range(4)]  # each queued trial goes to one worker
    assert [(t.number, t.params["plan"]) for t in popped] == [(0, "a"), (1, "b"), (2, "a"), (3, "b")]

    def decide(trial, key, target):
        why = claims.verdict(study, trial.number, key, target=target, stale_after_s=60)
        trial.set_user_attr("key" if why == "measure" else why, key if why == "measure" else True)
        return why

    assert [decide(t, t.params["plan"], target=2) for t in popped] == ["measure", "measure", "duplicate", "duplicate"]
    for t in popped[2:]:
        study.tell(t, state=TrialState.PRUNED)
    late = study.ask(DIST)
    assert claims.verdict(study, late.number, "c", target=2, stale_after_s=60) == "surplus"
    assert claims.verdict(study, late.number, "c", target=3, stale_after_s=60) == "measure"
    assert claims.verdict(study, late.number, "a", target=3, stale_after_s=60) == "duplicate"
    popped[0].set_user_attr("worker", f"{socket.gethostname()}:999999999")  # its process is gone
    assert claims.verdict(study, late.number, "a", target=3, stale_after_s=60) == "measure"


@pytest.mark.distributed
@pytest.mark.slow
def test_two_search_workers_share_the_measured_stage(tmp_path, procs, cli_popen):
    log = tmp_path / "study.log"
    args = [
        "search",
        "--model",
        "tiny",
        "--gpus",
        "2",
        "--gpu",
        "local",
        "--trials",
        str(K),
        "--trial-steps",
        "1",
        "--storage",
        str(log),
        "--study-name",
        "shared",
        "--run-dir",
        "run",
    ]
    workers = []
    try:
        for i in range(2):  # started together: both seed the study, both draw trials
            out, err = open(tmp_path / f"w{i}.out", "w"), open(tmp_path / f"w{i}.err", "w")
            workers.append((cli_popen(args, tmp_path, stdout=out, stderr=err), out, err))
        deadline = time.monotonic() + 240
        for p, _, _ in workers:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p, out, err in workers:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            out.close()
            err.close()
    outs = [(tmp_path / f"w{i}.out").read_text() for i in range(2)]
    for i, (p, _, _) in enumerate(workers):
        assert p.returncode == 0, (tmp_path / f"w{i}.err").read_text()[-3000:]

    study = optuna.load_study(study_name="shared-measured", storage=JournalStorage(JournalFileBackend(str(log))))
    trials = study.get_trials(deepcopy=True)
    measured = [t for t in trials if "key" in t.user_attrs]
    keys = collections.Counter(t.user_attrs["key"] for t in measured)
    assert len(keys) == K and set(keys.values()) == {1}, f"a plan measured twice: {keys}"
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in measured), [t.state for t in measured]
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    for t in trials:
        if "key" not in t.user_attrs and t.state != TrialState.WAITING:
            assert t.state == TrialState.PRUNED and ("duplicate" in t.user_attrs or "surplus" in t.user_attrs)
    assert len({t.user_attrs["worker"] for t in measured}) == 2, "one worker measured everything"

    docs = {p.stem for p in (tmp_path / "run" / "trials").glob("*.json")}
    assert docs == set(keys)  # every worker's measurement in the one run directory
    # each worker ranked all K measurements, and both name the same winner
    summaries = [re.search(r"Measured stage: (\d+) plans trialled", o) for o in outs]
    assert [int(m.group(1)) for m in summaries if m] == [K, K], outs
    winners = [re.search(r"Winner \(fastest measured that fitted\): (\S+)", o).group(1) for o in outs]
    assert winners[0] == winners[1] and winners[0] in keys
    assert not procs(str(tmp_path))
