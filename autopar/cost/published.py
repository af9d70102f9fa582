"""Published training runs (calibration_runs.csv): turn each row into (model, cluster, plan), predict
it, and compare with what was measured.

Every field a row leaves empty gets an explicit, recorded assumption; a row that cannot be turned
into a plan is listed with the reason. Throughput is compared in the units the row has:
tokens/s/GPU, step time, or model TFLOP/s/GPU converted to tokens/s/GPU with the FLOPs convention of
its source (Megatron before 2025-03 and NeMo count full, non-causal attention; Narayanan et al. 2021
count recompute: 96*B*s*l*h^2*(1 + s/6h + V/16lh)).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from autopar.cost.estimate import estimate_table
from autopar.cost.flops import model_flops_per_step, padded_vocab
from autopar.errors import InputError
from autopar.spec.hardware import ClusterSpec, CostConstants, default_cluster
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan, PlanError
from autopar.spec.presets import get_preset
from autopar.spec.rules import plan_problems
from autopar.spec.table import PlanTable

PRESET_BY_NAME = (("deepseek", "deepseek-v3"), ("qwen3_30b", "qwen3-30b-a3b"), ("qwen3_235b", "qwen3-235b-a22b"))
VOCAB_BY_FAMILY = (("llama2", 32000, "Llama 2 tokenizer"), ("gpt", 50257, "GPT-2 BPE as NeMo GPT3 uses"),
                   ("nemotron", 256000, "Nemotron-4 tokenizer"))


def default_runs_path() -> Path:
    """../shared/reference/calibration_runs.csv next to the project (looked up from the working
    directory and from the package), else the project's own copy (autopar/cost/data/)."""
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *Path.cwd().parents, here.parents[2]]:
        for p in (base / "shared" / "reference" / "calibration_runs.csv",
                  base.parent / "shared" / "reference" / "calibration_runs.csv"):
            if p.is_file():
                return p
    return here.parent / "data" / "calibration_runs.csv"


def load_runs(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"runs file '{path}' does not exist; pass --runs with a calibration CSV")
    with p.open(newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"row_id", "model", "num_layers", "hidden_size", "num_gpus", "gpu_type"}
    if not rows or not need <= set(rows[0]):
        raise InputError(f"runs file '{path}' lacks the calibration columns {sorted(need)}")
    return rows


@dataclass
class RunCase:
    row_id: str
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    seq_len: int
    metric: str  # "tokens/s/GPU" | "step time s" | "TFLOP/s/GPU"
    published: float
    tokens_per_flop_scale: float  # published TFLOP/s -> tokens/s/GPU: TFLOP/s * 1e12 * this
    assumptions: list[str] = field(default_factory=list)


@dataclass
class RowResult:
    case: RunCase
    predicted: float
    error: float  # (predicted - published) / published, on throughput

    def to_dict(self) -> dict:
        c = self.case
        return {"row_id": c.row_id, "model": c.name, "gpus": c.plan.num_gpus, "gpu": c.cluster.gpu.key,
                "layout": c.plan.describe(), "metric": c.metric, "published": c.published,
                "predicted": self.predicted, "error": self.error, "assumptions": c.assumptions}


@dataclass
class ValidationResult:
    rows: list[RowResult]
    skipped: list[tuple[str, str, str]]  # (row_id, model, reason)

    @property
    def errors(self) -> np.ndarray:
        return np.array([r.error for r in self.rows])

    @property
    def mape(self) -> float:
        return float(np.mean(np.abs(self.errors))) if self.rows else math.nan

    @property
    def max_error(self) -> float:
        return float(np.max(np.abs(self.errors))) if self.rows else math.nan

    def to_dict(self) -> dict:
        return {"evaluated": len(self.rows), "skipped": len(self.skipped), "mape": self.mape,
                "max_abs_error": self.max_error, "rows": [r.to_dict() for r in self.rows],
                "skipped_rows": [{"row_id": i, "model": m, "reason": r} for i, m, r in self.skipped]}


def _num(row: dict, key: str) -> float | None:
    v = (row.get(key) or "").strip().rstrip("%").replace(",", "")
    m = re.match(r"^-?[\d.]+(e-?\d+)?", v)
    return float(m.group(0)) if m else None


def _int(row: dict, key: str) -> int | None:
    v = _num(row, key)
    return int(v) if v is not None else None


