"""The report's data about the search's answer, computed in one step: a run (autopar.report.run_data)
in, plain pandas frames and strings out: the question and the answer, the top-k and its
breakdowns, the best plan per trainer, the scatter of the plans kept and the Pareto front.

Nothing here draws (that is `figures.py`, the only plotly importer) or formats HTML (`html.py`).
Every frame keeps the raw numbers of the run (seconds, bytes, tokens/s, fractions) next to derived
display units (GiB), so tests can compare them with the estimates exactly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autopar.cost.estimate import MEMORY_TERMS, TIME_TERMS
from autopar.report.run_data import RunData
from autopar.search.results import best_per_trainer, pareto_positions, ranked, top_plans
from autopar.spec.hardware import GIB

#: scatter.parquet columns the report reads
REQUIRED_COLUMNS = (
    (
        "plan_name",
        "fits",
        "valid",
        "rejected_by",
        "peak_memory_bytes",
        "memory_capacity_bytes",
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "bubble_fraction",
        "dominant_cost",
        "tp",
        "cp",
        "pp",
        "vpp",
        "dp",
        "ep",
        "zero_stage",
        "micro_batch_size",
        "pp_schedule",
        "recompute",
        "layout_text",
    )
    + tuple(f"time_{t}" for t in TIME_TERMS)
    + tuple(f"mem_{t}" for t in MEMORY_TERMS)
)
#: most points drawn in the all-plans scatter (SVG: each is a DOM node, ~0.2 ms to draw); beyond
#: it a deterministic sample plus every Pareto and top-k plan
MAX_SCATTER_POINTS = 5_000
#: most distinct colours in the scatter: further rejection reasons share "other rules"
MAX_CATEGORIES = 8


# ---- the question and the answer -----------------------------------------------------------------


def winner(run: RunData) -> pd.Series | None:
    top = top_rows(run)
    return None if top.empty else top.iloc[0]


def scenario_label(q: dict) -> str:
    c = q.get("cluster", {})
    return (
        f"{q.get('num_gpus', '?')} x {c.get('gpu', '?')}, seq {q.get('seq_len', '?')}, "
        f"gbs {q.get('global_batch_size', '?')}"
    )


def _params_text(model: dict) -> str:
    try:
        from autopar.spec.presets import model_from_dict

        spec = model_from_dict(model["name"], {k: v for k, v in model.items() if k != "name"})
        n = spec.params_total
        return f"{n / 1e9:.1f}B parameters" if n >= 1e9 else f"{n / 1e6:.0f}M parameters"
    except Exception:  # an older or foreign model dict: the name alone will do
        return ""


def question_rows(run: RunData) -> pd.DataFrame:
    """What was asked: model, cluster, GPUs, batch, sequence, search space, method, counts."""
    s, q = run.search, run.question
    m, c = q.get("model", {}), q.get("cluster", {})
    gbs, seq = q.get("global_batch_size"), q.get("seq_len")
    space = s.get("space", {})
    knobs = space.get("knobs", {})
    rows = [
        ("model", f"{m.get('name', '?')}" + (f" ({p})" if (p := _params_text(m)) else "")),
        (
            "GPUs",
            f"{q.get('num_gpus', '?')} x {c.get('gpu', '?')} ({c.get('gpus_per_node', '?')} per node; "
            f"{c.get('intra_node_gbps', '?')} GB/s in a node, {c.get('inter_node_gbps', '?')} GB/s between)",
        ),
        (
            "global batch",
            f"{gbs} sequences x {seq} tokens = {gbs * seq:,} tokens per step"
            if isinstance(gbs, int) and isinstance(seq, int)
            else str(gbs),
        ),
        ("sequence length", str(seq)),
        (
            "search space",
            f"{space.get('name', '?')}: "
            + "; ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in knobs.items()),
        ),
        ("constraints", "; ".join(f"{k}={v}" for k, v in space.get("constraints", {}).items()) or "none"),
        ("method", method_text(s)),
        (
            "plans",
            f"{run.plans_evaluated:,} evaluated, {s.get('plans_valid', 0):,} valid, {s.get('plans_fit', 0):,} fit",
        ),
        (
            "rejected by",
            rejection_text(s.get("rejected_by"))
            if isinstance(s.get("rejected_by"), dict)
            else rejection_text_of(run.plans) or "nothing",
        ),
        ("autopar", f"{s.get('autopar_version', '?')}; search took {s.get('timings_s', {}).get('total_s', 0):.2f} s"),
    ]
    if whole := _whole_run_text(s.get("options", {}).get("training")):
        rows.insert(4, ("whole run", whole))
    return pd.DataFrame(rows, columns=["item", "value"])


def _whole_run_text(t: object) -> str:
    """'15T tokens, by 120 days, at 2.5 per GPU-hour, within 15M' (search --tokens ...), or ''."""
    from autopar.search.training import money_text, tokens_text

    if not isinstance(t, dict) or not t.get("tokens"):
        return ""
    prices = ", ".join(f"{k} {v:g}" for k, v in (t.get("prices_by_gpu") or {}).items())
    price = t.get("price_per_gpu_hour")
    parts = [
        f"{tokens_text(float(t['tokens']))} tokens",
        f"by {t['deadline_s'] / 86_400:g} days" if t.get("deadline_s") else "",
        f"at {prices or f'{price:g}'} per GPU-hour" if prices or price else "",
        f"within {money_text(float(t['budget']))}" if t.get("budget") else "",
    ]
    return ", ".join(p for p in parts if p)


def method_text(s: dict) -> str:
    method = s.get("method", "?")
    if method == "exhaustive":
        return "exhaustive: every plan of the space evaluated (the exact optimum of the cost model)"
    return f"{method}: Optuna sampled the space ({len(s.get('history', []))} trials)"


def rejection_text(counts: dict) -> str:
    """'memory (1,406), microbatches%pp (66)': how many plans each rule rejected (a plan can break
    several), from search.json's counts over every evaluated plan."""
    items = sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: -kv[1])
    return ", ".join(f"{k} ({v:,})" for k, v in items) or "nothing"


