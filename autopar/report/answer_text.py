"""The report's words about the search: the question it was asked (a table of what was asked) and
its answer in one sentence, from a run (autopar.report.run_data); plain strings and a pandas frame,
no HTML."""

from __future__ import annotations

import pandas as pd

from autopar.figures import (
    FITS,
    LOW,
    MEMORY_CAPACITY_BYTES,
    MFU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    REJECTED_BY,
    STEP_TIME_S,
    TOKENS_PER_S,
)
from autopar.report.run_data import RunData
from autopar.report.top_tables import top_rows, winner
from autopar.spec.hardware import GIB
from autopar.spec.recompute_modules import recompute_label
from autopar.spec.rules import rule_words


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
            rejection_text(by)
            if isinstance(by := s.get(REJECTED_BY), dict)
            else rejection_text_of(run.plans) or "nothing",
        ),
        ("autopar", f"{s.get('autopar_version', '?')}; search took {s.get('timings_s', {}).get('total_s', 0):.2f} s"),
    ]
    if whole := _whole_run_text(s.get("options", {}).get("training")):
        rows.insert(4, ("whole run", whole))
    return pd.DataFrame(rows, columns=["item", "value"])


def _whole_run_text(t: object) -> str:
    """'15T tokens, by 120 days, at 2.5 per GPU-hour, within 15M' (search --tokens ...), or ''."""
    from autopar.spec.training_run import money_text, tokens_text

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
        return "exhaustive: every plan of the space evaluated (the fastest is the exact optimum of the cost model)"
    return f"{method}: Optuna sampled the space ({len(s.get('history', []))} trials)"


def rejection_text(counts: dict) -> str:
    """'memory (1,406), microbatches not a multiple of pp (interleaved 1F1B) (66)': how many plans
    each rule rejected, in words (a plan can break several), from search.json's counts over every
    evaluated plan."""
    items = sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: -kv[1])
    return ", ".join(f"{rule_words(k)} ({v:,})" for k, v in items) or "nothing"


def rejection_text_of(plans: pd.DataFrame) -> str:
    """rejection_text counted over the rows of a frame (distinct reason strings split once)."""
    counts: dict[str, int] = {}
    for reasons, n in plans.loc[~plans[FITS].astype(bool), REJECTED_BY].astype(str).value_counts().items():
        for r in reasons.split(", "):
            if r:
                counts[r] = counts.get(r, 0) + int(n)
    return rejection_text(counts)


def _plan_words(row: pd.Series) -> str:
    parts = []
    if int(row["pp"]) > 1:
        parts.append(str(row["pp_schedule"]))
    parts += [
        f"{recompute_label(row['recompute'], row.get('recompute_modules'))} recompute"
        if row["recompute"] != "none"
        else "no recompute",
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
        f"On {where}, {model} trains fastest with {w[PLAN_NAME]} ({_plan_words(w)}): "
        f"{w[STEP_TIME_S]:.3f} s per step, {w[TOKENS_PER_S]:,.0f} tokens/s, {100 * w[MFU]:.1f}% MFU, "
        f"peak memory {w[PEAK_MEMORY_BYTES] / GIB:.1f} of {w[MEMORY_CAPACITY_BYTES] / GIB:.1f} GiB."
    )


#: how to read an 80 % interval (autopar.calibration.uncertainty), shown with the intervals
INTERVAL_NOTE = (
    "How to read the 80 % interval: 80 % of outcomes like this fall inside; built from the "
    "leave-one-source-out errors on published runs of the plan's regime; widened for each thing the plan "
    "does beyond every published run. Support: calibrated when some published run of the plan's profile "
    "does everything it does, extrapolated otherwise (hover the support cell for why)."
)


def has_intervals(run: RunData) -> bool:
    """Whether the run's top plans carry intervals (a run directory from before them does not)."""
    top = top_rows(run)
    return bool(len(top)) and bool(top[LOW[STEP_TIME_S]].notna().any())


def sureness(run: RunData) -> list[str]:
    """How sure the answer is: search.json's `sureness` lines; for a run directory written before
    the search stored them, recomputed from its top plans and the plans it kept
    (autopar.search.results.sureness_lines); [] for a run without intervals."""
    stored = run.sureness
    if stored is not None:
        return stored
    if not has_intervals(run):
        return []
    from autopar.search.results import sureness_lines

    try:
        return sureness_lines(top_rows(run), run.plans)
    except (KeyError, TypeError, ValueError):  # a run with intervals but not every column the lines use
        return []
