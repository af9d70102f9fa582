"""The report's data, computed in one step: a run directory in, plain pandas frames and strings out.

Nothing here draws (that is `figures.py`, the only plotly importer) or formats HTML (`html.py`).
Every frame keeps the raw numbers of the run (seconds, bytes, tokens/s, fractions) next to derived
display units (GiB), so tests can compare them with the estimates exactly.

A run directory is what `autopar search` writes (autopar.search.run_dir): `scatter.parquet` (every
estimate column of the plans kept: each trainer's fastest, the whole Pareto front, a uniform sample
of each category), `top.json` (top-k, why, Pareto front), `search.json` (question, space, method,
counts, rejection counts, timings, Optuna history); optionally `trials/*.json` (predicted vs
measured, from the trials layer) and `whatif.json` (the run directories of the other scenarios of a
what-if). `plans.parquet` (every plan, key figures only) is for the user's own analysis.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from autopar.cost.estimate import AXES, MEMORY_TERMS, TIME_TERMS
from autopar.errors import InputError
from autopar.search.results import best_per_trainer, ranked, top_plans
from autopar.spec.hardware import GIB

#: the files `autopar search` writes that a report needs
RUN_FILES = ("scatter.parquet", "top.json", "search.json")
#: scatter.parquet columns the report reads
REQUIRED_COLUMNS = (("plan_name", "fits", "valid", "rejected_by", "peak_memory_bytes", "memory_capacity_bytes",
                     "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "bubble_fraction",
                     "dominant_cost", "tp", "cp", "pp", "vpp", "dp", "ep", "zero_stage", "micro_batch_size",
                     "pp_schedule", "recompute", "layout_text")
                    + tuple(f"time_{t}" for t in TIME_TERMS) + tuple(f"mem_{t}" for t in MEMORY_TERMS))
#: most points drawn in the all-plans scatter (SVG: each is a DOM node, ~0.2 ms to draw); beyond
#: it a deterministic sample plus every Pareto and top-k plan
MAX_SCATTER_POINTS = 5_000
#: most distinct colours in the scatter: further rejection reasons share "other rules"
MAX_CATEGORIES = 8

TIME_LABELS = {"compute": "compute", "tp": "TP comm", "cp": "CP comm", "ep": "EP all-to-all", "pp": "PP send/recv",
               "dp": "DP comm (exposed)", "bubble": "pipeline bubble", "optimizer": "optimizer step"}
MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
                 "activations": "activations", "other": "other (runtime, buffers)"}


# ---- loading -------------------------------------------------------------------------------------

@dataclass
class RunData:
    """A run directory, loaded."""

    run_dir: Path
    plans: pd.DataFrame  # the plans the search kept (scatter.parquet), not every plan
    top: dict
    search: dict
    trials: list[dict] = field(default_factory=list)  # each: the trial JSON plus "_file"
    trial_problems: list[str] = field(default_factory=list)  # trial files skipped, and why
    scenarios: list[Path] = field(default_factory=list)  # what-if run directories (this one included)

    @property
    def question(self) -> dict:
        return self.search.get("question", {})

    @property
    def headroom_gib(self) -> float:
        return float(self.search.get("space", {}).get("constraints", {}).get("memory_headroom_gib", 0.0) or 0.0)

    @property
    def top_k(self) -> int:
        return len(self.top.get("top", []))

    @property
    def plans_fit(self) -> int:
        return int(self.search.get("plans_fit", int(self.plans["fits"].sum()) if len(self.plans) else 0))

    @property
    def plans_evaluated(self) -> int:
        return int(self.search.get("plans_evaluated", len(self.plans)))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:160] + "...") if len(text) > 160 else text or type(e).__name__


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"'{path}' is corrupt or unreadable ({_one_line(e)}); rerun `autopar search` to "
                         f"rewrite the run directory") from None
    if not isinstance(data, dict):
        raise InputError(f"'{path}' is corrupt: expected a JSON object; rerun `autopar search` to rewrite it")
    return data


def load_run(run_dir: str | Path, *, with_trials: bool = True, with_scenarios: bool = True) -> RunData:
    """Read a run directory. Missing or corrupt: InputError with one line naming the file and the fix."""
    d = Path(run_dir)
    hint = "give a directory written by `autopar search --run-dir DIR`"
    if not d.exists():
        raise InputError(f"run directory '{d}' does not exist; {hint}")
    if not d.is_dir():
        raise InputError(f"'{d}' is not a directory; {hint}")
    missing = [f for f in RUN_FILES if not (d / f).is_file()]
    if missing:
        raise InputError(f"'{d}' is not a complete autopar run directory: {', '.join(missing)} missing; "
                         f"rerun `autopar search ... --run-dir {d}`")
    try:
        plans = pd.read_parquet(d / "scatter.parquet")
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError, ...) for a bad file
        raise InputError(f"'{d / 'scatter.parquet'}' is corrupt or unreadable ({_one_line(e)}); rerun "
                         f"`autopar search ... --run-dir {d}`") from None
    lacking = [c for c in REQUIRED_COLUMNS if c not in plans.columns]
    if lacking:
        raise InputError(f"'{d / 'scatter.parquet'}' lacks column(s) {', '.join(lacking[:5])}"
                         f"{' ...' if len(lacking) > 5 else ''}; it was not written by this autopar version; "
                         f"rerun `autopar search`")
    run = RunData(run_dir=d, plans=plans, top=read_json(d / "top.json"), search=read_json(d / "search.json"))
    if with_trials:
        run.trials, run.trial_problems = load_trials(d)
    if with_scenarios:
        run.scenarios = read_scenarios(d)
    return run


def load_trials(run_dir: Path) -> tuple[list[dict], list[str]]:
    """`trials/*.json` of the run: each needs `plan` (dict), `predicted` and `measured`
    {step_time_s, peak_memory_bytes}. Files that do not parse are skipped and reported, so one bad
    trial does not hide the others."""
    out, problems = [], []
    for path in sorted((run_dir / "trials").glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems.append(f"trials/{path.name}: not JSON ({_one_line(e)})")
            continue
        if not isinstance(data, dict) or not all(isinstance(data.get(k), dict)
                                                 for k in ("plan", "predicted", "measured")):
            problems.append(f"trials/{path.name}: needs 'plan', 'predicted' and 'measured' objects")
            continue
        out.append(data | {"_file": path.name})
    return out, problems


WHATIF_FILE = "whatif.json"


def read_scenarios(run_dir: Path) -> list[Path]:
    """The what-if scenarios recorded with this run (whatif.json), as directories; [] when none."""
    path = run_dir / WHATIF_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        dirs = [Path(p) for p in data["scenarios"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [p if p.is_absolute() else (run_dir / p) for p in dirs]


def write_scenarios(run_dir: Path, scenarios: list[Path]) -> None:
    """Record the what-if scenario directories (relative to this run directory) in whatif.json."""
    import os

    rel = [os.path.relpath(Path(s).resolve(), Path(run_dir).resolve()) for s in scenarios]
    (Path(run_dir) / WHATIF_FILE).write_text(json.dumps({"scenarios": rel}, indent=2))


# ---- the question and the answer -----------------------------------------------------------------

def winner(run: RunData) -> pd.Series | None:
    top = top_rows(run)
    return None if top.empty else top.iloc[0]


def scenario_label(q: dict) -> str:
    c = q.get("cluster", {})
    return (f"{q.get('num_gpus', '?')} x {c.get('gpu', '?')}, seq {q.get('seq_len', '?')}, "
            f"gbs {q.get('global_batch_size', '?')}")


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
        ("GPUs", f"{q.get('num_gpus', '?')} x {c.get('gpu', '?')} ({c.get('gpus_per_node', '?')} per node; "
                 f"{c.get('intra_node_gbps', '?')} GB/s in a node, {c.get('inter_node_gbps', '?')} GB/s between)"),
        ("global batch", f"{gbs} sequences x {seq} tokens = {gbs * seq:,} tokens per step"
         if isinstance(gbs, int) and isinstance(seq, int) else str(gbs)),
        ("sequence length", str(seq)),
        ("search space", f"{space.get('name', '?')}: " + "; ".join(
            f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in knobs.items())),
        ("constraints", "; ".join(f"{k}={v}" for k, v in space.get("constraints", {}).items()) or "none"),
        ("method", method_text(s)),
        ("plans", f"{run.plans_evaluated:,} evaluated, {s.get('plans_valid', 0):,} valid, "
                  f"{s.get('plans_fit', 0):,} fit"),
        ("rejected by", rejection_text(s.get("rejected_by")) if isinstance(s.get("rejected_by"), dict)
         else rejection_text_of(run.plans) or "nothing"),
        ("autopar", f"{s.get('autopar_version', '?')}; search took {s.get('timings_s', {}).get('total_s', 0):.2f} s"),
    ]
    return pd.DataFrame(rows, columns=["item", "value"])


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
    parts += [f"{row['recompute']} recompute" if row["recompute"] != "none" else "no recompute",
              f"ZeRO {int(row['zero_stage'])}", f"micro-batch {int(row['micro_batch_size'])}"]
    return ", ".join(parts)


def answer(run: RunData) -> str:
    """The answer in one sentence."""
    q = run.question
    model = q.get("model", {}).get("name", "the model")
    where = f"{q.get('num_gpus', '?')} x {q.get('cluster', {}).get('gpu', '?')}"
    w = winner(run)
    if w is None:
        return f"Nothing fits {model} on {where}: {run.top.get('why', run.search.get('why', ''))}"
    return (f"On {where}, {model} trains fastest with {w['plan_name']} ({_plan_words(w)}): "
            f"{w['step_time_s']:.3f} s per step, {w['tokens_per_s']:,.0f} tokens/s, {100 * w['mfu']:.1f}% MFU, "
            f"peak memory {w['peak_memory_bytes'] / GIB:.1f} of {w['memory_capacity_bytes'] / GIB:.1f} GiB.")


# ---- top-k and breakdowns ------------------------------------------------------------------------

TOP_COLUMNS = ("rank", "label", "plan_name", "tp", "cp", "pp", "vpp", "dp", "ep", "pp_schedule", "recompute",
               "zero_stage", "micro_batch_size", "layout_text", "peak_memory_bytes", "memory_gib",
               "memory_capacity_gib", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
               "bubble_fraction", "dominant_cost", "trainer", "trainers")


def top_rows(run: RunData) -> pd.DataFrame:
    """The top-k rows, in top.json's order: distinct plans, each on its fastest trainer, with every
    trainer that runs it (`trainers`, which the search priced plan by plan)."""
    entries = run.top.get("top", []) if isinstance(run.top.get("top"), list) else []
    k = len(entries) if entries else int(run.search.get("options", {}).get("top_k", 10))
    if not k:
        return run.plans.iloc[:0]
    if entries and "plan_index" in run.plans.columns and all(isinstance(e, dict) and "plan_index" in e
                                                             for e in entries):
        first = run.plans.drop_duplicates("plan_index")  # keeps the frame's index (the scatter's keys)
        pos = pd.Index(first["plan_index"]).get_indexer([int(e["plan_index"]) for e in entries])
        if (pos >= 0).all():
            rows = first.iloc[pos]
            return rows.assign(trainers=[", ".join(e.get("trainers") or [str(e.get("trainer", ""))])
                                         for e in entries])
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
    out = pd.DataFrame({t: rows[f"time_{t}"].to_numpy(dtype=float) for t in TIME_TERMS},
                       index=pd.Index(labels or _labels(rows), name="candidate"))
    out["step_time_s"] = rows["step_time_s"].to_numpy(dtype=float)
    return out


def memory_breakdown(rows: pd.DataFrame, labels: list[str] | None = None) -> pd.DataFrame:
    """Memory terms per candidate (bytes); they sum to peak_memory_bytes. Plus the capacity."""
    out = pd.DataFrame({t: rows[f"mem_{t}"].to_numpy(dtype=float) for t in MEMORY_TERMS},
                       index=pd.Index(labels or _labels(rows), name="candidate"))
    out["peak_memory_bytes"] = rows["peak_memory_bytes"].to_numpy(dtype=float)
    out["memory_capacity_bytes"] = rows["memory_capacity_bytes"].to_numpy(dtype=float)
    return out


# ---- every evaluated plan: scatter and Pareto front ----------------------------------------------

def pareto_mask(throughput: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Points no other point beats: higher throughput and lower memory, one strictly. Of exact
    duplicates one is kept. O(n log n)."""
    throughput, memory = np.asarray(throughput, float), np.asarray(memory, float)
    order = np.lexsort((memory, -throughput))  # fastest first, then least memory
    mem_sorted = memory[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], mem_sorted[:-1])))
    keep = np.zeros(len(memory), bool)
    keep[order] = mem_sorted < best_before
    return keep


