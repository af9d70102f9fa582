"""Enumerate every plan of a search space for a model on N GPUs, as one PlanTable (vectorised).

The product of the knob choices is built with numpy index grids, then made canonical so that no
plan appears twice (pp = 1 has one schedule; vpp > 1 means interleaved 1F1B; sequence parallelism
follows tp; expert knobs only for MoE models; layout variants only where they differ). Layouts whose
tp*pp*cp does not divide the GPU count are not plans at all and are not enumerated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.errors import InputError
from autopar.search.space import SearchSpace
from autopar.spec.hardware import ClusterSpec
from autopar.spec.layout import auto_layout, balanced_layout
from autopar.spec.model import ModelSpec
from autopar.spec.table import DISPATCHER, DTYPE, RECOMP, SCHED, TRAINER, PlanTable
from autopar.spec.trainers import TRAINERS

DEFAULT_EP_LIMIT = 64


@dataclass
class Question:
    """What the user asked: model, GPUs, cluster, sequence length, global batch, and the trainers
    the plans must run on (all of them unless `--trainer` says)."""

    model: ModelSpec
    num_gpus: int
    cluster: ClusterSpec
    seq_len: int
    global_batch_size: int
    trainers: tuple[str, ...] = TRAINERS


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _int_choices(space: SearchSpace, knob: str, default: list[int]) -> list[int]:
    v = space.knobs.get(knob, default)
    return sorted(set(v))


def ep_choices(space: SearchSpace, model: ModelSpec) -> list[int]:
    if model.moe is None:
        return [1]
    limit = space.constraints.get("ep_within", DEFAULT_EP_LIMIT)
    v = space.knobs.get("ep", "auto")
    if v == "auto":
        return [d for d in divisors(model.moe.num_experts) if d <= limit]
    return sorted(x for x in set(v) if x <= limit)


def space_size(space: SearchSpace, q: "Question") -> int:
    """Upper bound of the number of plans: the product of every axis's choices, before
    canonicalisation (what `run_search` compares with --max-exhaustive)."""
    return int(np.prod([len(v) for v in knob_choices(space, q).values()], dtype=np.float64))


#: the product axes, in order; values are what `knob_choices` returns for each
AXES = ("tp", "pp", "cp", "sched_vpp", "ep", "etp", "zero", "mbs", "recompute", "recompute_layers", "dtype",
        "tp_comm_overlap", "sp", "pp_layout", "moe_dispatcher", "ep_comm_overlap", "trainer")


def knob_choices(space: SearchSpace, q: Question) -> dict[str, list]:
    """The choices of every product axis after the space's constraints. `sched_vpp` holds
    (schedule code, vpp) pairs; `etp` 0 stands for "= tp"; `pp_layout` holds layout rule names."""
    model = q.model
    k = space.knobs
    cons = space.constraints
    tp = [t for t in _int_choices(space, "tp", [1]) if not cons.get("tp_within_node") or t <= q.cluster.gpus_per_node]
    sched_vpp = [(SCHED[s], 1) for s in dict.fromkeys(k.get("pp_schedule", ["1f1b"])) if s != "interleaved-1f1b"]
    sched_vpp += [(SCHED["interleaved-1f1b"], v) for v in _int_choices(space, "vpp", [1]) if v > 1]
    etp_raw = k.get("etp", ["tp"]) if model.moe else ["tp"]
    if etp_raw == "auto":  # Megatron's default (= tp) and expert-TP folding (1)
        etp_raw = ["tp", 1]
    sp_knob = k.get("sp", "auto")
    return {
        "tp": [t for t in tp if t <= cons.get("max_tp", t)],
        "pp": [p for p in _int_choices(space, "pp", [1]) if p <= cons.get("max_pp", p)],
        "cp": [c for c in _int_choices(space, "cp", [1]) if c <= cons.get("max_cp", c)],
        "sched_vpp": sched_vpp or [(SCHED["1f1b"], 1)],
        "ep": ep_choices(space, model),
        "etp": sorted({0 if e == "tp" else int(e) for e in etp_raw}),
        "zero": _int_choices(space, "zero", [1]),
        "mbs": _int_choices(space, "mbs", [1]),
        "recompute": sorted({RECOMP[r] for r in k.get("recompute", ["none"])}),
        "recompute_layers": [-1] + sorted(set(k.get("recompute_layers", []))),
        "dtype": sorted({DTYPE[d] for d in k.get("dtype", ["bf16"])}),
        "tp_comm_overlap": sorted(set(k.get("tp_comm_overlap", [False]))),
        "sp": [True, False] if sp_knob == "auto" else sorted(set(sp_knob)),
        "pp_layout": ["auto"] + [x for x in dict.fromkeys(k.get("pp_layout", ["auto"])) if x != "auto"],
        "moe_dispatcher": sorted({DISPATCHER[d] for d in k.get("moe_dispatcher", ["alltoall"])}) if model.moe else [0],
        "ep_comm_overlap": sorted(set(k.get("ep_comm_overlap", [False]))) if model.moe else [False],
        "trainer": [TRAINER[t] for t in q.trainers if t in k.get("trainer", q.trainers)],
    }


def build_table(space: SearchSpace, q: Question, values: dict[str, np.ndarray], choices: dict[str, list]) -> PlanTable:
    """Plans from per-axis value arrays (indices into `choices`), keeping only canonical rows:
    tp*pp*cp divides the GPUs, pp = 1 has one schedule, recompute layers only with full
    recompute, TP overlap needs TP, SP follows tp (when 'auto'), layout variants need a pipeline
    and differ from the auto layout, expert knobs only for MoE."""
    G = q.num_gpus
    col = {a: np.asarray(choices[a], dtype=object if a in ("sched_vpp", "pp_layout") else None)[values[a]]
           for a in AXES if a not in ("sched_vpp", "pp_layout")}
    sv = np.asarray(values["sched_vpp"])
    sched = np.array([x[0] for x in choices["sched_vpp"]])[sv]
    vpp = np.array([x[1] for x in choices["sched_vpp"]])[sv]
    t, p, c = col["tp"], col["pp"], col["cp"]
    et = np.where(col["etp"] == 0, t, col["etp"])
    lo = np.asarray(values["pp_layout"])
    keep = (G % (t * p * c) == 0)
    keep &= ~((p == 1) & ((sched != SCHED["1f1b"]) | (vpp > 1)))
    keep &= (col["recompute_layers"] < 0) | (col["recompute"] == RECOMP["full"])
    keep &= ~((t == 1) & col["tp_comm_overlap"].astype(bool))
    keep &= ~((col["ep"] == 1) & (col["ep_comm_overlap"].astype(bool) | (col["moe_dispatcher"] != 0)))
    if space.knobs.get("sp", "auto") == "auto":
        keep &= col["sp"].astype(bool) == (t > 1)
    keep &= ~((p == 1) & (lo > 0))
    if not q.model.moe:
        keep &= et == t
    layout_list, layout_id = _layout_ids(q.model, choices["pp_layout"], p, vpp, lo)
    keep &= layout_id >= -1
    # the same plan reached through different choices (etp "tp" and 1 at tp 1, ...) counts once
    key = np.stack([t, p, c, sched, vpp, col["ep"], et, col["zero"], col["mbs"], col["recompute"],
                    col["recompute_layers"], col["dtype"], col["tp_comm_overlap"].astype(np.int64),
                    col["sp"].astype(np.int64), layout_id, col["moe_dispatcher"],
                    col["ep_comm_overlap"].astype(np.int64), col["trainer"]], axis=1)
    _, first = np.unique(np.where(keep[:, None], key, -3), axis=0, return_index=True)
    keep &= np.isin(np.arange(len(t)), first)
    idx = np.flatnonzero(keep)
    table = PlanTable.from_columns(
        layout_list, tp=t, pp=p, dp=G // (t * p * c), cp=c, ep=col["ep"], etp=et, vpp=vpp, zero_stage=col["zero"],
        micro_batch_size=col["mbs"], global_batch_size=np.full(len(t), q.global_batch_size), schedule=sched,
        recompute=col["recompute"], recompute_layers=col["recompute_layers"], dtype=col["dtype"],
        tp_comm_overlap=col["tp_comm_overlap"], sequence_parallel=col["sp"], layout_id=layout_id,
        moe_dispatcher=col["moe_dispatcher"], ep_comm_overlap=col["ep_comm_overlap"], trainer=col["trainer"])
    return table.take(idx)


def enumerate_plans(space: SearchSpace, q: Question) -> PlanTable:
    """Every canonical plan of the space (the product of all choices, vectorised)."""
    choices = knob_choices(space, q)
    if not all(choices.values()):
        raise InputError("the search space is empty after its constraints; widen the knob choices")
    grids = np.meshgrid(*[np.arange(len(choices[a])) for a in AXES], indexing="ij")
    table = build_table(space, q, {a: g.ravel() for a, g in zip(AXES, grids)}, choices)
    if len(table) == 0:
        raise InputError(f"no layout of the search space divides {q.num_gpus} GPUs (tp*pp*cp must divide the GPU "
                         f"count); change --gpus or widen the space")
    return table


def _layout_ids(model: ModelSpec, layouts: list[str], pp: np.ndarray, vpp: np.ndarray, choice: np.ndarray):
    """Layout ids per row: -1 auto; an index into the returned list; -2 when the variant equals
    the auto layout (a duplicate row, dropped)."""
    out = np.full(len(pp), -1, dtype=np.int64)
    layout_list = []
    for ci, name in enumerate(layouts):
        if name == "auto":
            continue
        rows = choice == ci
        for pv in {(int(a), int(b)) for a, b in zip(pp[rows], vpp[rows])}:
            n = pv[0] * pv[1]
            lay = balanced_layout(model.num_layers, n, embedding_as_layer=name == "embedding+loss",
                                  loss_as_layer=name == "embedding+loss")
            sel = rows & (pp == pv[0]) & (vpp == pv[1])
            if lay.stages == auto_layout(model.num_layers, *pv).stages or min(lay.stages[1:-1] or [1]) <= 0:
                out[sel] = -2
                continue
            layout_list.append(lay)
            out[sel] = len(layout_list) - 1
    return layout_list, out