def rejection_text_of(plans: pd.DataFrame) -> str:
    """rejection_text counted over the rows of a frame (distinct reason strings split once)."""
    counts: dict[str, int] = {}
    for reasons, n in plans.loc[~plans["fits"].astype(bool), "rejected_by"].astype(str).value_counts().items():
        for r in reasons.split(", "):
            if r:
                counts[r] = counts.get(r, 0) + int(n)
    return rejection_text(counts)


def _plan_words(row: pd.Series) -> str:
    parts = []
    if int(row["pp"]) > 1:
        parts.append(str(row["pp_schedule"]))
    parts += [
        f"{row['recompute']} recompute" if row["recompute"] != "none" else "no recompute",
        f"ZeRO {int(row['zero_stage'])}",
        f"micro-batch {int(row['micro_batch_size'])}",
    ]
    return ", ".join(parts)


def answer(run: RunData) -> str:
    """The answer in one sentence."""
    q = run.question
    model = q.get("model", {}).get("name", "the model")
    where = f"{q.get('num_gpus', '?')} x {q.get('cluster', {}).get('gpu', '?')}"
    w = winner(run)
    if w is None:
        return f"Nothing fits {model} on {where}: {run.top.get('why', run.search.get('why', ''))}"
    return (
        f"On {where}, {model} trains fastest with {w['plan_name']} ({_plan_words(w)}): "
        f"{w['step_time_s']:.3f} s per step, {w['tokens_per_s']:,.0f} tokens/s, {100 * w['mfu']:.1f}% MFU, "
        f"peak memory {w['peak_memory_bytes'] / GIB:.1f} of {w['memory_capacity_bytes'] / GIB:.1f} GiB."
    )


# ---- top-k and breakdowns ------------------------------------------------------------------------