def pareto_table(plans: pd.DataFrame) -> pd.DataFrame:
    """Fitting plans on the throughput / memory front, least memory first."""
    fit = plans[plans["fits"].astype(bool)]
    front = fit[pareto_mask(fit["tokens_per_s"].to_numpy(), fit["peak_memory_bytes"].to_numpy())].copy()
    front["memory_gib"] = front["peak_memory_bytes"] / GIB
    front = front.sort_values(["peak_memory_bytes", "tokens_per_s"], ascending=[True, False], kind="stable")
    cols = ["plan_name", "pp", "pp_schedule", "recompute", "zero_stage", "micro_batch_size", "peak_memory_bytes",
            "memory_gib", "tokens_per_s", "step_time_s", "mfu"]
    return front[cols + (["plan_index"] if "plan_index" in front.columns else [])]


def categories(plans: pd.DataFrame) -> pd.Series:
    """Colour class of every plan: 'fits', 'memory' (over capacity or headroom) or the rule it breaks
    (the first one; rare rules share 'other rules')."""
    fits = plans["fits"].astype(bool).to_numpy()
    codes, uniques = pd.factorize(plans["rejected_by"].astype(str))  # split each distinct string once
    first = np.asarray([u.split(", ")[0] for u in uniques] or [""], dtype=object)[np.maximum(codes, 0)]
    cat = pd.Series(np.where(fits, "fits", first), index=plans.index, dtype=object)
    counts = cat[cat != "fits"].value_counts()
    rare = counts.index[MAX_CATEGORIES - 2:] if len(counts) > MAX_CATEGORIES - 1 else []
    return cat.where(~cat.isin(rare), "other rules")


