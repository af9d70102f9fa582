"""A calibration row (`validate --runs FILE`, the bundled tables) against physical ranges before it is
turned into a case (autopar.calibration.run_cases): a row a user typed may hold anything, and a row that
cannot describe a real run is skipped with the reason, never priced and never a crash.

The ranges: counts (layers, widths, heads, GPUs, parallel sizes, batches) are whole numbers of at
least 1 (shared experts and the like are not read here) and at most the bounds of autopar's own
inputs (autopar.spec.schema); measures are finite and above 0 (tokens/s, step time, TFLOP/s), an MFU
or HFU at most 100 %; the parallel sizes multiply to the GPU count (tp*pp*cp divides num_gpus,
times dp, when the row states it, equals it). The numbers are read as the builder reads them
(autopar.calibration.run_rows.num), so what is checked is what would be priced.
"""

from __future__ import annotations

import math

from autopar.calibration.run_rows import num
from autopar.spec.schema import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_LAYERS, MODEL_LIMITS, MOE_LIMITS

#: a calibration row's global batch, sequences at most: published runs use thousands; the bound
#: keeps the search for a micro-batch that divides the local batch (run_plan) short
MAX_RUN_BATCH = 1 << 20

#: count column -> its highest value (the lowest is 1)
COUNTS = {
    "num_layers": MODEL_LIMITS["num_layers"][1],
    "hidden_size": MODEL_LIMITS["hidden_size"][1],
    "ffn_hidden_size": MODEL_LIMITS["ffn_hidden_size"][1],
    "num_attention_heads": MODEL_LIMITS["num_attention_heads"][1],
    "num_kv_heads": MODEL_LIMITS["num_kv_heads"][1],
    "vocab_size": MODEL_LIMITS["vocab_size"][1],
    "seq_len": MODEL_LIMITS["seq_len"][1],
    "num_experts": MOE_LIMITS["num_experts"][1],
    "moe_top_k": MOE_LIMITS["top_k"][1],
    "expert_ffn_size": MOE_LIMITS["expert_ffn_hidden_size"][1],
    "num_gpus": MAX_GPUS,
    "gpus_per_node": MAX_GPUS_PER_NODE,
    "tp": MAX_GPUS,
    "pp": MAX_GPUS,
    "cp": MAX_GPUS,
    "ep": MAX_GPUS,
    "dp": MAX_GPUS,
    "vpp": MAX_LAYERS,
    "micro_batch_size": MAX_RUN_BATCH,
    "global_batch_size": MAX_RUN_BATCH,
    "grad_accum": MAX_RUN_BATCH,
}
#: measure column -> (its highest value, what it is); each is above 0
MEASURES = {
    "tokens_per_sec_per_gpu": (math.inf, "tokens/s per GPU"),
    "step_time_s": (math.inf, "step time (s)"),
    "tflops_per_gpu": (math.inf, "TFLOP/s per GPU"),
    "mfu": (100.0, "MFU (%)"),
    "hfu": (100.0, "HFU (%)"),
    "dp_derived": (MAX_GPUS, "derived data-parallel size"),
}


def _value(row: dict, key: str) -> tuple[float | None, str | None]:
    """(the number the builder reads, None; None when the cell is empty) or (None, why the cell is
    not a number: 'abc', 'nan', '1.2.3')."""
    cell = row.get(key)
    try:
        v = num(row, key)
    except (ValueError, TypeError, AttributeError):  # '1.2.3', a cell that is not text
        v = None
    if v is None and isinstance(cell, str) and not cell.strip():
        return None, None
    if v is None and cell is not None:
        return None, f"{key} {str(cell)[:40]!r} is not a number"
    return v, None


def _counts(row: dict) -> tuple[dict[str, int], str | None]:
    """The row's stated counts, or the first that is out of its range."""
    out: dict[str, int] = {}
    for key, hi in COUNTS.items():
        v, bad = _value(row, key)
        if bad:
            return out, bad
        if v is None:
            continue
        if not math.isfinite(v) or v != int(v) or not 1 <= v <= hi:
            return out, f"{key} {v:g} must be a whole number from 1 to {hi:,}"
        out[key] = int(v)
    return out, None


def _measures(row: dict) -> str | None:
    for key, (hi, what) in MEASURES.items():
        v, bad = _value(row, key)
        if bad:
            return bad
        if v is not None and not (math.isfinite(v) and 0 < v <= hi):
            top = "" if math.isinf(hi) else f" and at most {hi:g}"
            return f"{what} {v:g} must be a finite number above 0{top}"
    return None


def _layout(c: dict[str, int]) -> str | None:
    """The parallel sizes against the GPU count."""
    if "num_gpus" not in c or "tp" not in c or "pp" not in c:
        return None  # the builder derives the layout, or skips the row
    g, mp = c["num_gpus"], c["tp"] * c["pp"] * c.get("cp", 1)
    if g % mp:
        return f"tp*pp*cp = {mp:,} does not divide num_gpus {g:,}"
    if "dp" in c and mp * c["dp"] != g:
        return f"tp*pp*cp*dp = {mp * c['dp']:,}, not num_gpus {g:,}"
    if c.get("ep", 1) > g:
        return f"ep {c['ep']:,} is more than num_gpus {g:,}"
    return None


def row_problem(row: dict) -> str | None:
    """Why the calibration row cannot describe a real run (the reason it is skipped), or None."""
    rid, _ = _value(row, "row_id")  # a row id that is text is the row's name
    if rid is not None and not math.isfinite(rid):
        return f"row_id {rid:g} is not a finite number"
    counts, bad = _counts(row)
    if bad:
        return bad
    if "num_gpus" not in counts:
        return "num_gpus not stated"
    bad = _measures(row) or _layout(counts)
    if bad:
        return bad
    dpd, _ = _value(row, "dp_derived")
    if dpd is not None and dpd > counts["num_gpus"]:
        return f"dp_derived {dpd:g} is more than num_gpus {counts['num_gpus']:,}"
    h, heads = counts.get("hidden_size"), counts.get("num_attention_heads")
    if h is not None and heads is None and h < 128:  # the builder assumes head dim 128 when heads are not stated
        return f"hidden_size {h:,} without num_attention_heads: the assumed head dim 128 leaves no head"
    if h is not None and heads is not None and heads > h:
        return f"num_attention_heads {heads:,} is more than hidden_size {h:,}: a head would have no width"
    if counts.get("num_kv_heads", 0) > (heads or math.inf):
        return f"num_kv_heads {counts['num_kv_heads']:,} is more than num_attention_heads {heads:,}"
    return None
