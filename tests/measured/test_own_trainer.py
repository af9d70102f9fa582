"""`autopar search --trials K --measure-with TRAINER` end to end with stand-in trainers
(tests/measured/standin_trainer.py prints each trainer's own step lines and raises real errors):
the export set for a short run, its launch_torchrun.sh under torchrun, the log parsed, out of
memory recorded as "does not fit" and a crash as "fails" with the trainer's error line, and the
calibration. Also the up-front checks of where a trainer lives (one line, exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autopar.measured.hygiene import kill_token, processes_with_token

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
AUTOPAR = [sys.executable, "-m", "autopar"]

pytestmark = pytest.mark.timeout(600)


def _wrapper(trainer: str) -> str:
    return f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport standin_trainer\nstandin_trainer.main({trainer!r})\n"


NEMO_RUN = f"""import sys
sys.path.insert(0, {str(HERE)!r})
import standin_trainer


class Config:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def run(recipe, direct=False):
    standin_trainer.main("nemo", recipe)
"""

NEMO_RECIPE = """class Node:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        child = Node()
        setattr(self, name, child)
        return child


def pretrain_recipe(name, num_nodes, num_gpus_per_node):
    recipe = Node()
    recipe.trainer.max_steps = 1000
    recipe.trainer.strategy.tensor_model_parallel_size = 1
    recipe.trainer.strategy.context_parallel_size = 1
    recipe.model.config.recompute_granularity = None
    recipe.data.micro_batch_size = 1
    recipe.trainer.callbacks = []
    return recipe