def hover_text(plans: pd.DataFrame) -> pd.Series:
    """One hover label per plan: the layout and its key numbers."""
    if plans.empty:
        return pd.Series([], index=plans.index, dtype=object)
    s = lambda c: plans[c].astype(str)  # noqa: E731
    sched = np.where(plans["pp"].to_numpy() > 1, s("pp_schedule") + ", ", "")
    text = (s("plan_name") + "<br>" + sched + s("recompute") + " recompute, ZeRO " + s("zero_stage")
            + ", mbs " + s("micro_batch_size") + "<br>layout " + s("layout_text")
            + "<br>" + (plans["peak_memory_bytes"] / GIB).map("{:.1f}".format) + " GiB, "
            + plans["step_time_s"].map("{:.3f}".format) + " s/step, MFU "
            + (100 * plans["mfu"]).map("{:.1f}".format) + "%")
    rej = plans["rejected_by"].astype(str)
    return text.where(rej == "", text + "<br>rejected: " + rej)


def _short(plans: pd.DataFrame) -> pd.Series:
    if plans.empty:
        return pd.Series([], index=plans.index, dtype=object)
    s = lambda c: plans[c].astype(str)  # noqa: E731
    sched = np.where(plans["pp"].to_numpy() > 1, s("pp_schedule") + ", ", "")
    return (s("plan_name") + " (" + sched + s("recompute") + ", ZeRO " + s("zero_stage") + ", mbs "
            + s("micro_batch_size") + ")")