def _model(row: dict, seq_len: int, notes: list[str]) -> ModelSpec:
    name = row["model"]
    key = name.lower().replace(".", "").replace(" ", "")
    for pattern, preset in PRESET_BY_NAME:
        if pattern in key:
            notes.append(f"architecture from preset {preset}")
            return replace(get_preset(preset), seq_len=seq_len)
    L, h = _int(row, "num_layers"), _int(row, "hidden_size")
    if not L or not h:
        raise ValueError("architecture (layers, hidden size) not stated")
    llama = "llama" in key
    heads = _int(row, "num_attention_heads")
    if heads is None:
        heads = h // 128
        notes.append(f"heads not stated: assumed head dim 128 ({heads} heads)")
    kv = _int(row, "num_kv_heads") or heads
    ffn = _int(row, "ffn_hidden_size")
    if ffn is None:
        ffn = 4 * h
        notes.append("ffn not stated: assumed 4h")
    vocab = _int(row, "vocab_size")
    if vocab is None:
        for fam, v, why in VOCAB_BY_FAMILY:
            if fam in key:
                vocab = v
                notes.append(f"vocab not stated: assumed {v} ({why})")
                break
        else:
            raise ValueError("vocabulary size not stated")
    return ModelSpec(name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn, num_attention_heads=heads,
                     num_kv_heads=kv, head_dim=h // heads, vocab_size=vocab, seq_len=seq_len, gated_mlp=llama,
                     tied_embeddings=not llama, norm="rmsnorm" if llama else "layernorm")


def _cluster(row: dict) -> ClusterSpec:
    g = row["gpu_type"].lower()
    key = "a100-80gb" if "a100" in g and "80" in g else "a100-40gb" if "a100" in g else "h100-sxm" if "h100" in g else None
    if key is None:
        raise ValueError(f"GPU '{row['gpu_type']}' has no preset")
    return default_cluster(key, _int(row, "gpus_per_node") or None)


def _flops_convention_scale(row_id: int, model: ModelSpec, s: int, tp: int) -> tuple[float, str]:
    """1 / (FLOPs per token) under the convention the row's source used for its TFLOP/s."""
    L, h, V = model.num_layers, model.hidden_size, int(padded_vocab(model, tp))
    if 10 <= row_id <= 19:  # Narayanan et al. 2021 appendix, full recompute (4 passes)
        per_token = 96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        return 1.0 / per_token, "TFLOP/s per Narayanan et al. 2021 (96*B*s*l*h^2, counts recompute)"
    if 40 <= row_id <= 48:  # NeMo long-sequence doc at a 2025+ HEAD: Megatron-Core's causal count
        return 1.0 / float(model_flops_per_step(model, 1, s, tp) / s), \
            "TFLOP/s per current Megatron-Core (causal attention halved; the doc is at a 2025+ NeMo HEAD)"
    q = model.q_size / h
    gl = 1.5 if model.gated_mlp else 1.0
    per_token = 12 * L * h * h * ((1 + model.num_kv_heads / model.num_attention_heads + s / h) * q
                                  + model.ffn_hidden_size / h * gl + V / (2 * L * h))
    return 1.0 / per_token, "TFLOP/s per Megatron <2025-03 / NeMo (full, non-causal attention)"


