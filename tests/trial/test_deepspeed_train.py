"""autopar/trial/deepspeed_train.py, the script autopar ships for measuring a plan with DeepSpeed:
under torchrun (CPU, gloo, 2 ranks, ZeRO-2, 2 micro-batches per step) it trains K steps and
DeepSpeed prints the lines autopar parses (its ThroughputTimer line and, with wall_clock_breakdown,
one `time (ms) | fwd: ..` line per step); what it cannot run is refused with one line, exit 2,
before torch.distributed starts. A run takes about 8 s on 2 cores (no op is JIT-built: the script
skips DeepSpeed's CPU shared-memory op, and the cache directory is checked for it)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.trial.deepspeed_train import main

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "autopar/trial/deepspeed_train.py"
STEPS, WORLD, MBS, GBS = 3, 2, 2, 8
LAUNCH_TIMEOUT_S = 300

#: what autopar's DeepSpeed export writes for a short run (autopar.export.deepspeed `ds_config`, with
#: autopar.export.short_run's steps_per_print 1 and wall_clock_breakdown true)
DS_CONFIG = {
    "_autopar": {"note": "autopar's header: not a DeepSpeed key"},
    "train_batch_size": GBS,
    "train_micro_batch_size_per_gpu": MBS,
    "gradient_accumulation_steps": GBS // (MBS * WORLD),
    "steps_per_print": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True, "reduce_scatter": True},
    "bf16": {"enabled": False},
    "data_types": {"grad_accum_dtype": "fp32"},
    "wall_clock_breakdown": True,
}


def flags(ds_config: Path, **changes: str) -> list[str]:
    """The export's pretrain_gpt.py flags (autopar.export.deepspeed `mds_args`, DS_ARGS, the short-run
    USER_ARGS) for the tiny model; `changes` replaces a flag's value (tensor_model_parallel_size="2")."""
    values = {
        "num_layers": "2",
        "hidden_size": "64",
        "ffn_hidden_size": "128",
        "num_attention_heads": "4",
        "kv_channels": "16",
        "seq_length": "32",
        "max_position_embeddings": "32",
        "normalization": "rmsnorm",
        "rope_theta": "10000",
        "make_vocab_size_divisible_by": "128",
        "attention_dropout": "0",
        "hidden_dropout": "0",
        "tensor_model_parallel_size": "1",
        "pipeline_model_parallel_size": "1",
        "micro_batch_size": str(MBS),
        "global_batch_size": str(GBS),
    } | changes
    model = [x for k, v in values.items() for x in (f"--{k.replace('_', '-')}", v)]
    switches = ["--swiglu", "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights"]
    switches += ["--disable-bias-linear", "--no-pipeline-parallel"]
    ds = ["--deepspeed", "--deepspeed_config", str(ds_config), "--zero-stage", "2"]
    short = f"""--mock-data --tokenizer-type NullTokenizer --vocab-size 256 --train-iters {STEPS} --log-interval 1
        --log-throughput --eval-iters 0 --eval-interval {STEPS} --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine
        --lr-warmup-iters 0 --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95""".split()
    return model + switches + ds + short


def write_config(tmp_path: Path, config: dict = DS_CONFIG) -> Path:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def run_group(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """torchrun in its own process group, the whole group killed at the timeout: killing torchrun
    alone (subprocess.run's timeout) leaves its ranks running."""
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    try:
        out, err = p.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"no answer within {LAUNCH_TIMEOUT_S} s: {(out + err)[-4000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_trains_and_deepspeed_prints_its_step_lines(tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"  # where torch's cpp_extension would JIT-build an op
    env = os.environ | {"DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1", "TORCH_EXTENSIONS_DIR": str(extensions)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD), SCRIPT]
    p = run_group(cmd + flags(write_config(tmp_path)), env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    # DeepSpeed prints its timer lines on rank 0, to stdout (utils/timer.py print_dist, "[Rank 0] "
    # prefix); the global line of each optimizer step, apart from the *_microstep lines
    steps = re.findall(r"^\[Rank 0\] time \(ms\) \| fwd: ([\d.]+) \| bwd: ([\d.]+) .*\| step: ([\d.]+)$", out, re.M)
    assert len(steps) == STEPS, out[-6000:]
    # ThroughputTimer (utils/timer.py, a logger.info on rank 0): its start_step is 2, so the first two
    # optimizer steps are not timed and K steps print K - 2 lines
    speeds = re.findall(r"RunningAvgSamplesPerSec=([\d.e+-]+), CurrSamplesPerSec=([\d.e+-]+), ", out)
    assert len(speeds) == STEPS - 2, out[-6000:]
    batch = re.findall(r"train_batch_size \.+ (\d+)$", out, re.M)  # DeepSpeed's config dump
    assert batch == [str(GBS)]
    running, current = (float(x) for x in speeds[-1])
    assert running > 0 and current > 0
    # CurrSamplesPerSec = train_batch_size / the step's forward-to-step time: the same interval as the
    # last step's fwd + bwd + step timers, up to the engine's own work between them
    step_s = GBS / current
    timed_s = sum(float(x) for x in steps[-1]) / 1000
    assert 0.25 < step_s / timed_s < 4, (step_s, timed_s)
    assert re.search(rf"{SCRIPT}: {STEPS} steps done, world {WORLD}, train_batch_size {GBS}, last loss ", p.stdout)
    # the shared-memory op was not built (skip_shared_memory_op): nothing to wait for, no lock to leave
    assert not list(extensions.glob("*/deepspeed_shm_comm")) and "built successfully" not in out


def test_tensor_parallel_is_refused_before_torch_distributed_starts(tmp_path: Path) -> None:
    """Plain python, no torchrun environment: the script must answer before it needs one."""
    p = subprocess.run(
        [sys.executable, SCRIPT, *flags(write_config(tmp_path), tensor_model_parallel_size="2")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert "data parallel with ZeRO only (tp = pp = 1" in lines[0] and "got tp = 2, pp = 1" in lines[0]
    assert "MEGATRON_DEEPSPEED" in lines[0]


@pytest.mark.parametrize(
    ("changes", "config", "says"),
    [
        ({"pipeline_model_parallel_size": "2"}, {}, "got tp = 1, pp = 2"),
        ({"normalization": "layernorm"}, {}, "only RMSNorm is implemented"),
        ({}, {"train_batch_size": 16}, "train_batch_size is 16 but --global-batch-size says 8"),
        ({}, {"zero_optimization": {"stage": 3}}, "zero_optimization.stage is 3 but --zero-stage says 2"),
    ],
    ids=["pp2", "layernorm", "batch", "zero-stage"],
)
def test_what_it_cannot_run_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, changes: dict, config: dict, says: str
) -> None:
    assert main(flags(write_config(tmp_path, DS_CONFIG | config), **changes)) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err, err


def test_sequence_parallel_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([*flags(write_config(tmp_path)), "--sequence-parallel"]) == 2
    assert "sequence parallel" in capsys.readouterr().err