def scatter_frame(plans: pd.DataFrame, keep: pd.Index | None = None, max_points: int = MAX_SCATTER_POINTS,
                  seed: int = 0) -> pd.DataFrame:
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
    out = pd.DataFrame({
        "plan_name": sel["plan_name"].astype(str).to_numpy(),
        "peak_memory_bytes": mem[pos], "memory_gib": mem[pos] / GIB, "tokens_per_s": tput[pos],
        "step_time_s": sel["step_time_s"].to_numpy(float), "category": cat[pos], "pareto": on_front[g],
        "n_plans": n_plans[g],
    }, index=sel.index)
    # hover: the first plan's text, then up to four more plans that share its estimate
    hover = hover_text(sel).to_numpy(dtype=object)
    dup = np.flatnonzero(~first & np.isin(gid, g[n_plans[g] > 1]))
    if len(dup):
        rank = pd.Series(gid[dup]).groupby(gid[dup]).cumcount().to_numpy()
        dup = dup[rank < 4]
        shorts: dict[int, list[str]] = {}
        for gg, sh in zip(gid[dup], _short(p.iloc[dup]).to_numpy()):
            shorts.setdefault(int(gg), []).append(sh)
        hover = hover + np.asarray([
            "" if n_plans[gg] < 2 else "<br>same estimate: " + ", ".join(shorts.get(int(gg), []))
            + (f" and {n_plans[gg] - 5:,} more" if n_plans[gg] > 5 else "") for gg in g], dtype=object)
    out["hover"] = hover
    out = out.sort_index()
    out.attrs.update(total=int(len(plans)), points=int(points), plotted=int(len(out)),
                     plotted_plans=int(out["n_plans"].sum()), without_estimate=int((~finite).sum()))
    return out