TOP_COLUMNS = (
    "rank",
    "label",
    "plan_name",
    "tp",
    "cp",
    "pp",
    "vpp",
    "dp",
    "ep",
    "pp_schedule",
    "recompute",
    "zero_stage",
    "micro_batch_size",
    "layout_text",
    "peak_memory_bytes",
    "memory_gib",
    "memory_capacity_gib",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "bubble_fraction",
    "dominant_cost",
    "trainer",
    "trainers",
)


def top_rows(run: RunData) -> pd.DataFrame:
    """The top-k rows, in top.json's order: distinct plans, each on its fastest trainer, with every
    trainer that runs it (`trainers`, which the search priced plan by plan)."""
    entries = run.top.get("top", []) if isinstance(run.top.get("top"), list) else []
    k = len(entries) if entries else int(run.search.get("options", {}).get("top_k", 10))
    if not k:
        return run.plans.iloc[:0]
    if (
        entries
        and "plan_index" in run.plans.columns
        and all(isinstance(e, dict) and "plan_index" in e for e in entries)
    ):
        first = run.plans.drop_duplicates("plan_index")  # keeps the frame's index (the scatter's keys)
        pos = pd.Index(first["plan_index"]).get_indexer([int(e["plan_index"]) for e in entries])
        if (pos >= 0).all():
            rows = first.iloc[pos]
            return rows.assign(trainers=[", ".join(e.get("trainers") or [str(e.get("trainer", ""))]) for e in entries])
    if "trainer" not in run.plans.columns:  # a run directory from before trainers were searched
        return ranked(run.plans).head(k).assign(trainer="megatron", trainers="megatron")
    return top_plans(run.plans, k)


def trainer_table(run: RunData) -> pd.DataFrame:
    """The fastest plan that fits per searched trainer, and how much slower than the overall best."""
    if "trainer" not in run.plans.columns:
        return pd.DataFrame()
    best = {t: r for t, r in best_per_trainer(run.plans).items()}
    rows = [r.to_frame().T.assign(trainer=t) for t, r in best.items() if r is not None]
    if not rows:
        return pd.DataFrame()
    out = pd.concat(rows, ignore_index=True)
    out["memory_gib"] = out["peak_memory_bytes"].astype(float) / GIB
    out["vs_best"] = out["step_time_s"].astype(float) / out["step_time_s"].astype(float).min() - 1
    return out


def _labels(top: pd.DataFrame) -> list[str]:
    return [f"#{i} {n}" for i, n in enumerate(top["plan_name"].astype(str), start=1)]


def top_table(run: RunData) -> pd.DataFrame:
    """The top-k table: one row per candidate, raw estimate numbers (plus GiB for display)."""
    top = top_rows(run).copy()
    top.insert(0, "rank", np.arange(1, len(top) + 1))
    top.insert(1, "label", _labels(top))
    top["memory_gib"] = top["peak_memory_bytes"] / GIB
    top["memory_capacity_gib"] = top["memory_capacity_bytes"] / GIB
    return top.loc[:, list(TOP_COLUMNS)].reset_index(drop=True)


def time_breakdown(rows: pd.DataFrame, labels: list[str] | None = None) -> pd.DataFrame:
    """Step-time terms (seconds) per candidate; the terms sum to step_time_s."""
    out = pd.DataFrame(
        {t: rows[f"time_{t}"].to_numpy(dtype=float) for t in TIME_TERMS},
        index=pd.Index(labels or _labels(rows), name="candidate"),
    )
    out["step_time_s"] = rows["step_time_s"].to_numpy(dtype=float)
    return out


def memory_breakdown(rows: pd.DataFrame, labels: list[str] | None = None) -> pd.DataFrame:
    """Memory terms per candidate (bytes); they sum to peak_memory_bytes. Plus the capacity."""
    out = pd.DataFrame(
        {t: rows[f"mem_{t}"].to_numpy(dtype=float) for t in MEMORY_TERMS},
        index=pd.Index(labels or _labels(rows), name="candidate"),
    )
    out["peak_memory_bytes"] = rows["peak_memory_bytes"].to_numpy(dtype=float)
    out["memory_capacity_bytes"] = rows["memory_capacity_bytes"].to_numpy(dtype=float)
    return out