"""


def _home(tmp_path: Path, trainer: str) -> dict[str, str]:
    """Where the stand-in lives for `trainer`, as the environment that names it."""
    env = {"STANDIN_STATE": str(tmp_path / "state")}
    if trainer == "megatron":
        (tmp_path / "Megatron-LM").mkdir()
        (tmp_path / "Megatron-LM" / "pretrain_gpt.py").write_text(_wrapper("megatron"))
        return env | {"MEGATRON_LM": str(tmp_path / "Megatron-LM")}
    if trainer == "bridge":
        d = tmp_path / "Megatron-Bridge" / "scripts" / "training"
        d.mkdir(parents=True)
        (d / "run_recipe.py").write_text(_wrapper("bridge"))
        return env | {"MEGATRON_BRIDGE": str(tmp_path / "Megatron-Bridge")}
    py = tmp_path / "py"
    if trainer == "torchtitan":
        (py / "torchtitan").mkdir(parents=True)
        (py / "torchtitan" / "__init__.py").write_text("")
        (py / "torchtitan" / "train.py").write_text(_wrapper("torchtitan"))
    else:  # nemo
        (py / "nemo_run").mkdir(parents=True)
        (py / "nemo_run" / "__init__.py").write_text(NEMO_RUN)
        recipes = py / "nemo" / "collections" / "llm" / "recipes"
        recipes.mkdir(parents=True)
        for d in (py / "nemo", py / "nemo" / "collections", py / "nemo" / "collections" / "llm", recipes):
            (d / "__init__.py").write_text("")
        (recipes / "llama32_1b.py").write_text(NEMO_RECIPE)
    return env | {"PYTHONPATH": str(py) + os.pathsep + str(REPO)}


def _search(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full = dict(os.environ) | env
    full["PYTHONPATH"] = env.get("PYTHONPATH", str(REPO))
    steps = ["--trial-steps", "3"] if "--trials" in args else []  # a stage flag alone is refused
    return subprocess.run(
        # relative, as users write it: the launch runs in another directory (a bug once)
        [*AUTOPAR, "search", *args, "--run-dir", "run", *steps],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        timeout=500,
    )


#: a `--gpu local` profile (AUTOPAR_LOCAL_PROFILE) with room for an 8B model on 2 ranks
ROOMY_LOCAL_PROFILE = """name: a roomy local profile (tests)
gpu: {key: local, name: this machine, bf16_tflops: 0.1, fp8_tflops: 0.0, hbm_gib: 4096.0, hbm_gbps: 10.0,
      intra_node_gbps: 2.0, nic_gbps: 2.0, gpus_per_node: 2, source: a test's assumption}
intra_node_latency_us: 50.0
inter_node_latency_us: 50.0
"""


def _docs(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "trials").glob("*.json"))]


def _expected_step(plan: dict) -> float:
    """The stand-in's step time (standin_trainer._step_seconds): the median after the warm-up."""
    recompute = 0.02 if plan["recompute"] != "none" else 0.0
    return 0.2 + 0.05 / plan["micro_batch_size"] + 0.03 * plan["tp"] + 0.01 * plan["cp"] + recompute


@pytest.mark.parametrize(
    "trainer,extra",
    [
        ("megatron", ["--model", "tiny", "--gpu", "local"]),
        ("bridge", ["--model", "tiny", "--gpu", "local", "--dtype", "bf16", "--recipe", "llama32_1b_pretrain_config"]),
        ("nemo", ["--model", "tiny", "--gpu", "local", "--dtype", "bf16", "--recipe", "llama32_1b"]),
        # torchtitan has configs for presets only: llama3-8b, on a local profile with room for it
        ("torchtitan", ["--model", "llama3-8b", "--gpu", "local", "--seq-len", "512"]),
    ],
    ids=["megatron", "bridge", "nemo", "torchtitan"],
)
def test_stand_in_trainer_end_to_end(tmp_path, trainer, extra):
    """4 plans measured with the trainer: ok, out of memory, ok, crash; the two that ran calibrate."""
    env = _home(tmp_path, trainer) | {"STANDIN_PLAN": "ok,oom,ok,crash"}
    if trainer == "torchtitan":
        (tmp_path / "roomy.yaml").write_text(ROOMY_LOCAL_PROFILE)
        env["AUTOPAR_LOCAL_PROFILE"] = str(tmp_path / "roomy.yaml")
    r = _search(tmp_path, [*extra, "--gpus", "2", "--trials", "4", "--measure-with", trainer], env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"Measured stage with {trainer}" in r.stdout
    docs = {d["key"]: d for d in _docs(tmp_path)}
    by_status: dict[str, list[dict]] = {}
    for d in docs.values():
        assert d["measured_with"] == trainer
        by_status.setdefault(d["status"], []).append(d)
    assert len(by_status["ok"]) == 2 and len(by_status["oom"]) == 1 and len(by_status["crash"]) == 1, by_status.keys()
    oom, crash = by_status["oom"][0], by_status["crash"][0]
    assert oom["reasons"][0].startswith("does not fit: ") and "CUDA out of memory" in oom["reasons"][0]
    assert crash["reasons"][0].startswith("fails: ") and "RuntimeError: stand-in trainer" in crash["reasons"][0]
    for d in by_status["ok"]:
        m = d["measured"]
        # warm-up dropped: the stand-in's first step is 3x slower; the median of the rest is the plan's
        assert m["step_time_s"] == pytest.approx(_expected_step(d["plan"]), rel=2e-3)
        assert len(m["step_times_s"]) == 3
        assert (tmp_path / d["log"]).is_file()
        assert ((tmp_path / d["log"]).parent / "export" / "launch_torchrun.sh").is_file()
    if trainer == "megatron":  # report_memory's "max allocated" in MiB (divisor 1024 * 1024)
        assert by_status["ok"][0]["measured"]["peak_memory_bytes"] == pytest.approx(1177.34 * 2**20)
    if trainer == "bridge":  # mem-max-allocated-gigabytes in decimal GB
        assert by_status["ok"][0]["measured"]["peak_memory_bytes"] == pytest.approx(1.2345e9)
    if trainer == "nemo":  # NEMO_LOG_MEMORY_USAGE=1 (the export sets it): bytes
        assert by_status["ok"][0]["measured"]["peak_memory_bytes"] == pytest.approx(1234500000.0)
    if trainer == "torchtitan":  # `memory: 1.25GiB`: peak reserved, GiB
        assert by_status["ok"][0]["measured"]["peak_memory_bytes"] == pytest.approx(1.25 * 2**30)
    measured = json.loads((tmp_path / "run" / "measured.json").read_text())
    assert measured["measured_with"] == trainer and measured["succeeded"] == 2 and measured["failed"] == 2
    fastest = min(by_status["ok"], key=lambda d: d["measured"]["step_time_s"])
    assert measured["winner"]["key"] == fastest["key"]
    assert (tmp_path / "run" / "calibrated.yaml").is_file()  # two runs on the priced hardware calibrate


def test_torchtitan_stand_in_on_other_hardware_ranks_without_calibrating(tmp_path):
    """GPU plans measured on this CPU machine: ranked by what ran, left out of the calibration."""
    env = _home(tmp_path, "torchtitan")
    r = _search(
        tmp_path,
        ["--model", "llama3-8b", "--gpus", "2", "--gpu", "h100-sxm", "--trials", "2", "--measure-with", "torchtitan"],
        env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    docs = _docs(tmp_path)
    ok = [d for d in docs if d["status"] == "ok"]
    assert len(ok) == 2 and all(d["cross_hardware"] for d in ok)
    for d in ok:  # step time = gbs * seq / (tps * GPUs), tps printed rounded to a token
        assert d["measured"]["step_time_s"] == pytest.approx(_expected_step(d["plan"]), rel=1e-3)
        assert d["measured"]["peak_memory_bytes"] == pytest.approx(1.25 * 2**30)
    measured = json.loads((tmp_path / "run" / "measured.json").read_text())
    assert set(measured["not_calibrated"]["keys"]) == {d["key"] for d in ok}
    assert not (tmp_path / "run" / "calibrated.yaml").exists()


@pytest.mark.parametrize(
    "args,env,expect",
    [
        (["--measure-with", "megatronn"], {}, "--measure-with 'megatronn' is not a trainer autopar can launch"),
        (["--measure-with", "megatron"], {"MEGATRON_LM": ""}, "needs your Megatron-LM checkout: set MEGATRON_LM="),
        (["--measure-with", "megatron"], {"MEGATRON_LM": "/nonexistent"}, "MEGATRON_LM='/nonexistent' is not a dir"),
        (["--measure-with", "bridge"], {"MEGATRON_BRIDGE": "/tmp"}, "has no scripts/training/run_recipe.py"),
        # the line names where the path came from, escaped once (no raw ESC, no doubled backslash)
        (["--measure-with", "megatron", "--trainer-home", "/tmp"], {}, "--trainer-home '/tmp' has no pretrain_gpt.py"),
        (["--measure-with", "megatron", "--trainer-home", "x\x1b[2Jy"], {}, "--trainer-home 'x\\x1b[2Jy' is not a dir"),
        (["--measure-with", "nemo"], {}, "cannot import nemo, nemo_run; install nemo there"),
        (["--measure-with", "deepspeed", "--trainer-python", "/bin/nope"], {}, "--trainer-python '/bin/nope' is not"),
        (["--trainer-home", "/tmp"], {}, "--trainer-home applies to the measured stage only"),
        (["--measure-with", "nemo", "--trainer-home", "/tmp"], {}, "--trainer-home does not apply to nemo"),
        (["--measure-with", "megatron", "--trainer", "torchtitan"], {"MEGATRON_LM": "@home"}, "drop --trainer"),
    ],
)
def test_where_the_trainer_lives_is_checked_up_front(tmp_path, args, env, expect):
    if env.get("MEGATRON_LM") == "@home":
        env = _home(tmp_path, "megatron")
    trials = [] if "--trainer-home" in args and "--measure-with" not in args else ["--trials", "2"]
    r = _search(tmp_path, ["--model", "tiny", "--gpus", "2", "--gpu", "local", *trials, *args], env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert expect in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "trials").exists()  # nothing ran


def test_gpu_hour_cap_prints_the_cost_and_measures_fewer(tmp_path):
    """2 GPUs x 30 s timeout = 1/60 GPU-hour per trial: 0.04 GPU-hours pay for 2 of the 4 asked for."""
    env = _home(tmp_path, "megatron")
    r = _search(
        tmp_path,
        ["--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "4", "--measure-with", "megatron"]
        + ["--trial-timeout", "30", "--trial-gpu-hours", "0.04"],
        env,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "--trial-gpu-hours 0.04 pays for 2 of the 4 trials asked for (2 ranks x at most 30 s each)" in r.stdout
    assert len(_docs(tmp_path)) == 2


def test_nemo_stand_in_recipe_defaults(tmp_path):
    """The NeMo stand-in's recipe object takes the export's dotted overrides (nemo_pretrain.py's loop)."""
    code = (
        textwrap.dedent(NEMO_RECIPE) + "\nr = pretrain_recipe('x', 1, 2)\nr.log.ckpt = None\nprint(r.trainer.max_steps)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1000"


@pytest.mark.slow
@pytest.mark.distributed
def test_deepspeed_for_real_measures_and_calibrates(tmp_path):
    """The acceptance line: DeepSpeed's own engine (autopar's DeepSpeed script, ZeRO over gloo on this
    CPU) runs the top plans, its log lines are parsed, and the two runs calibrate this machine."""
    pytest.importorskip("deepspeed")
    r = _search(tmp_path, ["--model", "tiny", "--gpus", "2", "--trials", "2", "--measure-with", "deepspeed"], {})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    docs = _docs(tmp_path)
    assert len(docs) == 2 and all(d["measured_with"] == "deepspeed" and d["status"] == "ok" for d in docs)
    for d in docs:
        m = d["measured"]
        assert len(m["step_times_s"]) == 3 and all(t > 0 for t in m["step_times_s"])  # --trial-steps 3
        assert m["memory_method"].startswith("process RSS") and m["process_peak_bytes"] > 0
        log = (tmp_path / d["log"]).read_text()
        assert log.count("| fwd: ") == 5 and "CurrSamplesPerSec=" in log  # 2 warm-up + 3 timed steps
        assert d["trainer"]["version"] == "0.19.8" and not d["cross_hardware"]
    measured = json.loads((tmp_path / "run" / "measured.json").read_text())
    assert measured["measured_with"] == "deepspeed" and measured["calibrated_constants"]
    assert (tmp_path / "run" / "calibrated.yaml").is_file()


def test_a_rerun_adopts_the_finished_trials(tmp_path):
    """The same command again: the study's finished plans are kept, no trainer is launched twice."""
    env = _home(tmp_path, "megatron")
    args = ["--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "2", "--measure-with", "megatron"]
    first = _search(tmp_path, args, env)
    assert first.returncode == 0, first.stderr[-2000:]
    launches = sorted(p.read_text() for p in (tmp_path / "state").iterdir())
    assert len(launches) == 2  # the stand-in counts its launches by working directory
    again = _search(tmp_path, args, env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(p.read_text() for p in (tmp_path / "state").iterdir()) == launches
    assert "trial 0:" not in again.stdout and "2 plans trialled with megatron" in again.stdout


def test_trial_measures_one_plan_with_the_trainer(tmp_path):
    """`autopar trial --measure-with`: the plan of the flags, the trainer's figures, the trial file;
    an out-of-memory exits 1 with the trainer's line."""
    env = _home(tmp_path, "megatron")
    full = dict(os.environ) | env | {"PYTHONPATH": str(REPO)}
    cmd = [*AUTOPAR, "trial", "--model", "tiny", "--gpus", "2", "--tp", "2", "--mbs", "2", "--steps", "3"]
    cmd += ["--measure-with", "megatron", "--run-dir", str(tmp_path / "t")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (doc_path,) = (tmp_path / "t" / "trials").glob("*.json")
    doc = json.loads(doc_path.read_text())
    assert doc["measured_with"] == "megatron" and doc["plan"]["tp"] == 2 and doc["plan"]["trainer"] == "megatron"
    assert doc["measured"]["step_time_s"] == pytest.approx(_expected_step(doc["plan"]), rel=2e-3)
    assert f"{doc['measured']['step_time_s']:.4f} s/step" in r.stdout
    oom = subprocess.run(
        cmd + ["--tp", "1"],
        capture_output=True,
        text=True,
        env=full | {"STANDIN_PLAN": "oom", "STANDIN_STATE": str(tmp_path / "s2")},
        cwd=tmp_path,
    )
    assert oom.returncode == 1 and "oom: does not fit: " in oom.stdout and "CUDA out of memory" in oom.stdout


def test_the_pruner_stops_a_trainer_mid_run(tmp_path, monkeypatch):
    """Each timed step reaches the pruner as the trainer logs it; asked to stop, the run is killed
    and recorded as pruned with the steps it ran."""
    from autopar.measured.own_run import measure_own
    from autopar.measured.own_trainer import locate
    from autopar.spec.presets import get_preset
    from autopar.spec.resolve import resolve_cluster

    env = _home(tmp_path, "megatron") | {"STANDIN_SLEEP": "0.6"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    home = locate("megatron")
    seen: list[tuple[int, float]] = []

    def on_step(index: int, t: float) -> bool:
        seen.append((index, t))
        return True  # the pruner: stop at the first timed step

    plan = {"tp": 1, "pp": 1, "dp": 2, "micro_batch_size": 2, "global_batch_size": 8, "trainer": "megatron"}
    doc = measure_own(
        home,
        plan,
        {"step_time_s": 0.1, "peak_memory_bytes": 1e9},
        model=get_preset("tiny"),
        cluster=resolve_cluster("local", None, None, None),
        seq_len=128,
        steps=20,
        timeout_s=120,
        workdir=tmp_path / "w",
        on_gpu=False,
        on_step=on_step,
    )
    assert doc["status"] == "pruned" and seen[0][0] == 0
    assert doc["measured"]["step_times_s"][0] == pytest.approx(0.2 + 0.05 / 2 + 0.03 + 0.01)
    assert doc["measured"]["steps_run"] < 20 and doc["wall_s"] < 0.6 * 22  # stopped, not run to the end


def test_own_trainer_on_the_cluster_through_slurm(tmp_path):
    """--launcher slurm: each plan's export's own launch_slurm.sbatch is submitted (stand-in SLURM
    commands, tests/measured/slurm_stub.py: the job runs here), followed, its output parsed."""
    import slurm_stub

    bin_dir, state = tmp_path / "bin", tmp_path / "slurm-state"
    slurm_stub.install(bin_dir, state)
    env = _home(tmp_path, "megatron") | {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env |= {"STANDIN_PLAN": "ok,crash"}
    try:
        r = _search(
            tmp_path,
            ["--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "2", "--measure-with", "megatron"]
            + ["--launcher", "slurm", "--gpus-per-node", "2"],
            env,
        )
    finally:
        slurm_stub.cancel_all(state)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "run by the export's launch_slurm.sbatch" in r.stdout
    docs = {d["status"]: d for d in _docs(tmp_path)}
    assert set(docs) == {"ok", "crash"}
    ok = docs["ok"]
    assert ok["measured"]["step_time_s"] == pytest.approx(_expected_step(ok["plan"]), rel=2e-3)
    assert Path(ok["log"]).name.startswith("slurm-") and "sbatch launch_slurm.sbatch" in ok["command"]
    assert "RuntimeError: stand-in trainer" in docs["crash"]["reasons"][0]
    assert len(slurm_stub.calls(state, "sbatch")) == 2 and slurm_stub.calls(state, "srun")


def test_a_killed_search_adopts_its_running_slurm_job(tmp_path):
    """The search dies while the trainer's job runs on the "cluster"; the rerun adopts that job (no
    second sbatch for the plan) and parses its output."""
    import signal
    import time

    import slurm_stub

    bin_dir, state = tmp_path / "bin", tmp_path / "slurm-state"
    slurm_stub.install(bin_dir, state)
    env = dict(os.environ) | _home(tmp_path, "megatron") | {"STANDIN_SLEEP": "1.0", "PYTHONPATH": str(REPO)}
    env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    args = [*AUTOPAR, "search", "--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "1"]
    args += ["--measure-with", "megatron", "--launcher", "slurm", "--gpus-per-node", "2"]
    args += ["--run-dir", str(tmp_path / "run"), "--trial-steps", "3"]
    try:
        p = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        logs: list[Path] = []
        while time.monotonic() < deadline and not any("iteration" in q.read_text() for q in logs):
            time.sleep(0.25)
            logs = list((tmp_path / "run" / "trials" / "work").glob("*/slurm-*.out"))
        assert logs, "the job never logged a step"
        os.kill(p.pid, signal.SIGKILL)  # the search dies; the job runs on
        p.wait()
        again = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        slurm_stub.cancel_all(state)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "adopting SLURM job" in again.stdout or "collecting SLURM job" in again.stdout, again.stdout[:3000]
    assert len(slurm_stub.calls(state, "sbatch")) == 1  # adopted, not submitted again
    (doc,) = _docs(tmp_path)
    assert doc["status"] == "ok" and len(doc["measured"]["step_times_s"]) == 3


def test_trial_refuses_the_built_in_model_flags_with_measure_with(tmp_path):
    """`trial --measure-with` runs the plan as it is here: the proxy, multi-node and memory-cap flags
    of the built-in trials are one line each, exit 2."""
    full = dict(os.environ) | _home(tmp_path, "megatron") | {"PYTHONPATH": str(REPO)}
    for flag in (["--proxy-layers", "2"], ["--emit-slurm", "x.sbatch"], ["--memory-limit-mib", "100"]):
        r = subprocess.run(
            [*AUTOPAR, "trial", "--model", "tiny", "--gpus", "2", "--measure-with", "megatron", *flag],
            capture_output=True,
            text=True,
            env=full,
            cwd=tmp_path,
        )
        assert r.returncode == 2 and f"{flag[0]} applies to the built-in model's trials" in r.stderr, r.stderr


def test_a_search_killed_mid_run_leaves_no_trainer_running(tmp_path):
    """SIGKILL of the search while the trainer trains here: its guard (autopar.measured.guard) ends
    the launch, torchrun and the ranks torchrun put in sessions of their own, which no
    parent-death signal reaches; before the guard they trained on."""
    import signal
    import time

    env = dict(os.environ) | _home(tmp_path, "megatron") | {"STANDIN_SLEEP": "1.0", "PYTHONPATH": str(REPO)}
    args = [*AUTOPAR, "search", "--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "1"]
    args += ["--measure-with", "megatron", "--run-dir", "run", "--trial-steps", "20"]
    p = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    token = ""
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not token:
            time.sleep(0.25)
            for work in (tmp_path / "run" / "trials" / "work").glob("*"):
                log, pgid = work / "stdout.log", work / "launch.pgid"
                if log.is_file() and "iteration" in log.read_text() and pgid.is_file():
                    token = pgid.read_text().split()[1]
        assert token, "the trainer never logged a step"
        assert len(processes_with_token(token)) >= 4  # guard, bash, torchrun, 2 ranks (+ torchrun's helpers)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 15
        while processes_with_token(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with_token(token) == [], "the trainer outlived the search"
    finally:
        if p.poll() is None:
            p.kill()
        if token:
            kill_token(token)
