"""Rows of published training runs (calibration CSVs): reading them, and turning a row's text into
the source it came from, the trainer family that ran it, its model and its cluster.

Every field a row leaves empty gets an explicit, recorded assumption (the `notes` list), never a
silent guess. The bundled files are the shared calibration tables (rows 1-106, 201-291 and 401-411);
`--runs FILE` reads a user's own table with the same columns.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from autopar.calibration.sources import source_of
from autopar.errors import InputError
from autopar.spec.hardware import ClusterSpec, default_cluster
from autopar.spec.model import ModelSpec
from autopar.spec.presets import get_preset
from autopar.spec.read_file import read_text

BUNDLED = ("calibration_runs.csv", "calibration_runs_4.csv", "calibration_runs_2.csv", "calibration_runs_3.csv")
BUNDLED_ROWS = "rows 1-106, 201-291 and 401-411"
REQUIRED = {"row_id", "model", "num_layers", "hidden_size", "num_gpus", "gpu_type"}
#: a --runs file: bytes and rows at most (the bundled tables: 208 rows, about 220 KiB; a row of a
#: user's own runs is under 1 KiB without notes)
RUNS_BYTES = 32 << 20
MAX_RUN_ROWS = 20_000

#: framework text -> trainer family (the performance profile that prices it: FAMILY_TRAINER)
FAMILIES = (
    (r"DeepSpeed", "deepspeed"),
    (r"AutoModel|Automodel", "fsdp"),  # NeMo AutoModel: PyTorch FSDP2 with TE kernels, not Megatron-Core
    (r"Megatron|NeMo", "megatron"),
    (r"nanotron", "nanotron"),
    (r"Meta internal", "meta"),
    (r"FSDP|torchtitan|Composer|llm-foundry|fms", "fsdp"),
)
#: family -> the trainer its plans name (nanotron and Meta's stack are PyTorch 3D/4D parallelism, the
#: nearest trainer is torchtitan)
FAMILY_TRAINER = {
    "megatron": "megatron",
    "fsdp": "torchtitan",
    "nanotron": "torchtitan",
    "meta": "torchtitan",
    "deepspeed": "deepspeed",
}
#: family -> the performance profile that prices its runs: a trainer's, or a validation-only profile
#: of a framework autopar does not export to (priced as its parent trainer's until fitted)
FAMILY_PROFILE = {
    "megatron": "megatron",
    "fsdp": "torchtitan",
    "nanotron": "nanotron",
    "meta": "meta",
    "deepspeed": "deepspeed",
}
#: a model name without blanks, dots, dashes and underscores -> the preset whose architecture
#: (MoE, MLA) a table cannot spell out
PRESET_BY_NAME = (
    ("deepseek", "deepseek-v3"),
    ("qwen330b", "qwen3-30b-a3b"),
    ("qwen3moe30b", "qwen3-30b-a3b"),
    ("qwen3235b", "qwen3-235b-a22b"),
    ("mixtral8x7b", "mixtral-8x7b"),
    ("gptoss120b", "gpt-oss-120b"),
    ("gptoss20b", "gpt-oss-20b"),
)
VOCAB_BY_FAMILY = (
    ("llama2", 32000, "Llama 2 tokenizer"),
    ("llama 2", 32000, "Llama 2 tokenizer"),
    ("gpt", 50257, "GPT-2 BPE as NeMo GPT3 uses"),
    ("nemotron", 256000, "Nemotron-4 tokenizer"),
)


def bundled_runs() -> list[dict]:
    """The bundled calibration tables, rows 1-106, 201-291 then 401-411."""
    out = []
    for name in BUNDLED:
        text = resources.files("autopar.calibration").joinpath(f"data/{name}").read_text()
        out += list(csv.DictReader(text.splitlines()))
    return out


def load_runs(path: str | Path | None) -> list[dict]:
    """A calibration CSV (None = the bundled tables): user data, read through the one reader
    (autopar.spec.read_file) as UTF-8 with or without the byte-order mark spreadsheets write, at most
    RUNS_BYTES and MAX_RUN_ROWS rows; the header needs the REQUIRED columns (names stripped of
    blanks). The rows' values are checked one by one later (autopar.calibration.run_checks)."""
    if path is None:
        return bundled_runs()
    fix = "pass --runs with a calibration CSV (the columns of calibration_runs.csv)"
    text = read_text(
        path, f"runs file '{path}'", RUNS_BYTES, encoding="utf-8-sig", fix=fix, usual="the bundled tables: 200 KiB"
    )
    rows: list[dict] = []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        reader.fieldnames = [str(h).strip() for h in header]
        for row in reader:
            if len(rows) == MAX_RUN_ROWS:
                raise InputError(
                    f"runs file '{path}' has more than {MAX_RUN_ROWS:,} rows; split it or keep the runs to calibrate on"
                )
            rows.append(row)
    except csv.Error as e:
        raise InputError(f"runs file '{path}' is not a readable CSV ({e}); {fix}") from None
    if not REQUIRED <= set(reader.fieldnames):
        raise InputError(f"runs file '{path}' lacks the calibration columns {sorted(REQUIRED)}; {fix}")
    if not rows:
        raise InputError(f"runs file '{path}' has the calibration columns but no row; add a row per run")
    return rows