def build_case(row: dict) -> RunCase:
    """One CSV row as a runnable case; raises ValueError with the reason it cannot be."""
    notes: list[str] = []
    rid = int(row["row_id"])
    s = _int(row, "seq_len")
    if not s:
        raise ValueError("sequence length not stated")
    model = _model(row, s, notes)
    cluster = _cluster(row)
    G = _int(row, "num_gpus")
    tp, pp = _int(row, "tp"), _int(row, "pp")
    if tp is None or pp is None:
        dpd = _num(row, "dp_derived")
        if dpd is None or not G:
            raise ValueError("tp/pp not stated and model-parallel size unknown")
        mp = round(G / dpd)
        tp = min(mp, cluster.gpus_per_node)
        pp = mp // tp
        notes.append(f"only model-parallel size {mp} stated: assumed tp={tp}, pp={pp}")
    cp = _int(row, "cp") or 1
    vpp = _int(row, "vpp") or 1
    ep = _int(row, "ep") or 1
    dp = G // (tp * pp * cp)
    if dp * tp * pp * cp != G:
        raise ValueError(f"tp*pp*cp = {tp * pp * cp} does not divide {G} GPUs")
    mbs = _int(row, "micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch not stated: assumed 1")
    gbs = _int(row, "global_batch_size")
    if not gbs:
        raise ValueError("global batch not stated")
    rec_text = (row.get("recompute") or "").lower()
    if "full" in rec_text:
        recompute = "full"
    elif "selective" in rec_text:
        recompute = "selective"
    elif 10 <= rid <= 19:
        recompute = "full"
        notes.append("recompute not stated: assumed full (Narayanan et al. 2021 used activation recomputation)")
    else:
        recompute = "none"
        notes.append("recompute not stated: assumed none")
    sp_text = (row.get("sequence_parallel") or "").lower()
    sp = {"on": True, "off": False}.get(sp_text, tp > 1)
    if sp_text not in ("on", "off"):
        notes.append(f"SP not stated: assumed {'on' if sp else 'off'}")
    old = rid <= 27
    zero = 0 if old else 1
    notes.append("no distributed optimizer (pre-2023 Megatron)" if old else "distributed optimizer assumed")
    dtype = "fp8" if "fp8" in (row.get("precision") or "").lower() else "bf16"
    etp = None
    if model.moe is not None:
        etp = 1
        notes.append("expert-TP not stated: assumed 1 (Megatron-Bridge MoE recipes)")
    overlap = "--tp-comm-overlap" in (row.get("notes") or "") or rid >= 28
    if overlap and tp > 1:
        notes.append("TP comm overlap on" + ("" if rid < 28 else " (assumed: NeMo/Megatron-Bridge H100 recipes enable it)"))
    if vpp > 1 and (gbs // (mbs * dp)) % pp:
        raise ValueError("interleaved schedule needs microbatches % pp == 0")
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, zero_stage=zero,
                        sequence_parallel=sp and tp > 1, micro_batch_size=mbs, global_batch_size=gbs,
                        recompute=recompute, dtype=dtype, tp_comm_overlap=overlap and tp > 1)
    problems = plan_problems(plan, model, num_gpus=G, cluster=cluster, seq_len=s)
    if problems:
        raise ValueError("; ".join(problems))
    tok = _num(row, "tokens_per_sec_per_gpu")
    step = _num(row, "step_time_s")
    tfl = _num(row, "tflops_per_gpu")
    scale, conv = _flops_convention_scale(rid, model, s, tp)
    if tok:
        metric, published = "tokens/s/GPU", tok
    elif step:
        metric, published = "step time s", step
    elif tfl:
        metric, published = "TFLOP/s/GPU", tfl
        notes.append(conv)
    else:
        raise ValueError("no throughput measure (tokens/s, step time or TFLOP/s)")
    return RunCase(row_id=row["row_id"], name=row["model"], model=model, cluster=cluster, plan=plan, seq_len=s,
                   metric=metric, published=published, tokens_per_flop_scale=scale, assumptions=notes)


def build_cases(rows: list[dict]) -> tuple[list[RunCase], list[tuple[str, str, str]]]:
    cases, skipped = [], []
    for row in rows:
        try:
            cases.append(build_case(row))
        except (ValueError, PlanError, InputError) as e:
            skipped.append((row.get("row_id", "?"), row.get("model", "?"), str(e)))
    return cases, skipped


def predict(case: RunCase, constants: CostConstants | None = None) -> tuple[float, float]:
    """(predicted value in the row's metric, error on throughput)."""
    cluster = case.cluster if constants is None else replace(case.cluster, constants=constants)
    cols = estimate_table(PlanTable.from_plans([case.plan]), case.model, cluster, num_gpus=case.plan.num_gpus,
                          seq_len=case.seq_len)
    step = float(cols["step_time_s"][0])
    tok_gpu = float(cols["tokens_per_s_per_gpu"][0])
    if case.metric == "tokens/s/GPU":
        return tok_gpu, tok_gpu / case.published - 1
    if case.metric == "step time s":
        return step, case.published / step - 1
    published_tok = case.published * 1e12 * case.tokens_per_flop_scale
    return tok_gpu / (1e12 * case.tokens_per_flop_scale), tok_gpu / published_tok - 1


def evaluate_cases(cases: list[RunCase], skipped, constants: CostConstants | None = None) -> ValidationResult:
    rows = []
    for c in cases:
        pred, err = predict(c, constants)
        rows.append(RowResult(case=c, predicted=pred, error=err))
    return ValidationResult(rows=rows, skipped=skipped)


def evaluate_runs(rows: list[dict], constants: CostConstants | None = None) -> ValidationResult:
    cases, skipped = build_cases(rows)
    return evaluate_cases(cases, skipped, constants)


@dataclass
class RunsFit:
    fit: "object"  # autopar.cost.fit.FitResult
    result: ValidationResult


def fit_to_runs(rows: list[dict], start: CostConstants | None = None) -> RunsFit:
    """Fit the efficiency constants to the evaluable rows (autopar.cost.fit)."""
    from autopar.cost.fit import fit_constants

    cases, skipped = build_cases(rows)
    fitted = fit_constants(lambda k: np.array([predict(c, k)[1] for c in cases]), start or CostConstants())
    return RunsFit(fit=fitted, result=evaluate_cases(cases, skipped, fitted.constants))