CATEGORY_ORDER = ("fits", "memory")


def category_order(cats: pd.Series) -> list[str]:
    """Legend order: fits, memory, then rules by frequency, 'other rules' last."""
    counts = cats.value_counts()
    rest = [c for c in counts.index if c not in CATEGORY_ORDER and c != "other rules"]
    last = ["other rules"] if "other rules" in counts.index else []
    return [c for c in CATEGORY_ORDER if c in counts.index] + rest + last


# ---- Optuna ----------------------------------------------------------------------------------------

def optuna_history(run: RunData) -> pd.DataFrame:
    """Optuna's trials in order: objective (step time), feasible, best feasible so far. Empty when
    the search was exhaustive."""
    hist = run.search.get("history") or []
    df = pd.DataFrame(hist, columns=["number", "step_time_s", "feasible", "best_so_far"])
    if df.empty:
        return df
    for c in ("step_time_s", "best_so_far"):
        df[c] = pd.to_numeric(df[c], errors="coerce").replace([np.inf, -np.inf], np.nan)
    df["feasible"] = df["feasible"].astype(bool)
    return df.sort_values("number", kind="stable").reset_index(drop=True)


# ---- trials: predicted vs measured --------------------------------------------------------------

def _num(d: dict, key: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _trial_name(plan: dict, fallback: str) -> str:
    try:
        from autopar.spec.plan import ParallelPlan

        return ParallelPlan.from_dict(plan).describe()
    except Exception:  # a plan dict from a newer/older trials layer: its file name will do
        return fallback


def relative_error(predicted, measured):
    """(predicted - measured) / measured: positive = the model over-predicts."""
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(measured > 0, (predicted - measured) / measured, np.nan)


def _trial_kind(t: dict) -> str:
    """How the trial ran: full size, as a proxy (scaled back), or not at all here."""
    kind = str(t.get("kind") or ("proxy" if t.get("proxy") else ""))
    if t.get("status") == "not-runnable" or kind == "not-runnable":
        return "not run"
    return kind or "full"


def _trial_note(t: dict) -> str:
    """What a proxy changed, or why a trial did not run or failed."""
    if t.get("status") not in ("ok", "pruned", None) or _trial_kind(t) == "not run":
        return "; ".join(str(r) for r in t.get("reasons") or [])
    proxy = t.get("proxy") or {}
    return str(proxy.get("summary") or ", ".join(proxy.get("changes") or []))


def trials_table(trials: list[dict]) -> pd.DataFrame:
    """One row per trialled plan: how it ran (full / proxy / not run), predicted and measured step
    time and peak memory (a proxy's scaled back to the plan), the errors (absolute: predicted -
    measured; relative: / measured), the proxy's own measured and predicted step time, and a note:
    what the proxy changed, or why the trial did not run."""
    rows = []
    for t in trials:
        pred, meas = t.get("predicted") or {}, t.get("measured") or {}
        own = meas.get("proxy") if isinstance(meas.get("proxy"), dict) else {}
        rows.append({
            "trial": str(t.get("_file", "")).removesuffix(".json"),
            "plan_name": _trial_name(t.get("plan") or {}, str(t.get("_file", "?"))),
            "status": str(t.get("status", "ok" if meas else "")),
            "kind": _trial_kind(t),
            "predicted_step_time_s": _num(pred, "step_time_s"),
            "measured_step_time_s": _num(meas, "step_time_s"),
            "predicted_peak_memory_bytes": _num(pred, "peak_memory_bytes"),
            "measured_peak_memory_bytes": _num(meas, "peak_memory_bytes"),
            "proxy_step_time_s": _num(own, "step_time_s"),
            "proxy_predicted_step_time_s": _num(own, "predicted_step_time_s"),
            "note": _trial_note(t),
        })
    cols = ["trial", "plan_name", "status", "kind", "predicted_step_time_s", "measured_step_time_s",
            "predicted_peak_memory_bytes", "measured_peak_memory_bytes", "proxy_step_time_s",
            "proxy_predicted_step_time_s", "note"]
    df = pd.DataFrame(rows, columns=cols)
    df["step_time_error_s"] = df["predicted_step_time_s"] - df["measured_step_time_s"]
    df["step_time_error"] = relative_error(df["predicted_step_time_s"], df["measured_step_time_s"])
    df["predicted_memory_gib"] = df["predicted_peak_memory_bytes"] / GIB
    df["measured_memory_gib"] = df["measured_peak_memory_bytes"] / GIB
    df["memory_error_gib"] = df["predicted_memory_gib"] - df["measured_memory_gib"]
    df["memory_error"] = relative_error(df["predicted_peak_memory_bytes"], df["measured_peak_memory_bytes"])
    return df


def trials_summary(df: pd.DataFrame) -> dict:
    """Mean absolute relative error of step time and memory over the trials that have both numbers."""
    def mape(col: str) -> float:
        return float(np.nanmean(np.abs(df[col]))) if df[col].notna().any() else math.nan

    return {"trials": int(len(df)), "step_time_mape": mape("step_time_error"), "memory_mape": mape("memory_error")}


# ---- what-if: the best plan per scenario ---------------------------------------------------------

WHATIF_COLUMNS = ("scenario", "num_gpus", "gpu", "seq_len", "global_batch_size", "plan_name", "pp_schedule",
                  "recompute", "zero_stage", "micro_batch_size", "peak_memory_bytes", "memory_gib",
                  "memory_capacity_gib", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "plans_fit",
                  "run_dir", "current")


def whatif_table(runs: list[RunData], current: Path | None = None) -> pd.DataFrame:
    """One row per scenario: the question's knobs and its best plan (NaN numbers: nothing fits)."""
    rows = []
    cur = Path(current).resolve() if current is not None else None
    for r in runs:
        q = r.question
        w = winner(r)
        row = {"scenario": scenario_label(q), "num_gpus": q.get("num_gpus"), "gpu": q.get("cluster", {}).get("gpu"),
               "seq_len": q.get("seq_len"), "global_batch_size": q.get("global_batch_size"),
               "plans_fit": r.plans_fit, "run_dir": str(r.run_dir),
               "current": cur is not None and Path(r.run_dir).resolve() == cur}
        if w is None:
            row.update(plan_name="nothing fits", pp_schedule="", recompute="", zero_stage=np.nan,
                       micro_batch_size=np.nan, peak_memory_bytes=np.nan, memory_gib=np.nan,
                       memory_capacity_gib=np.nan, step_time_s=np.nan, tokens_per_s=np.nan,
                       tokens_per_s_per_gpu=np.nan, mfu=np.nan)
        else:
            row.update({k: w[k] for k in ("plan_name", "pp_schedule", "recompute", "zero_stage", "micro_batch_size",
                                          "peak_memory_bytes", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
                                          "mfu")})
            row["memory_gib"] = w["peak_memory_bytes"] / GIB
            row["memory_capacity_gib"] = w["memory_capacity_bytes"] / GIB
        rows.append(row)
    return pd.DataFrame(rows, columns=list(WHATIF_COLUMNS))


# ---- compare: layouts side by side ---------------------------------------------------------------

#: (section, key, label, better) rows of a comparison; key is a path into Estimate.to_dict()
#: ("plan.tp", "time_s.compute", ...); better: "lower", "higher" or "" (not ranked)
COMPARE_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("layout", "name", "name", ""),
    *(("layout", f"plan.{k}", k, "") for k in ("trainer", "tp", "cp", "pp", "vpp", "dp", "ep", "etp", "zero_stage",
                                               "sequence_parallel", "micro_batch_size", "global_batch_size",
                                               "num_microbatches", "pp_schedule", "recompute", "recompute_layers",
                                               "dtype", "main_grads_fp32", "tp_comm_overlap")),
    ("layout", "layout", "stage layout", ""),
    ("verdict", "fits", "fits", ""),
    ("verdict", "reasons", "reasons", ""),
    ("time (s)", "step_time_s", "step time", "lower"),
    *(("time (s)", f"time_s.{t}", TIME_LABELS[t], "lower") for t in TIME_TERMS),
    ("throughput", "tokens_per_s", "tokens/s", "higher"),
    ("throughput", "tokens_per_s_per_gpu", "tokens/s per GPU", "higher"),
    ("throughput", "model_tflops_per_gpu", "model TFLOP/s per GPU", "higher"),
    ("throughput", "mfu", "MFU", "higher"),
    ("throughput", "hfu", "HFU", "higher"),
    ("throughput", "bubble_fraction", "bubble fraction", "lower"),
    ("memory (GiB)", "peak_memory_bytes", "peak memory", "lower"),
    *(("memory (GiB)", f"memory_bytes.{t}", MEMORY_LABELS[t], "lower") for t in MEMORY_TERMS),
    ("memory (GiB)", "memory_capacity_bytes", "capacity", ""),
    ("memory (GiB)", "headroom_bytes", "headroom", "higher"),
    ("memory (GiB)", "params_per_gpu", "parameters per GPU", "lower"),
    *(("comm per GPU per step (GB)", f"comm_bytes_per_gpu.{a}", a.upper(), "lower") for a in AXES),
)
#: display scale of a row's raw value, by section
COMPARE_SCALE = {"memory (GiB)": GIB, "comm per GPU per step (GB)": 1e9}


