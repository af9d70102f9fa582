"""The winner's pipeline, stage by stage, as plain pandas frames: its estimate re-priced from the
run's question with every pipeline rank costed (autopar.calibration.estimate.estimate, the per-stage
figures a search does not keep), each stage's memory, where each stage's step goes (the timeline)
and the `autopar export` commands that write the winner's launch files.

The timeline is the cost model's own schedule (autopar.cost.step.assemble_step), not a second one:
every stage runs its m microbatches at its own time per microbatch, the pipeline runs at the pace of
its slowest stage for m * pace / (1 - bubble fraction) seconds (the bubble: autopar.cost.pipeline),
so a stage idles for the bubble and, if it is faster than the slowest, for m * (pace - its time);
then the tail the step adds after the pipeline (the exposed DP communication, the TP per-step
reductions and the optimizer step, of the rank with the longest tail).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from autopar.calibration.estimate import Estimate, estimate
from autopar.errors import InputError
from autopar.figures import (
    MEMORY_BYTES,
    MEMORY_GIB,
    MEMORY_RANK,
    PACE_RANK,
    PEAK_MEMORY_BYTES,
    STEP_TIME_S,
    TIME_TP_PER_STEP,
)
from autopar.report.compare import question_from_search
from autopar.report.run_data import RunData
from autopar.spec.hardware import GIB
from autopar.spec.plan import ParallelPlan
from autopar.spec.trainers import TRAINERS

#: the timeline's parts, in the order they are drawn, and how they read
TIMELINE_LABELS = {
    "forward": "forward",
    "backward": "backward (with any recomputed forward)",
    "waiting": "waits for the slowest stage",
    "bubble": "pipeline bubble",
    "dp": "DP comm (exposed)",
    "tp_step": "TP per-step reductions",
    "optimizer": "optimizer step",
}
#: the parts of the pipeline (the rest follow it)
PIPELINE_PARTS = ("forward", "backward", "waiting", "bubble")

#: forward FLOPs as a share of a microbatch's without recomputation: forward + backward = 3 x
#: forward (Megatron's convention, autopar.cost.flops)
FORWARD_SHARE_NO_RECOMPUTE = 1.0 / 3.0


@dataclass(frozen=True)
class WinnerStages:
    """The winner's estimate with every pipeline rank costed."""

    entry: dict  # top.json's first entry
    estimate: Estimate
    #: the estimate reproduces top.json's step time and peak memory (False: the run was priced by a
    #: cost model other than this one, whose figures the stages then are)
    same_as_run: bool


def winner_stages(run: RunData) -> WinnerStages | None:
    """The winner of the run re-estimated from its question; None where nothing fits or top.json
    or search.json cannot say the plan or the question."""
    entries = run.top.get("top")
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        return None
    entry = entries[0]
    try:
        q = question_from_search(run.search, f"'{Path(run.run_dir) / 'search.json'}'")
        plan = ParallelPlan.from_dict(entry["plan"])
    except (InputError, KeyError, TypeError, ValueError):
        return None
    est = estimate(
        plan, q.model, q.cluster, num_gpus=q.num_gpus, seq_len=q.seq_len, routing_imbalance=q.routing_imbalance
    )
    if not est.valid:  # top.json edited since the search: no schedule to draw
        return None
    same = all(
        isinstance(entry.get(k), (int, float)) and abs(getattr(est, k) - entry[k]) <= 1e-9 * abs(entry[k])
        for k in (STEP_TIME_S, PEAK_MEMORY_BYTES)
    )
    return WinnerStages(entry=entry, estimate=est, same_as_run=same)


