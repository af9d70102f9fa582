"""The measured stage of `autopar search --trials K` (Optuna): a study
in the run directory (SQLite `trials.db`, or any --storage) seeded with the analytic top-K through
`enqueue_trial`; each Optuna trial measures one plan for real through a `measure(plan, predicted,
on_step)` callable (the CLI wires autopar.measured.measure: this layer imports no torch). The running
trial streams its per-step times: each is reported to Optuna as it ends and the pruner
(MedianPruner, after the K seeded trials) is asked at once, so a plan whose first steps are already
slower than the finished trials' median is killed mid-run and recorded as pruned with the steps it
ran. While `budget` remains the sampler proposes further plans among the analytic plans that fit.
Results are trial JSON files (`trials/<key>.json`) and user attributes (the same document).

Machines smaller than the plans (autopar.measured.proxy, wired by the CLI): `runnable(plan, predicted)`
says why a plan cannot be trialled here (None: it can, as is or as a scaled-down proxy). The top-K
seeds are the first K plans of the ranking that can run; those of the top K that cannot are
recorded as trial files with status "not-runnable" and the reason (no Optuna trial: they use no
budget), and a sampler proposal that cannot run is pruned (`not_runnable`). When no plan of the
search can run here, the stage refuses (InputError) with the best plan's reason. Proxy trials
measured on other hardware than the plans' (a CPU proxy of a GPU plan) are ranked and compared
with the prediction (scaled back, labelled) but left out of the calibration fit, which would
otherwise fit the GPU profile to CPU timings.

Resume: a rerun finds the study; trials left RUNNING by a dead process are failed (fail_stale) and
their plans rerun; finished plans are kept. Between rounds (`rounds`), the cost model is refitted
to the measurements (autopar.calibration.calibrate) and the untried plans re-ranked and enqueued. Several
workers can share the study (autopar.measured.claims): no plan is measured twice, the budget is
shared, and each worker's final ranking covers all workers' measurements.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autopar.calibration.calibrate import Calibration
from autopar.calibration.uncertainty import interval_fields
from autopar.errors import InputError
from autopar.figures import INTERVAL, LOW, MFU, PEAK_MEMORY_BYTES, STEP_TIME_S, SUPPORT, TOKENS_PER_S
from autopar.measured import claims
from autopar.measured.calibration import calibrate_docs, evaluate_with
from autopar.measured.order import diverse, unresolved_first
from autopar.search import optuna_driver as od
from autopar.search.results import ranked, row_plan
from autopar.search.run import SearchResult
from autopar.spec.hardware import GIB
from autopar.spec.plan import ParallelPlan

STUDY = "measured"
NOT_RUNNABLE = "not-runnable"
#: measure(plan, predicted, on_step) -> trial document; on_step(index, step_time_s) -> stop?
Measure = Callable[[dict, dict, Callable[[int, float], bool]], dict]
#: runnable(plan, predicted) -> why the plan cannot be trialled here, or None
Runnable = Callable[[dict, dict], "str | None"]
#: most not-runnable plans a refusal or a log line names
NAMED = 3


def plan_key(plan: dict) -> str:
    """A short, file-name-safe key of a plan: axes, schedule, micro-batch, ZeRO, recompute."""
    p = ParallelPlan.from_dict(plan)
    return (
        f"tp{p.tp}.pp{p.pp}.v{p.vpp}.dp{p.dp}.cp{p.cp}.ep{p.ep}.{p.pp_schedule}.mb{p.micro_batch_size}"
        f".z{p.zero_stage}.{p.recompute}.{p.dtype}" + (".sp" if p.sequence_parallel else "")
    )


def candidates(result: SearchResult, df=None) -> dict[str, dict]:
    """Every distinct plan that fits, fastest predicted first: key -> {plan, predicted} (ZeRO stages
    folded to 0 where dp*cp = 1, where they are one plan)."""
    out: dict[str, dict] = {}
    for _, row in ranked(result.plans if df is None else df).iterrows():
        plan = row_plan(row, result.layouts).to_dict()
        if plan["dp"] * plan["cp"] == 1:
            plan["zero_stage"] = 0  # one data-parallel rank: ZeRO stages are the same plan; run it plainly
        out.setdefault(
            plan_key(plan),
            {
                "plan": plan,
                "predicted": {
                    STEP_TIME_S: float(row[STEP_TIME_S]),
                    PEAK_MEMORY_BYTES: float(row[PEAK_MEMORY_BYTES]),
                    TOKENS_PER_S: float(row[TOKENS_PER_S]),
                    MFU: float(row[MFU]),
                }
                | _interval(row),
            },
        )
    return out


def _interval(row) -> dict:
    """The step time's 80 % interval and the support of a candidate (autopar.calibration.uncertainty)."""
    if LOW[STEP_TIME_S] not in row.index:
        return {}
    f = interval_fields(row)
    return {INTERVAL[STEP_TIME_S]: f[INTERVAL[STEP_TIME_S]], SUPPORT: f[SUPPORT]}