def _path(d: dict, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def compare_table(labels: list[str], estimates: list[dict]) -> pd.DataFrame:
    """Every metric of every compared plan, aligned: one row per metric, one column per plan (raw
    values: seconds, bytes, fractions), plus `differs` (not all equal) and `best` (the labels with
    the best value, for ranked numeric rows that differ)."""
    if len(labels) != len(estimates) or len(set(labels)) != len(labels):
        raise ValueError("compare_table needs one unique label per estimate")
    ests = []
    for e in estimates:
        e = dict(e)
        e["name"] = e.get("name") or _trial_name(e.get("plan", {}), "?")
        e["headroom_bytes"] = e["memory_capacity_bytes"] - e["peak_memory_bytes"]
        e["reasons"] = "; ".join(e.get("reasons") or [])
        ests.append(e)
    rows = []
    for section, key, label, better in COMPARE_ROWS:
        vals = [_path(e, key) for e in ests]
        if key == "plan.recompute_layers" and all(v is None for v in vals):
            continue
        differs = len({json.dumps(v, sort_keys=True, default=str) for v in vals}) > 1
        best = ""
        if better and differs and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            target = min(vals) if better == "lower" else max(vals)
            best = ", ".join(lab for lab, v in zip(labels, vals) if math.isclose(v, target, rel_tol=1e-12, abs_tol=0))
        rows.append({"section": section, "key": key, "metric": label, "better": better, "scale":
                     COMPARE_SCALE.get(section, 1.0), **dict(zip(labels, vals)), "differs": differs, "best": best})
    return pd.DataFrame(rows)


def estimate_rows(labels: list[str], estimates: list[dict]) -> pd.DataFrame:
    """Estimate dicts as plans.parquet-style rows (time_*, mem_*, ...), for the breakdown frames."""
    data = []
    for e in estimates:
        r = {"plan_name": e.get("name", ""), "step_time_s": e["step_time_s"], "peak_memory_bytes": e["peak_memory_bytes"],
             "memory_capacity_bytes": e["memory_capacity_bytes"], "tokens_per_s": e["tokens_per_s"]}
        r |= {f"time_{t}": e["time_s"][t] for t in TIME_TERMS}
        r |= {f"mem_{t}": e["memory_bytes"][t] for t in MEMORY_TERMS}
        r |= {f"comm_bytes_{a}": e["comm_bytes_per_gpu"][a] for a in AXES}
        data.append(r)
    return pd.DataFrame(data, index=pd.Index(labels, name="candidate"))


def comm_breakdown(rows: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """Bytes each GPU sends per step, per parallel axis."""
    return pd.DataFrame({a: rows[f"comm_bytes_{a}"].to_numpy(float) for a in AXES},
                        index=pd.Index(labels, name="candidate"))
