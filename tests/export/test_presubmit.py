"""`submit_slurm.sh` checks what the job reads from the environment before `sbatch` queues it
(autopar.export.presubmit), run for real under a stub sbatch (script_runner.Stubs): a missing or
wrong DATA_PATH, TOKENIZER or trainer checkout is one line and exit 2 with sbatch never called; a
sound environment submits launch_slurm.sbatch with the extra flags passed through."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from script_runner import Stubs

from autopar.export import ExportOptions, get_exporter
from autopar.export.base import SlurmOptions
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset

MODEL, H100 = get_preset("llama3-8b"), default_cluster("h100-sxm")
PLAN = ParallelPlan(tp=2, dp=8, global_batch_size=64)


def _export(tmp: Path, to: str, **slurm) -> Path:
    bundle = get_exporter(to).render(
        PLAN.with_(trainer="torchtitan", zero_stage=3) if to == "torchtitan" else PLAN,
        MODEL,
        H100,
        ExportOptions(seq_len=8192, slurm=SlurmOptions(**slurm)),
    )
    out = tmp / to
    bundle.write(out)
    return out


def _submit(d: Path, stubs: Stubs, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in stubs.env().items() if k not in ("DATA_PATH", "TOKENIZER")}
    return subprocess.run(
        ["bash", str(d / "submit_slurm.sh"), *args], env=base | env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def world(tmp_path):
    """Stubs, a Megatron-LM checkout with its entry point, and an indexed dataset prefix."""
    stubs = Stubs(tmp_path / "stubs")
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("")
    for ext in (".bin", ".idx"):
        (tmp_path / f"corpus_text_document{ext}").write_text("")
    return stubs, checkout, str(tmp_path / "corpus_text_document")


def _refused(r: subprocess.CompletedProcess, stubs: Stubs, *words: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopar submit: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not stubs.calls("sbatch")


def test_megatron_checks_data_tokenizer_and_checkout_before_sbatch(tmp_path, world) -> None:
    stubs, checkout, prefix = world
    d = _export(tmp_path, "megatron")
    ok = {"MEGATRON_LM": str(checkout), "DATA_PATH": prefix, "TOKENIZER": "meta-llama/Llama-3.1-8B"}
    _refused(_submit(d, stubs, **(ok | {"DATA_PATH": ""})), stubs, "DATA_PATH is not set")
    _refused(_submit(d, stubs, **(ok | {"DATA_PATH": prefix + "x"})), stubs, prefix + "x.bin", "not found")
    _refused(_submit(d, stubs, **(ok | {"TOKENIZER": str(tmp_path / "no-tokenizer")})), stubs, "does not exist")
    _refused(_submit(d, stubs, **(ok | {"MEGATRON_LM": str(tmp_path)})), stubs, "has no pretrain_gpt.py")
    r = _submit(d, stubs, "--dependency=afterok:42", **ok)
    assert r.returncode == 0, r.stderr
    assert stubs.calls("sbatch") == [["--dependency=afterok:42", "launch_slurm.sbatch"]]


def test_a_container_holds_the_checkout(tmp_path, world) -> None:
    stubs, _, prefix = world
    d = _export(tmp_path, "megatron", container_image="nvcr.io/nvidia/nemo:25.11")
    r = _submit(d, stubs, DATA_PATH=prefix, TOKENIZER="gpt2", MEGATRON_LM="/nowhere")
    assert r.returncode == 0, r.stderr
    assert stubs.calls("sbatch") == [["launch_slurm.sbatch"]]


def test_deepspeed_needs_its_own_checkout(tmp_path, world) -> None:
    stubs, checkout, prefix = world
    d = _export(tmp_path, "deepspeed")
    _refused(
        _submit(d, stubs, DATA_PATH=prefix, TOKENIZER="gpt2", MEGATRON_DEEPSPEED=str(checkout / "missing")),
        stubs,
        "MEGATRON_DEEPSPEED",
        "pretrain_gpt.py",
    )
    assert _submit(d, stubs, DATA_PATH=prefix, TOKENIZER="gpt2", MEGATRON_DEEPSPEED=str(checkout)).returncode == 0


def test_torchtitan_reads_nothing_from_the_environment(tmp_path, world) -> None:
    stubs, _, _ = world
    d = _export(tmp_path, "torchtitan")
    r = _submit(d, stubs)
    assert r.returncode == 0, r.stderr
    assert stubs.calls("sbatch") == [["launch_slurm.sbatch"]]


def test_without_sbatch_on_the_path_it_says_where_to_submit(tmp_path, world) -> None:
    stubs, checkout, prefix = world
    d = _export(tmp_path, "megatron")
    env = {"PATH": "/usr/bin:/bin", "MEGATRON_LM": str(checkout), "DATA_PATH": prefix, "TOKENIZER": "gpt2"}
    r = subprocess.run(["bash", str(d / "submit_slurm.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "sbatch not found" in r.stderr
    assert os.access(d / "submit_slurm.sh", os.X_OK)


def test_a_prefix_with_spaces_and_glob_characters_is_one_path(tmp_path, world) -> None:
    stubs, checkout, _ = world
    d = _export(tmp_path, "megatron")
    odd = tmp_path / "my data" / "corp*us [v2]"
    odd.parent.mkdir()
    env = {"MEGATRON_LM": str(checkout), "TOKENIZER": "gpt2", "DATA_PATH": str(odd)}
    _refused(_submit(d, stubs, **env), stubs, "corp*us [v2].bin", "not found")
    for ext in (".bin", ".idx"):
        (odd.parent / f"corp*us [v2]{ext}").write_text("")
    r = _submit(d, stubs, **env)
    assert r.returncode == 0, r.stderr
    assert stubs.calls("sbatch") == [["launch_slurm.sbatch"]]