# ---- fields ------------------------------------------------------------------------------------


def num(row: dict, key: str) -> float | None:
    v = (row.get(key) or "").strip().rstrip("%").replace(",", "")
    m = re.match(r"^-?[\d.]+(e-?\d+)?", v)
    return float(m.group(0)) if m else None


def integer(row: dict, key: str) -> int | None:
    v = num(row, key)
    return int(v) if v is not None else None


def text(row: dict, key: str) -> str:
    return (row.get(key) or "").strip()


def source_key(row: dict) -> str:
    """The short key of the row's publication (autopar.calibration.sources)."""
    return source_of(text(row, "source")).key


def family(row: dict) -> str:
    fw = text(row, "framework") + " " + text(row, "source")
    for pattern, key in FAMILIES:
        if re.search(pattern, fw):
            return key
    return "megatron"


@dataclass
class PublishedRow:
    """One published run as the parser reads it (its model and cluster here, its plan in
    autopar.calibration.run_plan, its case in autopar.calibration.run_cases): the CSV row, its id, the source's
    key, the trainer family, and the notes of what the parser had to assume."""

    row: dict
    row_id: int
    source: str
    family: str
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, row: dict) -> PublishedRow:
        return cls(row, int(num(row, "row_id") or 0), source_key(row), family(row))

    def num(self, key: str) -> float | None:
        return num(self.row, key)

    def integer(self, key: str) -> int | None:
        return integer(self.row, key)

    def text(self, key: str) -> str:
        return text(self.row, key)


# ---- model ---------------------------------------------------------------------------------------


def row_model(r: PublishedRow, seq_len: int) -> ModelSpec:
    """The architecture: a preset for MoE/MLA models the table cannot spell out, else the row's
    shape with the conventions of its family (MPT, BLOOM, GPT, Llama)."""
    name = r.text("model")
    key = name.lower().replace(".", "").replace(" ", "")
    bare = re.sub(r"[-_]", "", key)
    for pattern, preset in PRESET_BY_NAME:
        if pattern in bare:
            r.notes.append(f"architecture from preset {preset}")
            vocab = r.integer("vocab_size")
            spec = replace(get_preset(preset), seq_len=seq_len)
            if re.search(r"incl\. MTP|w/ MTP", name):
                # DeepSeek-V3's multi-token-prediction module: one more MoE block (and its head) on the
                # last stage (num_nextn_predict_layers 1; Megatron layout 'tmL')
                spec = replace(spec, num_layers=spec.num_layers + 1)
                r.notes.append("MTP module priced as one more MoE layer (num_nextn_predict_layers 1)")
            return replace(spec, vocab_size=vocab) if vocab else spec
    L, h = r.integer("num_layers"), r.integer("hidden_size")
    if not L or not h:
        raise ValueError("architecture (layers, hidden size) not stated")
    heads = r.integer("num_attention_heads")
    if heads is None:
        heads = h // 128
        r.notes.append(f"heads not stated: assumed head dim 128 ({heads} heads)")
    kv = r.integer("num_kv_heads") or heads
    ffn = r.integer("ffn_hidden_size")
    if ffn is None:
        ffn = 4 * h
        r.notes.append("ffn not stated: assumed 4h")
    vocab = r.integer("vocab_size") or _vocab_from_name(key, r.notes)
    style = _style(key, r.family, ffn)
    return ModelSpec(
        name=name,
        num_layers=L,
        hidden_size=h,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=h // heads,
        vocab_size=vocab,
        seq_len=seq_len,
        **style,
    )