def stage_memory(est: Estimate) -> pd.DataFrame:
    """One row per pipeline stage: its layers, parameters, peak memory per GPU (bytes and GiB) and
    time per microbatch, and whether it is the most loaded rank or the one that sets the pace."""
    stages = est.extra["stages"]
    df = pd.DataFrame(
        {
            "stage": [int(s["rank"]) for s in stages],
            "layers": [int(s["layers"]) for s in stages],
            "params": [float(s["params"]) for s in stages],
            MEMORY_BYTES: [float(s[MEMORY_BYTES]) for s in stages],
            "time_per_mb_s": [float(s["time_per_mb_s"]) for s in stages],
        }
    )
    df[MEMORY_GIB] = df[MEMORY_BYTES] / GIB
    df["capacity_gib"] = est.memory_capacity_bytes / GIB
    df["share_of_capacity"] = df[MEMORY_BYTES] / est.memory_capacity_bytes
    df["label"] = [f"stage {r} ({n} layers)" for r, n in zip(df["stage"], df["layers"])]
    df["role"] = [_role(r, est) for r in df["stage"]]
    return df


def _role(rank: int, est: Estimate) -> str:
    roles = []
    if rank == int(est.extra.get(MEMORY_RANK, -1)):
        roles.append("most memory")
    if rank == int(est.extra.get(PACE_RANK, -1)) and est.plan.pp > 1:
        roles.append("sets the pace")
    return ", ".join(roles)


def forward_share(est: Estimate) -> float:
    """The forward's share of a microbatch's time, by FLOPs: the model FLOPs are 3 x forward and the
    hardware FLOPs add the recomputed forward (HFU / MFU = hardware / model FLOPs, the same
    accounting: autopar.cost.columns), so forward / all = MFU / (3 HFU); 1/3 without recomputation,
    the split the cost model's DP overlap uses (autopar.cost.step.dp_exposed)."""
    if est.hfu > 0 and est.mfu > 0:
        return est.mfu / (3.0 * est.hfu)
    return FORWARD_SHARE_NO_RECOMPUTE


def timeline(est: Estimate) -> pd.DataFrame:
    """One row per pipeline stage, one column (seconds) per part of its step (TIMELINE_LABELS),
    each stage's parts adding up to the step time; plus `start_<part>` (where the part begins, from
    the step's start), `pipeline_s` and `step_s`."""
    m = est.num_microbatches
    stages = est.extra["stages"]
    per_mb = [float(s["time_per_mb_s"]) for s in stages]
    pace = max(per_mb)
    f = est.bubble_fraction
    pipeline = m * pace / (1.0 - f)
    fwd = forward_share(est)
    tail = {
        "dp": est.time_s["dp"],
        "tp_step": float(est.extra.get(TIME_TP_PER_STEP, 0.0)),
        "optimizer": est.time_s["optimizer"],
    }
    rows = []
    for s, t in zip(stages, per_mb):
        parts: dict[str, float] = {
            "forward": m * t * fwd,
            "backward": m * t * (1.0 - fwd),
            "waiting": m * (pace - t),
            "bubble": f * pipeline,
            **tail,
        }
        starts, start = {}, 0.0
        for part in TIMELINE_LABELS:
            starts[f"start_{part}"] = start
            start += parts[part]
        rank = int(s["rank"])
        rows.append(
            {"stage": rank, "label": f"stage {rank}", **parts, **starts, "pipeline_s": pipeline, "step_s": start}
        )
    return pd.DataFrame(rows)


def export_commands(run: RunData, stages: WinnerStages) -> list[tuple[str, str]]:
    """(trainer, command) of `autopar export` for the winner (rank 1 of the run directory), one per
    trainer that runs it, its ranked trainer first: --to names the trainer's format (the export
    formats of the trainers carry the trainers' names: autopar/export/registry.py)."""
    own = str(stages.entry.get("trainer") or stages.estimate.plan.trainer)
    listed = stages.entry.get("trainers")
    others = [t for t in listed if isinstance(t, str) and t != own] if isinstance(listed, list) else []
    run_dir = str(Path(run.run_dir).resolve())
    return [
        (t, shlex.join(["autopar", "export", "--run", run_dir, "--rank", "1", "--to", t]))
        for t in [own, *others]
        if t in TRAINERS
    ]