@dataclass
class MeasuredStage:
    docs: dict[str, dict]  # key -> trial document (latest)
    order: list[str]  # keys in measurement order
    summary: dict = field(default_factory=dict)
    calibration: Calibration | None = None


def _done(study: optuna.Study) -> dict[str, optuna.trial.FrozenTrial]:
    """Measured plans (completed, pruned mid-run, or failed as data), by key."""
    return {t.user_attrs["key"]: t for t in study.get_trials(deepcopy=False) if claims.measured(t)}


def _enqueue(study: optuna.Study, keys: list[str], stale_after_s: float) -> None:
    held = claims.held_keys(study, stale_after_s)
    for k in keys:
        if k not in held:
            study.enqueue_trial({"plan": k}, user_attrs={"seeded": True})


def _open_study(run_dir: Path, storage: str | None, study_name: str | None, seed: int | None, k: int) -> optuna.Study:
    """The stage's study (created, or found by a rerun or another worker): `trials.db` in the run
    directory, or `storage`; the pruner starts after the k seeded trials."""
    url = storage or f"sqlite:///{run_dir / 'trials.db'}"
    # a shared storage holds many runs: the study is named after --study-name, else the run
    name = STUDY if storage is None else f"{study_name or run_dir.name}-{STUDY}"
    return optuna.create_study(
        storage=od.open_storage(url),
        study_name=name,
        load_if_exists=True,
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=k, n_warmup_steps=1),
    )


@od.quiet_optuna()
def run_measured(
    result: SearchResult,
    measure: Measure,
    k: int,
    budget: int | None = None,
    rounds: int = 1,
    storage: str | None = None,
    seed: int | None = 0,
    log: Callable[[str], None] = print,
    study_name: str | None = None,
    stale_after_s: float = 3600.0,
    wait_s: float = 600.0,
    runnable: Runnable | None = None,
) -> MeasuredStage:
    """Measure the analytic top-k (then sampler proposals up to `budget`), for `rounds` rounds.
    `measure(plan, predicted, on_step)` runs one plan; `on_step(index, step_time_s)` reports each
    timed step as it ends and returns True when the pruner says stop. Several workers may run this
    at once on one `storage` (see autopar.measured.claims); at the end each waits up to
    `wait_s` for the others' running trials, so every worker ranks every measurement."""
    run_dir = Path(result.run_dir)
    trials_dir = run_dir / "trials"
    cands = candidates(result)
    keys = sorted(cands)  # the categorical choices: fixed for the life of the study
    study = _open_study(run_dir, storage, study_name, seed, k)
    stale = od.fail_stale(study, older_than_s=stale_after_s)
    if stale:
        log(f"measured stage: {stale} interrupted trial(s) of a dead process failed; their plans rerun")
    budget = max(budget or k, k)
    ranking = unresolved_first(diverse(list(cands), cands), cands)

    @functools.cache  # asked once per plan
    def cannot(kk: str) -> str | None:
        return None if runnable is None else runnable(cands[kk]["plan"], cands[kk]["predicted"])

    calib = None
    for rnd in range(rounds):
        target = min(budget * (rnd + 1), len(keys))
        seeds = _seeds(study, ranking, k, cannot, cands, trials_dir, log)
        _enqueue(study, seeds, stale_after_s)
        attempts = 0
        while len(_done(study)) < target and attempts < 4 * target:
            attempts += 1
            trial = study.ask({"plan": optuna.distributions.CategoricalDistribution(keys)})
            trial.set_user_attr("worker", od.WORKER)
            key = trial.params["plan"]
            if cannot(key):  # a sampler proposal this machine cannot run: no budget used
                trial.set_user_attr("not_runnable", cannot(key))
                study.tell(trial, state=TrialState.PRUNED)
                continue
            why = claims.verdict(study, trial.number, key, target, stale_after_s)
            if why != "measure":  # another trial holds the plan, or the budget is spent
                trial.set_user_attr(why, True)
                study.tell(trial, state=TrialState.PRUNED)
                if why == "surplus":
                    break
                continue
            trial.set_user_attr("key", key)
            _measure_one(study, trial, key, cands[key], measure, rnd, trials_dir, log)
        claims.wait_for_others(study, wait_s, stale_after_s, log)
        docs = sync_docs(study, trials_dir)
        order = [kk for kk, _ in sorted(_done(study).items(), key=lambda kv: kv[1].number)]
        calib = calibrate_docs(result, [docs[kk] for kk in order if kk in docs])
        if calib is not None and rnd < rounds - 1:
            ranking = list(candidates(result, evaluate_with(result, calib)))  # calibrated order, untried first
            log(
                f"round {rnd + 1}: recalibrated; next untried by the calibrated model: "
                + ", ".join(kk for kk in ranking if kk not in _done(study))[:300]
            )
    docs = sync_docs(study, trials_dir)
    order = [kk for kk, _ in sorted(_done(study).items(), key=lambda kv: kv[1].number)]
    return MeasuredStage(docs=docs, order=order, calibration=calib)