# ---- every evaluated plan: scatter and Pareto front ----------------------------------------------


def pareto_mask(throughput: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Points no other point beats: higher throughput and lower memory, one strictly. Of exact
    duplicates one is kept (autopar.search.results.pareto_positions)."""
    keep = np.zeros(len(memory), bool)
    keep[pareto_positions(-np.asarray(throughput, dtype=float), memory)] = True
    return keep


def pareto_table(plans: pd.DataFrame) -> pd.DataFrame:
    """Fitting plans on the throughput / memory front, least memory first."""
    fit = plans[plans["fits"].astype(bool)]
    front = fit[pareto_mask(fit["tokens_per_s"].to_numpy(), fit["peak_memory_bytes"].to_numpy())].copy()
    front["memory_gib"] = front["peak_memory_bytes"] / GIB
    front = front.sort_values(["peak_memory_bytes", "tokens_per_s"], ascending=[True, False], kind="stable")
    cols = [
        "plan_name",
        "pp",
        "pp_schedule",
        "recompute",
        "zero_stage",
        "micro_batch_size",
        "peak_memory_bytes",
        "memory_gib",
        "tokens_per_s",
        "step_time_s",
        "mfu",
    ]
    return front[cols + (["plan_index"] if "plan_index" in front.columns else [])]


def categories(plans: pd.DataFrame) -> pd.Series:
    """Colour class of every plan: 'fits', 'memory' (over capacity or headroom) or the rule it breaks
    (the first one; rare rules share 'other rules')."""
    fits = plans["fits"].astype(bool).to_numpy()
    codes, uniques = pd.factorize(plans["rejected_by"].astype(str))  # split each distinct string once
    first = np.asarray([u.split(", ")[0] for u in uniques] or [""], dtype=object)[np.maximum(codes, 0)]
    cat = pd.Series(np.where(fits, "fits", first), index=plans.index, dtype=object)
    counts = cat[cat != "fits"].value_counts()
    rare = counts.index[MAX_CATEGORIES - 2 :] if len(counts) > MAX_CATEGORIES - 1 else []
    return cat.where(~cat.isin(rare), "other rules")


def hover_text(plans: pd.DataFrame) -> pd.Series:
    """One hover label per plan: the layout and its key numbers."""
    if plans.empty:
        return pd.Series([], index=plans.index, dtype=object)
    s = lambda c: plans[c].astype(str)  # noqa: E731
    sched = np.where(plans["pp"].to_numpy() > 1, s("pp_schedule") + ", ", "")
    text = (
        s("plan_name")
        + "<br>"
        + sched
        + s("recompute")
        + " recompute, ZeRO "
        + s("zero_stage")
        + ", mbs "
        + s("micro_batch_size")
        + "<br>layout "
        + s("layout_text")
        + "<br>"
        + (plans["peak_memory_bytes"] / GIB).map("{:.1f}".format)
        + " GiB, "
        + plans["step_time_s"].map("{:.3f}".format)
        + " s/step, MFU "
        + (100 * plans["mfu"]).map("{:.1f}".format)
        + "%"
    )
    rej = plans["rejected_by"].astype(str)
    return text.where(rej == "", text + "<br>rejected: " + rej)


def _short(plans: pd.DataFrame) -> pd.Series:
    if plans.empty:
        return pd.Series([], index=plans.index, dtype=object)
    s = lambda c: plans[c].astype(str)  # noqa: E731
    sched = np.where(plans["pp"].to_numpy() > 1, s("pp_schedule") + ", ", "")
    return (
        s("plan_name")
        + " ("
        + sched
        + s("recompute")
        + ", ZeRO "
        + s("zero_stage")
        + ", mbs "
        + s("micro_batch_size")
        + ")"
    )


def scatter_frame(
    plans: pd.DataFrame, keep: pd.Index | None = None, max_points: int = MAX_SCATTER_POINTS, seed: int = 0
) -> pd.DataFrame:
    """Every evaluated plan with a finite estimate: memory (GiB) vs throughput, its colour class,
    whether it is on the Pareto front, and the hover text. Plans with the same estimate (same
    memory, throughput and class, e.g. schedules that do not matter without a pipeline) share one
    point: `n_plans` counts them and the hover names them. Above max_points points, a
    deterministic sample that always keeps the Pareto front and the rows in `keep` (e.g. the
    top-k). The frame is indexed by the first plan of each point; attrs say how many plans there
    were, how many were drawn and how many have no finite estimate. Text is built only for the
    points drawn, so millions of plans cost little more than the numbers."""
    mem_all = plans["peak_memory_bytes"].to_numpy(float)
    tput_all = plans["tokens_per_s"].to_numpy(float)
    finite = np.isfinite(tput_all) & np.isfinite(mem_all)
    p = plans[finite]
    mem, tput = mem_all[finite], tput_all[finite]
    fit = p["fits"].astype(bool).to_numpy()
    front = np.zeros(len(p), bool)
    front[fit] = pareto_mask(tput[fit], mem[fit])
    cat = categories(p).to_numpy()
    gid = pd.DataFrame({"m": mem, "t": tput, "c": cat}).groupby(["m", "t", "c"], sort=False).ngroup().to_numpy()
    first = ~pd.Series(gid).duplicated().to_numpy()
    n_plans = np.bincount(gid)
    on_front = np.bincount(gid, weights=front) > 0
    pos = np.flatnonzero(first)  # positions (in p) of each point's first plan, in gid order
    points = len(pos)
    if points > max_points:
        must = on_front[gid[pos]] | p.index[pos].isin(keep if keep is not None else [])
        rest = np.flatnonzero(~must)
        n = max(0, max_points - int(must.sum()))
        pick = np.random.default_rng(seed).choice(rest, size=min(n, len(rest)), replace=False)
        pos = np.sort(np.concatenate([np.flatnonzero(must), pick]))
        pos = np.flatnonzero(first)[pos]
    g = gid[pos]
    sel = p.iloc[pos]
    out = pd.DataFrame(
        {
            "plan_name": sel["plan_name"].astype(str).to_numpy(),
            "peak_memory_bytes": mem[pos],
            "memory_gib": mem[pos] / GIB,
            "tokens_per_s": tput[pos],
            "step_time_s": sel["step_time_s"].to_numpy(float),
            "category": cat[pos],
            "pareto": on_front[g],
            "n_plans": n_plans[g],
        },
        index=sel.index,
    )
    # hover: the first plan's text, then up to four more plans that share its estimate
    hover = hover_text(sel).to_numpy(dtype=object)
    dup = np.flatnonzero(~first & np.isin(gid, g[n_plans[g] > 1]))
    if len(dup):
        rank = pd.Series(gid[dup]).groupby(gid[dup]).cumcount().to_numpy()
        dup = dup[rank < 4]
        shorts: dict[int, list[str]] = {}
        for gg, sh in zip(gid[dup], _short(p.iloc[dup]).to_numpy()):
            shorts.setdefault(int(gg), []).append(sh)
        hover = hover + np.asarray(
            [
                ""
                if n_plans[gg] < 2
                else "<br>same estimate: "
                + ", ".join(shorts.get(int(gg), []))
                + (f" and {n_plans[gg] - 5:,} more" if n_plans[gg] > 5 else "")
                for gg in g
            ],
            dtype=object,
        )
    out["hover"] = hover
    out = out.sort_index()
    out.attrs.update(
        total=int(len(plans)),
        points=int(points),
        plotted=int(len(out)),
        plotted_plans=int(out["n_plans"].sum()),
        without_estimate=int((~finite).sum()),
    )
    return out


CATEGORY_ORDER = ("fits", "memory")


def category_order(cats: pd.Series) -> list[str]:
    """Legend order: fits, memory, then rules by frequency, 'other rules' last."""
    counts = cats.value_counts()
    rest = [c for c in counts.index if c not in CATEGORY_ORDER and c != "other rules"]
    last = ["other rules"] if "other rules" in counts.index else []
    return [c for c in CATEGORY_ORDER if c in counts.index] + rest + last
