"""Bad input on the command line: every case is a real `python -m autopar` subprocess.

Contract (autopar/cli/__init__.py): input a user can fix (autopar.errors.InputError, and typer/click
usage errors) prints ONE line `autopar: error: ...` on stderr, nothing on stdout, exit code 2, and
never a traceback. The line must name the problem: each case asserts key substrings
(case-insensitive).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# every case is a fresh `python -m autopar` process: about 25 s for the module
pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

# Files the cases refer to as {tmp}/NAME; written fresh into each test's tmp_path.
FILES = {
    # HuggingFace config.json with a syntax error (trailing comma, unterminated object)
    "config.json": '{"model_type": "llama", "hidden_size": 4096,\n',
    # YAML syntax error
    "bad.yaml": "num_layers: [1, 2\nhidden_size: :\n",
    # a complete autopar model file plus one field autopar does not know
    "unknown_field.yaml": (
        "num_layers: 2\nhidden_size: 64\nffn_hidden_size: 128\nnum_attention_heads: 4\n"
        "num_kv_heads: 4\nhead_dim: 16\nvocab_size: 100\nseq_len: 128\nbogus_field: 3\n"
    ),
    "negative.yaml": (
        "num_layers: 2\nhidden_size: -64\nffn_hidden_size: 128\nnum_attention_heads: 4\n"
        "num_kv_heads: 4\nhead_dim: 16\nvocab_size: 100\nseq_len: 128\n"
    ),
    "model.txt": "num_layers: 2\n",
    # a config.json of a family autopar does not convert
    "neox/config.json": '{"model_type": "gpt_neox", "hidden_size": 4096, "num_hidden_layers": 44}\n',
    # a llama config.json missing a required key
    "partial/config.json": '{"model_type": "llama", "hidden_size": 4096}\n',
    "cluster_unknown.yaml": "gpu: h100-sxm\nbogus_link: 1\n",
    "cluster_bad.yaml": "gpu: [h100-sxm\n",
    "cluster_negative.yaml": "gpu: h100-sxm\nintra_node_gbps: -5\n",
    "cluster_constants_scalar.yaml": "gpu: h100-sxm\nconstants: 5\n",
    "cluster_negative_constant.yaml": "gpu: h100-sxm\nconstants:\n  gemm_efficiency: -1.0\n",
    "not_runs.csv": "a,b\n1,2\n",
}

E70 = ["estimate", "--model", "llama3-70b", "--gpus", "256"]

# (id, argv after `python -m autopar`, substrings the error line must contain)
CASES = [
    # ---- names --------------------------------------------------------------------------------
    ("unknown-model", ["estimate", "--model", "lama3-70b", "--gpus", "8"], ["did you mean", "llama3-70b"]),
    ("unknown-gpu", E70 + ["--gpu", "h10"], ["did you mean", "h10"]),
    ("unknown-pp-schedule", E70 + ["--tp", "8", "--pp", "4", "--pp-schedule", "foo"], ["schedule", "foo"]),
    ("unknown-recompute", E70 + ["--tp", "8", "--recompute", "partial"], ["recompute", "partial"]),
    ("unknown-dtype", E70 + ["--tp", "8", "--dtype", "fp16"], ["dtype", "fp16"]),
    ("unknown-grads", E70 + ["--tp", "8", "--grads", "fp16"], ["--grads", "fp16"]),
    # ---- model files --------------------------------------------------------------------------
    ("malformed-config-json", ["estimate", "--model", "{tmp}/config.json", "--gpus", "8"], ["config.json", "json"]),
    ("malformed-yaml", ["estimate", "--model", "{tmp}/bad.yaml", "--gpus", "8"], ["bad.yaml", "yaml"]),
    ("yaml-unknown-field", ["estimate", "--model", "{tmp}/unknown_field.yaml", "--gpus", "8"], ["bogus_field"]),
    ("yaml-negative-size", ["estimate", "--model", "{tmp}/negative.yaml", "--gpus", "8"], ["hidden_size", "-64"]),
    ("model-unknown-extension", ["estimate", "--model", "{tmp}/model.txt", "--gpus", "8"], [".txt"]),
    ("config-unknown-model-type", ["estimate", "--model", "{tmp}/neox/config.json", "--gpus", "8"], ["gpt_neox"]),
    ("config-missing-key", ["estimate", "--model", "{tmp}/partial/config.json", "--gpus", "8"], ["num_hidden_layers"]),
    ("missing-model-file", ["estimate", "--model", "{tmp}/nope.yaml", "--gpus", "8"], ["nope.yaml", "exist"]),
    # ---- sizes --------------------------------------------------------------------------------
    ("gpus-zero", ["estimate", "--model", "llama3-70b", "--gpus", "0"], ["--gpus"]),
    # no plan of the space is valid at all (a 4-layer model on a million GPUs, at a sequence too short
    # for cp 4): no answer, not a result
    (
        "search-nothing-valid",
        ["search", "--model", "tiny", "--gpus", "1048576", "--seq-len", "512", "--run-dir", "{tmp}/run"],
        ["no plan of the space is valid", "fewer GPUs"],
    ),
    ("tp-zero", E70 + ["--tp", "0"], ["--tp"]),
    ("mbs-negative", E70 + ["--mbs", "-1"], ["--mbs"]),
    ("gbs-zero", E70 + ["--tp", "8", "--gbs", "0"], ["--gbs"]),
    ("gpus-per-node-zero", E70 + ["--tp", "8", "--gpus-per-node", "0"], ["--gpus-per-node"]),
    ("seq-len-zero", E70 + ["--tp", "8", "--seq-len", "0"], ["--seq-len"]),
    ("gpus-overflow", ["estimate", "--model", "llama3-70b", "--gpus", "99999999999999999999999"], ["gpus"]),
    # ---- layout arithmetic --------------------------------------------------------------------
    ("layout-product-not-gpus", E70 + ["--tp", "8", "--pp", "4", "--dp", "3"], ["96", "256"]),
    ("gpus-not-divisible", ["estimate", "--model", "llama3-70b", "--gpus", "100", "--tp", "8"], ["100", "divide"]),
    (
        "heads-not-divisible-by-tp",
        ["estimate", "--model", "llama3-70b", "--gpus", "24", "--tp", "3"],
        ["64 attention heads", "tp=3"],
    ),
    (
        "kv-heads-not-divisible-by-tp",
        ["estimate", "--model", "llama3-70b", "--gpus", "16", "--tp", "16"],
        ["8 kv heads", "tp=16"],
    ),
    ("fp8-on-a100", E70 + ["--tp", "8", "--pp", "4", "--gpu", "a100-80gb", "--dtype", "fp8"], ["a100-80gb", "fp8"]),
    ("vpp-without-pp", E70 + ["--tp", "8", "--vpp", "2"], ["vpp", "pp > 1"]),
    (
        "vpp-without-interleaved",
        E70 + ["--tp", "8", "--pp", "4", "--vpp", "2", "--pp-schedule", "1f1b"],
        ["vpp", "interleaved"],
    ),
    (
        "interleaved-microbatches-not-multiple-of-pp",
        E70 + ["--tp", "8", "--pp", "4", "--vpp", "2", "--gbs", "24"],
        ["microbatches", "pp=4"],
    ),
    (
        "seq-not-divisible-by-2cp",
        ["estimate", "--model", "llama3-70b", "--gpus", "24", "--cp", "3", "--seq-len", "8192"],
        ["8192", "2*cp"],
    ),
    ("ep-on-dense-model", E70 + ["--tp", "8", "--ep", "2"], ["ep=2", "dense"]),
    (
        "experts-not-divisible-by-ep",
        ["estimate", "--model", "mixtral-8x7b", "--gpus", "24", "--ep", "3"],
        ["8 experts", "ep=3"],
    ),
    (
        "moe-tp-without-sp",
        ["estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--tp", "2", "--no-sp"],
        ["sequence parallelism"],
    ),
    ("gbs-not-divisible-by-mbs-dp", E70 + ["--tp", "8", "--mbs", "3", "--gbs", "100"], ["100", "micro-batch"]),
    ("pp-layout-drops-layer", E70 + ["--tp", "8", "--pp", "4", "--pp-layout", "20,20,20,19"], ["drops", "79"]),
    ("pp-layout-wrong-stage-count", E70 + ["--tp", "8", "--pp", "4", "--pp-layout", "40,40"], ["stages", "pp*vpp"]),
    ("pp-layout-not-numbers", E70 + ["--tp", "8", "--pp", "4", "--pp-layout", "20,a,20,20"], ["--pp-layout"]),
    ("recompute-layers-without-full", E70 + ["--tp", "8", "--recompute-layers", "2"], ["recompute"]),
    ("zero-5", E70 + ["--tp", "8", "--zero", "5"], ["--zero 5"]),
    # ---- trainer and MoE dispatch -------------------------------------------------------------
    ("unknown-trainer", E70 + ["--trainer", "dpeespeed"], ["--trainer", "dpeespeed", "did you mean 'deepspeed'"]),
    (
        "trainer-cannot-run-cp",
        E70 + ["--trainer", "deepspeed", "--cp", "2"],
        ["DeepSpeed cannot run context parallelism", "use --cp 1"],
    ),
    (
        "unknown-moe-dispatch",
        ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--moe-dispatch", "droppy"],
        ["--moe-dispatch", "droppy"],
    ),
    (
        "capacity-factor-below-1",
        ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--capacity-factor", "0.5"],
        ["--capacity-factor", "0.5"],
    ),
    ("capacity-on-dense-model", E70 + ["--moe-dispatch", "capacity"], ["--moe-dispatch capacity", "dense"]),
    (
        "compare-unknown-trainer",
        ["compare", "--model", "llama3-70b", "--gpus", "256", "--tp 8", "--tp 4", "--trainer", "torchtitn"],
        ["--trainer", "torchtitn", "did you mean 'torchtitan'"],
    ),
    (
        "routing-imbalance-below-1",
        ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "4", "--routing-imbalance", "0.5"],
        ["--routing-imbalance"],
    ),
    (
        "routing-imbalance-nan",
        ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "4", "--routing-imbalance", "nan"],
        ["--routing-imbalance"],
    ),
    # ---- cluster files ------------------------------------------------------------------------
    ("cluster-unknown-field", E70 + ["--tp", "8", "--cluster", "{tmp}/cluster_unknown.yaml"], ["bogus_link"]),
    (
        "cluster-malformed-yaml",
        E70 + ["--tp", "8", "--cluster", "{tmp}/cluster_bad.yaml"],
        ["cluster_bad.yaml", "yaml"],
    ),
    (
        "cluster-negative-bandwidth",
        E70 + ["--tp", "8", "--cluster", "{tmp}/cluster_negative.yaml"],
        ["intra_node_gbps"],
    ),
    (
        "cluster-constants-not-a-mapping",
        E70 + ["--tp", "8", "--cluster", "{tmp}/cluster_constants_scalar.yaml"],
        ["constants"],
    ),
    (
        "cluster-negative-constant",
        E70 + ["--tp", "8", "--cluster", "{tmp}/cluster_negative_constant.yaml"],
        ["gemm_efficiency"],
    ),
    ("missing-cluster-file", E70 + ["--tp", "8", "--cluster", "{tmp}/nocluster.yaml"], ["nocluster.yaml", "exist"]),
    # ---- usage errors (typer/click) -----------------------------------------------------------
    ("tp-not-an-integer", E70 + ["--tp", "abc"], ["--tp"]),
    ("routing-imbalance-not-a-number", E70 + ["--routing-imbalance", "x"], ["--routing-imbalance"]),
    ("missing-required-gpus", ["estimate", "--model", "llama3-70b"], ["--gpus"]),
    ("unknown-option", E70 + ["--frobnicate", "1"], ["--frobnicate"]),
    ("unknown-command", ["frobnicate"], ["frobnicate"]),
    # ---- validate -----------------------------------------------------------------------------
    ("validate-missing-runs", ["validate", "--runs", "missing.csv"], ["missing.csv"]),
    ("validate-runs-without-columns", ["validate", "--runs", "{tmp}/not_runs.csv"], ["not_runs.csv", "columns"]),
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONWARNINGS", None)  # warnings must not leak onto stderr under the default filters
    env["COLUMNS"] = "80"
    return env


def _write_files(tmp: Path) -> None:
    for name, text in FILES.items():
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_enough_cases() -> None:
    assert len(CASES) >= 20
    assert len({c[0] for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize("args,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(args: list[str], expected: list[str], tmp_path: Path) -> None:
    _write_files(tmp_path)
    # cwd = tmp_path: {tmp}/NAME and relative paths such as `missing.csv` are resolved there (short
    # paths: an error line quotes a path up to a length, and pytest-xdist's folders are deep)
    argv = [a.replace("{tmp}", ".") for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "autopar", *argv], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120
    )
    shown = f"$ autopar {' '.join(argv)}\nexit {proc.returncode}\n--- stderr\n{proc.stderr}--- stdout\n{proc.stdout}"
    assert "Traceback" not in proc.stderr + proc.stdout, shown
    assert proc.returncode == 2, shown
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"stderr must be exactly one line\n{shown}"
    line = lines[0]
    assert line.startswith("autopar: error:"), shown
    assert line.removeprefix("autopar: error:").strip(), shown
    for word in expected:
        assert word.lower() in line.lower(), f"expected {word!r} in the error line\n{shown}"
    assert proc.stdout == "", f"nothing may be printed on stdout on an input error\n{shown}"