def _mib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def _seeds(
    study: optuna.Study,
    ranking: list[str],
    k: int,
    cannot: Callable[[str], str | None],
    cands: dict[str, dict],
    trials_dir: Path,
    log: Callable[[str], None],
) -> list[str]:
    """The first k plans of the ranking not measured yet that can run here. Those of the top k that
    cannot are recorded as "not-runnable" trial files; none at all is an InputError."""
    from autopar.search.run_dir import write_trial_doc

    done = _done(study)
    todo = [kk for kk in ranking if kk not in done]
    seeds: list[str] = []
    skipped: list[str] = []
    for kk in todo:
        if len(seeds) == k:
            break
        why = cannot(kk)
        if why:
            skipped.append(kk)
        else:
            seeds.append(kk)
    if todo and not seeds and not done:
        raise InputError(
            f"none of the {len(ranking)} plans that fit can be trialled here; the best, {todo[0]}: {cannot(todo[0])}"
        )
    top = [kk for kk in todo[:k] if kk in skipped]
    for kk in top:
        doc = {
            "key": kk,
            "name": ParallelPlan.from_dict(cands[kk]["plan"]).describe(),
            "plan": cands[kk]["plan"],
            "predicted": cands[kk]["predicted"],
            "kind": NOT_RUNNABLE,
            "status": NOT_RUNNABLE,
            "outcome": NOT_RUNNABLE,
            "reasons": [cannot(kk)],
            "measured": {},
            "pruned": False,
        }
        write_trial_doc(doc, trials_dir)
        log(
            f"not runnable here: {kk} (#{ranking.index(kk) + 1} predicted, {cands[kk]['predicted'][STEP_TIME_S]:.3f} "
            f"s/step): {cannot(kk)}"
        )
    if skipped:
        log(
            f"measured instead: the {len(seeds)} best plan(s) that can run here"
            + (f", after {len(skipped)} that cannot" if len(skipped) > len(top) else "")
            + (": " + ", ".join(seeds) if seeds else "")
        )
    return seeds


