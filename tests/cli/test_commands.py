"""The commands end to end, as real `python -m autopar` subprocesses: estimate (JSON schema and
its internal consistency, human tables), models, hardware, validate, and a valid plan that does
not fit (a verdict, not an error)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from autopar.spec.hardware import LOCAL_DEFAULTS, gpu_names
from autopar.spec.presets import preset_names

REPO = Path(__file__).resolve().parents[2]

GBS, SEQ, GPUS = 512, 8192, 256
ESTIMATE_70B = [
    "estimate",
    "--model",
    "70b",
    "--gpus",
    str(GPUS),
    "--tp",
    "8",
    "--pp",
    "4",
    "--seq-len",
    str(SEQ),
    "--gbs",
    str(GBS),
]
DOES_NOT_FIT = ["estimate", "--model", "llama3-70b", "--gpus", "8", "--tp", "8"]

MEMORY_KEYS = {"weights", "gradients", "optimizer", "activations", "other"}
TIME_KEYS = {"compute", "tp", "cp", "ep", "pp", "dp", "bubble"}
COMM_KEYS = {"tp", "cp", "ep", "pp", "dp"}
NUMBER_KEYS = (
    "peak_memory_bytes",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "model_tflops_per_gpu",
    "mfu",
    "hfu",
    "bubble_fraction",
    "params_total",
    "params_per_gpu",
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONWARNINGS", None)
    env["COLUMNS"] = "120"  # piped output honours COLUMNS: a 120-column terminal
    return env


@cache
def autopar(*args: str) -> subprocess.CompletedProcess:
    """Run `python -m autopar ARGS` from the repository root (cached: commands are deterministic)."""
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300
    )


def ok(*args: str) -> str:
    """stdout of a command that must succeed quietly."""
    p = autopar(*args)
    shown = f"$ autopar {' '.join(args)}\nexit {p.returncode}\n--- stderr\n{p.stderr}"
    assert p.returncode == 0, shown
    assert "Traceback" not in p.stderr, shown
    assert p.stderr == "", shown
    return p.stdout


def flat(text: str) -> str:
    """Whitespace collapsed, so table titles that rich wraps over several lines still match."""
    return " ".join(text.split())


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---- estimate --json -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def est() -> dict:
    return json.loads(ok(*ESTIMATE_70B, "--json"))


def test_estimate_json_has_the_schema(est: dict) -> None:
    assert isinstance(est["fits"], bool)
    assert isinstance(est["reasons"], list) and all(isinstance(r, str) for r in est["reasons"])
    for key in NUMBER_KEYS:
        assert is_number(est[key]), (key, est.get(key))
        assert est[key] >= 0, (key, est[key])
    assert MEMORY_KEYS <= set(est["memory_bytes"])
    assert TIME_KEYS <= set(est["time_s"])
    assert COMM_KEYS <= set(est["comm_bytes_per_gpu"])
    for group in ("memory_bytes", "time_s", "comm_bytes_per_gpu"):
        for k, v in est[group].items():
            assert is_number(v) and v >= 0, (group, k, v)
    assert isinstance(est["plan"], dict)


def test_estimate_json_values_are_sane(est: dict) -> None:
    assert est["fits"] is True and est["reasons"] == []
    plan = est["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"], plan["cp"]) == (8, 4, 8, 1)
    assert plan["global_batch_size"] == GBS
    assert 0 < est["peak_memory_bytes"] <= 200 * 2**30
    assert est["step_time_s"] > 0
    assert 0 < est["mfu"] <= 1 and est["mfu"] <= est["hfu"] <= 1
    assert 0 <= est["bubble_fraction"] < 1
    assert est["params_total"] == pytest.approx(70.6e9, rel=0.01)
    # 70B over tp8 x pp4: about 1/32 of the weights (plus embedding / head) per GPU
    assert est["params_total"] / 32 <= est["params_per_gpu"] < est["params_total"] / 16
    assert est["memory_bytes"]["weights"] > 0 and est["memory_bytes"]["activations"] > 0
    assert est["time_s"]["compute"] > 0 and est["time_s"]["bubble"] > 0  # pp 4: a bubble
    assert est["comm_bytes_per_gpu"]["tp"] > 0 and est["comm_bytes_per_gpu"]["pp"] > 0
    assert est["comm_bytes_per_gpu"]["dp"] > 0
    assert est["comm_bytes_per_gpu"]["cp"] == 0 and est["comm_bytes_per_gpu"]["ep"] == 0


def test_estimate_json_memory_terms_sum_to_peak(est: dict) -> None:
    assert sum(est["memory_bytes"].values()) == pytest.approx(est["peak_memory_bytes"], rel=1e-9)


def test_estimate_json_time_terms_sum_to_step(est: dict) -> None:
    assert sum(est["time_s"].values()) == pytest.approx(est["step_time_s"], rel=1e-9)


def test_estimate_json_throughput_is_tokens_over_step_time(est: dict) -> None:
    assert est["tokens_per_s"] == pytest.approx(GBS * SEQ / est["step_time_s"], rel=1e-9)
    assert est["tokens_per_s_per_gpu"] == pytest.approx(est["tokens_per_s"] / GPUS, rel=1e-9)


# ---- estimate (human) ----------------------------------------------------------------------------


def test_estimate_human_output_has_verdict_and_tables() -> None:
    out = flat(ok(*ESTIMATE_70B))
    assert "FITS" in out or "DOES NOT FIT" in out
    for title in ("Memory per GPU", "Step time", "Communication per GPU per step", "Throughput"):
        assert title in out, title
    assert "llama3-70b" in out


# ---- a valid plan that does not fit: a verdict, exit 0 -------------------------------------------


def test_plan_that_does_not_fit_is_a_verdict_not_an_error() -> None:
    out = ok(*DOES_NOT_FIT)
    assert "DOES NOT FIT" in out
    assert "GiB" in out


def test_plan_that_does_not_fit_json() -> None:
    d = json.loads(ok(*DOES_NOT_FIT, "--json"))
    assert d["fits"] is False
    assert d["valid"] is True
    assert d["reasons"] and any("GiB" in r for r in d["reasons"]), d["reasons"]
    assert d["peak_memory_bytes"] > d["memory_capacity_bytes"]


def test_dtype_defaults_to_what_the_hardware_trains_in(tmp_path: Path) -> None:
    """bf16 on a GPU; fp32 on the CPU `local` profile, the dtype its trials run in."""
    gpu = json.loads(ok("estimate", "--model", "tiny", "--gpus", "2", "--gpu", "h100-sxm", "--json"))
    assert gpu["plan"]["dtype"] == "bf16"
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(LOCAL_DEFAULTS))  # the unprobed local defaults
    env = _env() | {"AUTOPAR_LOCAL_PROFILE": str(tmp_path / "local.yaml")}
    p = subprocess.run(
        [sys.executable, "-m", "autopar", "estimate", "--model", "tiny", "--gpus", "2", "--gpu", "local", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["plan"]["dtype"] == "fp32"
    forced = json.loads(
        ok("estimate", "--model", "tiny", "--gpus", "2", "--gpu", "h100-sxm", "--dtype", "fp32", "--json")
    )
    assert forced["plan"]["dtype"] == "fp32"


# ---- models / hardware ---------------------------------------------------------------------------


def test_models_lists_every_preset() -> None:
    out = ok("models")
    missing = [n for n in preset_names() if n not in out]
    assert not missing, f"`autopar models` (120 columns) does not show {missing}\n{out}"


def test_models_json_lists_every_preset() -> None:
    rows = json.loads(ok("models", "--json"))
    assert [r["name"] for r in rows] == preset_names()
    for r in rows:
        assert 0 < r["params_active"] <= r["params_total"], r["name"]


def test_hardware_lists_every_gpu() -> None:
    out = ok("hardware")
    missing = [n for n in gpu_names() if n not in out]
    assert not missing, f"`autopar hardware` (120 columns) does not show {missing}\n{out}"


def test_hardware_json_lists_every_gpu() -> None:
    rows = json.loads(ok("hardware", "--json"))
    assert [r["key"] for r in rows] == gpu_names()
    for r in rows:
        assert r["bf16_tflops"] > 0 and r["hbm_gib"] > 0, r["key"]


def test_no_arguments_prints_help() -> None:
    p = autopar()
    assert p.returncode == 0, p.stderr
    for cmd in ("estimate", "models", "hardware", "validate"):
        assert cmd in p.stdout


# ---- validate ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def validation() -> dict:
    return json.loads(ok("validate", "--json"))


def test_validate_accuracy_acceptance(validation: dict) -> None:
    """Acceptance criterion: >= 40 published runs evaluated, MAPE <= 15% on throughput."""
    assert validation["evaluated"] >= 120
    primary = [r for r in validation["rows"] if not r["dropless"]]
    assert len(primary) == validation["evaluated"]
    assert is_number(validation["mape"]) and validation["mape"] <= 0.15


def test_validate_every_skipped_row_has_a_reason(validation: dict) -> None:
    skipped = validation["skipped_rows"]
    assert len(skipped) == validation["skipped"]
    for row in skipped:
        assert isinstance(row["reason"], str) and row["reason"].strip(), row


def test_validate_rows_are_consistent(validation: dict) -> None:
    for r in validation["rows"]:
        assert is_number(r["published"]) and r["published"] > 0, r["row_id"]
        assert is_number(r["predicted"]) and r["predicted"] > 0, r["row_id"]
        # the error is on throughput: for a step-time row, throughput is 1 / step time
        ratio = r["published"] / r["predicted"] if r["metric"] == "step time s" else r["predicted"] / r["published"]
        assert r["error"] == pytest.approx(ratio - 1, rel=1e-6, abs=1e-12), r["row_id"]
    errors = [abs(r["error"]) for r in validation["rows"] if not r["dropless"]]
    assert validation["mape"] == pytest.approx(sum(errors) / len(errors), rel=1e-9)
    assert validation["max_abs_error"] == pytest.approx(max(errors), rel=1e-9)
