"""Pruning mid-run: the running trial streams its step times, the measured stage reports each to
Optuna as it ends, and a plan the median pruner judges slower is killed before its last step,
recorded as pruned with the steps it ran (trial file and user attributes), with no process left."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from autopar.measured.launcher import ProgressReader
from autopar.measured.measure import measure_plan
from autopar.measured.results import acceptance
from autopar.measured.trials import STUDY, plan_key, run_measured
from autopar.search.run import SearchOptions, run_search
from autopar.search.scenarios import global_batch
from autopar.search.space import load_space
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

STEPS = 6  # timed steps a trial would run; the slow one must stop well before


def _result(tmp_path):
    space = load_space("local")
    q = Question(
        model=get_preset("tiny"),
        num_gpus=2,
        cluster=default_cluster("local"),
        seq_len=128,
        global_batch_size=global_batch(space, 128, None),
    )
    return run_search(q, SearchOptions(space=space, run_dir=tmp_path / "run"))


def test_progress_reader_waits_for_whole_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    reader = ProgressReader(path)
    assert reader.read() == []  # not written yet
    path.write_text('{"step": 0, "time_s": 0.5}\n{"step": 1, "ti')
    assert reader.read() == [{"step": 0, "time_s": 0.5}]
    with open(path, "a") as f:
        f.write('me_s": 0.25}\n')
    assert reader.read() == [{"step": 1, "time_s": 0.25}]
    assert reader.read() == []


def test_slow_plan_is_pruned_mid_run(local_env, tmp_path, procs):
    """K = 1 seeded trial (a stand-in that streams fast steps) completes; the sampler's next plan runs
    for real with every step 1 s slower (`--fault slow`): the pruner stops it after its second
    timed step (MedianPruner's one warm-up step), the torchrun group is killed, and the partial
    step times are kept."""
    result = _result(tmp_path)
    work = tmp_path / "slow-work"
    docs: list[dict] = []

    def measure(plan, predicted, on_step):
        if not docs:  # the fast seeded plan: streamed steps, then a complete document
            times = [0.05] * STEPS
            assert not any(on_step(i, t) for i, t in enumerate(times))  # within the startup trials: never pruned
            doc = {
                "name": "fast",
                "plan": plan,
                "predicted": predicted,
                "status": "ok",
                "outcome": "ok",
                "reasons": [],
                "measured": {
                    "step_time_s": 0.05,
                    "step_times_s": times,
                    "peak_memory_bytes": predicted["peak_memory_bytes"],
                },
            }
        else:
            doc = measure_plan(
                "tiny",
                plan,
                2,
                predicted=predicted,
                steps=STEPS,
                seq_len=128,
                timeout_s=120,
                workdir=work,
                worker_args=["--fault", "slow"],
                on_step=on_step,
            )
        docs.append(doc)
        return doc

    stage = run_measured(result, measure, k=1, budget=2, log=lambda s: None)
    assert len(docs) == 2
    slow = docs[1]
    assert slow["status"] == "pruned", (slow["outcome"], slow["reasons"])
    m = slow["measured"]
    assert 2 <= m["steps_run"] < STEPS and len(m["step_times_s"]) == m["steps_run"] and m["partial"]
    assert min(m["step_times_s"]) > 1.0  # the injected second per step: these are the slow plan's steps
    assert not (work / "result.json").exists()  # killed before its timed trial finished
    assert not procs(str(work)), procs(str(work))  # torchrun and its workers are gone

    # persisted: the trial file and the Optuna trial (state, intermediate values, the document)
    key = plan_key(slow["plan"])
    on_disk = json.loads((result.run_dir / "trials" / f"{key}.json").read_text())
    assert on_disk["status"] == "pruned" and on_disk["pruned"] is True
    assert on_disk["measured"]["step_times_s"] == m["step_times_s"]
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{result.run_dir / 'trials.db'}")
    [t] = [t for t in study.trials if t.user_attrs.get("key") == key]
    assert t.state == TrialState.PRUNED
    assert t.intermediate_values == dict(enumerate(m["step_times_s"]))
    assert t.user_attrs["result"]["measured"]["step_times_s"] == m["step_times_s"]
    figs = acceptance(result, stage)
    assert figs["pruned"] == 1 and figs["pruned_after_steps"] == {key: m["steps_run"]}
    assert figs["succeeded"] == 1 and figs["failed"] == 0 and figs["winner"]["key"] != key