def _measure_one(
    study: optuna.Study,
    trial: optuna.Trial,
    key: str,
    cand: dict,
    measure: Measure,
    rnd: int,
    trials_dir: Path,
    log: Callable[[str], None],
) -> None:
    """Run one plan, reporting its steps to the pruner as they end, and record the outcome."""
    reported: set[int] = set()

    def on_step(index: int, step_time_s: float) -> bool:
        trial.report(step_time_s, index)  # persisted in the storage as it happens
        reported.add(index)
        return trial.should_prune()

    log(f"trial {trial.number}: {key} (predicted {cand['predicted'][STEP_TIME_S]:.3f} s/step)")
    doc = measure(cand["plan"], cand["predicted"], on_step) | {
        "key": key,
        "optuna_trial": trial.number,
        "round": rnd,
        "worker": od.WORKER,
    }
    _tell(study, trial, doc, trials_dir, reported)
    m = doc.get("measured") or {}
    proxy = doc.get("proxy") or {}
    if proxy:
        log(f"  proxy ({proxy.get('nproc')} ranks): {proxy.get('summary', '')}")
    tag = " (proxy, scaled back)" if proxy else ""
    if doc["status"] == "pruned":
        log(
            f"  -> pruned after {m.get('steps_run', 0)} timed step(s)"
            + (f", {m[STEP_TIME_S]:.3f} s/step so far{tag}" if m else "")
        )
    elif doc["status"] == "ok" and m:
        own = m.get("proxy") or {}
        log(
            f"  -> ok {m[STEP_TIME_S]:.3f} s/step"
            + (f", peak {_mib(m[PEAK_MEMORY_BYTES])}/rank{tag}" if PEAK_MEMORY_BYTES in m else tag)
            + (
                f"; the proxy itself: {own[STEP_TIME_S]:.3f} s/step measured vs {own['predicted_step_time_s']:.3f} "
                f"predicted here, {_mib(own[PEAK_MEMORY_BYTES])} vs {_mib(own['predicted_peak_memory_bytes'])}/rank"
                if own.get(STEP_TIME_S)
                else ""
            )
        )
    else:
        log(f"  -> {doc['status']}{tag}: {'; '.join(doc.get('reasons', []))[:200]}")


def _tell(study: optuna.Study, trial: optuna.Trial, doc: dict, trials_dir: Path, reported: set[int]) -> None:
    """Report the steps not streamed live, record the document (trial file, then user attribute:
    the whole document but its command line), finish the trial: COMPLETE, PRUNED (stopped
    mid-run, its partial step times kept) or FAIL (a failure recorded as data)."""
    from autopar.search.run_dir import write_trial_doc

    m = doc.get("measured") or {}
    attrs = {k: v for k, v in doc.items() if k != "command"}
    if doc["status"] not in ("ok", "pruned") or not m:
        doc["pruned"] = False
        write_trial_doc(doc, trials_dir)
        trial.set_user_attr("failure", attrs | {"pruned": False})
        study.tell(trial, state=TrialState.FAIL)
        return
    for i, t in enumerate(m["step_times_s"]):
        if i not in reported:
            trial.report(t, i)
    doc["pruned"] = doc["status"] == "pruned"
    if doc["pruned"]:
        doc["reasons"] = list(doc.get("reasons", [])) + [
            "the median pruner: its first steps were slower than the median of the finished trials at the same step"
        ]
    write_trial_doc(doc, trials_dir)
    trial.set_user_attr("result", attrs | {"pruned": doc["pruned"], "reasons": doc.get("reasons", [])})
    if doc["pruned"]:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, m[STEP_TIME_S])


def sync_docs(study: optuna.Study, trials_dir: Path) -> dict[str, dict]:
    """The trial documents of the run: the files in `trials_dir`, completed by the documents other
    workers recorded in the study (written here, so the run directory holds every measurement)."""
    from autopar.search.run_dir import write_trial_doc

    docs = load_docs(trials_dir)
    for key, t in _done(study).items():
        doc = t.user_attrs.get("result") or t.user_attrs.get("failure") or {}
        if key not in docs and isinstance(doc.get("plan"), dict) and doc.get("key") == key:
            write_trial_doc(doc, trials_dir)
            docs[key] = doc
    return docs


def load_docs(trials_dir: Path) -> dict[str, dict]:
    """The trial documents of `trials_dir` by key (autopar.search.run_dir.read_trial: a file that
    cannot be read or used, or has no key, is left out)."""
    from autopar.search.run_dir import read_trial

    out = {}
    for p in sorted(Path(trials_dir).glob("*.json")):
        d, _ = read_trial(p)
        if d is not None and d.get("key"):
            out[d["key"]] = d
    return out