def _vocab_from_name(key: str, notes: list[str]) -> int:
    for fam, v, why in VOCAB_BY_FAMILY:
        if fam.replace(" ", "") in key:
            notes.append(f"vocab not stated: assumed {v} ({why})")
            return v
    raise ValueError("vocabulary size not stated")


def _style(key: str, fam: str, ffn: int) -> dict:
    """Architecture conventions by model family: MPT (llm-foundry benchmark models: LayerNorm, GELU,
    tied, learned positions, biases: the printed NumParams counts 9h of biases per layer), BLOOM
    (LayerNorm, GELU, tied, biases, ALiBi), GPT (Megatron GPT: LayerNorm, GELU, tied), Llama and the
    nanotron/torchtitan/fms Llama-style models (RMSNorm, SwiGLU, untied; nanotron ties embeddings below
    intermediate 10000, scaling_benchmarks.py)."""
    if key.startswith("mpt"):
        return dict(
            gated_mlp=False, tied_embeddings=True, norm="layernorm", learned_position_embeddings=True, linear_bias=True
        )
    if "bloom" in key:
        return dict(gated_mlp=False, tied_embeddings=True, norm="layernorm", linear_bias=True)
    if "llama" in key:
        return dict(gated_mlp=True, tied_embeddings=fam == "nanotron" and ffn < 10000, norm="rmsnorm")
    return dict(gated_mlp=False, tied_embeddings=True, norm="layernorm")


# ---- cluster -------------------------------------------------------------------------------------

GPU_PATTERNS = (
    (r"gb300", "gb300"),
    (r"gb200", "gb200"),
    (r"b200", "b200"),
    (r"h200", "h200"),
    (r"hbm2e", "h100-96gb-hbm2e"),
    (r"a100.*40", "a100-40gb"),
    (r"a100", "a100-80gb"),
    (r"h800", "h800"),
    (r"h100", "h100-sxm"),
)


def row_cluster(r: PublishedRow) -> ClusterSpec:
    """The GPU preset, the NVLink domain (NVL72 racks: the rack, or what the source says) and the
    scale-out bandwidth per GPU where the row states a per-node figure."""
    g = r.text("gpu_type").lower()
    key = next((k for pattern, k in GPU_PATTERNS if re.search(pattern, g)), None)
    if key is None:
        raise ValueError(f"GPU '{r.text('gpu_type')}' has no preset")
    inter = r.text("interconnect")
    domain = re.search(r"every (\d+) GPUs[^;]*NVL domain|NVLink domain (\d+)", inter)
    per_node = r.integer("gpus_per_node")
    if domain:
        per_node = int(domain.group(1) or domain.group(2))
    elif key in ("gb200", "gb300"):
        per_node = 72
    cluster = default_cluster(key, per_node if per_node and per_node >= 8 else None)
    nic = _nic_per_gpu(inter, cluster.gpus_per_node if key not in ("gb200", "gb300") else 4)
    if nic is not None and abs(nic - cluster.inter_node_gbps) > 1e-9:
        r.notes.append(f"scale-out {nic:g} GB/s per GPU from '{inter[:60]}'")
        cluster = replace(cluster, inter_node_gbps=nic)
    return cluster


def _nic_per_gpu(inter: str, gpus_per_host: int) -> float | None:
    """Per-GPU scale-out GB/s from an interconnect text: 'N Gbps' per node (llm-foundry, fms-fsdp)
    unless it says per GPU; Omni-Path '4 OPA links per node' at 100 Gb/s each (BLOOM's Jean Zay)."""
    if not inter:
        return None
    opa = re.search(r"(\d+) OPA links per node", inter)
    if opa:
        return int(opa.group(1)) * 100 / 8 / gpus_per_host
    m = re.search(r"(\d+) ?Gbps", inter)
    if not m or re.search(r"per GPU", inter):
        return None
    return int(m.group(1)) / 8 / gpus_per_host
