"""Measure a plan with the user's own trainer (`--measure-with TRAINER`); imports no torch.

The built-in trials (autopar.trial) run autopar's own transformer: they measure the hardware and the
layout's communication, not what a trainer adds on top (its kernels, overlaps, host overheads,
allocator). Here the trainer itself runs the plan, the way NeMo AutoConfigurator and DeepSpeed
Autotuning do:

1. the plan is exported with the trainer's own exporter (autopar.export), set for a short run
   (autopar.export.short_run: K steps on mock data, no checkpoints, every step logged), into the
   trial's work directory, where the user can read and rerun it;
2. the export's own `launch_torchrun.sh` runs it on this machine, one node, through the measured
   stage's launcher (autopar.measured.launcher.run_command: its own process group, the timeout, no
   process left behind);
3. the trainer's stdout is parsed (autopar.measured.trainer_logs, which cites each trainer's source
   line per version): step times with the warm-up steps dropped (their median), throughput, peak
   memory; an out-of-memory is "does not fit", any other failure "fails", each with the trainer's
   own error line.

The trial document has the schema of the built-in trials' (`trials/<key>.json`) plus
`measured_with` (the trainer), `trainer` (where it lives, its version) and `log` (the log file).

Where the trainer lives (checked up front, `locate`): Megatron-LM and Megatron-Bridge are checkouts
(MEGATRON_LM, MEGATRON_BRIDGE or --trainer-home); NeMo and torchtitan are Python packages of the
trainer's interpreter (--trainer-python or AUTOPAR_TRAINER_PYTHON; default this one), torchtitan
optionally with its checkout as the working directory (TORCHTITAN: its test dataset path is
relative); DeepSpeed has no trainer of its own, so a short run is a script that reads Megatron-
DeepSpeed's flags and `--deepspeed_config` (DEEPSPEED_SCRIPT or --trainer-home; default autopar's
own, autopar/trial/deepspeed_train.py, which trains autopar's transformer under DeepSpeed's engine:
data parallel with ZeRO).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from autopar.errors import InputError, quoted

OWN_TRAINERS = ("megatron", "bridge", "nemo", "torchtitan", "deepspeed")
#: --trainer-home or --trainer-python without --measure-with
NEEDS_MEASURE_WITH = "--trainer-home and --trainer-python say where --measure-with TRAINER lives; add --measure-with"
#: logged steps dropped before the median: the first carries the trainer's start-up (Megatron-LM
#: v0.16+ logs iteration 1 "to document initialization overhead", training.py; torchtitan's first
#: tps counts from before the model build, train.py), the second the allocator's growth
WARMUP = 2
#: autopar's DeepSpeed training script (data parallel with ZeRO; the torch layer)
BUNDLED_DEEPSPEED_SCRIPT = Path(__file__).resolve().parents[1] / "trial" / "deepspeed_train.py"
#: the most of a trainer's log read back (its step lines are near the end of a long start-up log)
LOG_BYTES = 32 << 20


@dataclass(frozen=True)
class Where:
    """Where one trainer lives and how to say so."""

    var: str  # the environment variable naming it ("" = none)
    what: str  # e.g. "your Megatron-LM checkout"
    needs: str  # the file under it that must exist ("" = the path itself is the file; "-" = none)
    example: str
    modules: tuple[str, ...]  # what the trainer's Python must import
    package: str  # the distribution whose version is recorded


WHERE = {
    "megatron": Where(
        "MEGATRON_LM", "your Megatron-LM checkout", "pretrain_gpt.py", "/opt/Megatron-LM", ("torch",), "megatron-core"
    ),
    "bridge": Where(
        "MEGATRON_BRIDGE",
        "your Megatron-Bridge checkout",
        "scripts/training/run_recipe.py",
        "/opt/Megatron-Bridge",
        ("torch",),
        "megatron-bridge",
    ),
    "nemo": Where("", "the Python environment that has NeMo 2", "-", "", ("torch", "nemo", "nemo_run"), "nemo-toolkit"),
    "torchtitan": Where(
        "TORCHTITAN",
        "your torchtitan checkout (optional)",
        "-",
        "/opt/torchtitan",
        ("torch", "torchtitan"),
        "torchtitan",
    ),
    "deepspeed": Where(
        "DEEPSPEED_SCRIPT",
        "a training script that reads Megatron-DeepSpeed's flags and --deepspeed_config",
        "",
        "/opt/Megatron-DeepSpeed/pretrain_gpt.py",
        ("torch", "deepspeed"),
        "deepspeed",
    ),
}


@dataclass(frozen=True)
class TrainerHome:
    """A located trainer: the variables its launch reads, its Python, its working directory."""

    trainer: str
    python: str
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    version: str = ""
    text: str = ""  # how the stage's header names it

    @property
    def bundled_script(self) -> bool:
        return self.trainer == "deepspeed" and Path(self.env.get("DEEPSPEED_SCRIPT", "")) == BUNDLED_DEEPSPEED_SCRIPT


def check_trainer(trainer: str) -> str:
    if trainer not in OWN_TRAINERS:
        raise InputError(
            f"--measure-with {quoted(trainer)} is not a trainer autopar can launch; choose one of "
            f"{', '.join(OWN_TRAINERS)} (or leave it out: autopar's built-in model)"
        )
    return trainer


def locate(trainer: str, home: str | None = None, python: str | None = None, environ=None) -> TrainerHome:
    """Where `trainer` lives, checked before anything runs: one InputError line naming the trainer,
    the path and how to set it."""
    environ = os.environ if environ is None else environ
    w = WHERE[check_trainer(trainer)]
    py = python or environ.get("AUTOPAR_TRAINER_PYTHON") or sys.executable
    if not (os.path.isfile(py) and os.access(py, os.X_OK)):
        raise InputError(
            f"--trainer-python {quoted(py)} is not an executable file; give the Python of the environment "
            f"that has {trainer} (or set AUTOPAR_TRAINER_PYTHON)"
        )
    if home and not w.var:
        raise InputError(
            f"--trainer-home does not apply to {trainer}: it lives in {w.what}; give --trainer-python naming "
            f"that environment's Python"
        )
    path = home or (environ.get(w.var) if w.var else None)
    if trainer == "deepspeed" and not path:
        path = str(BUNDLED_DEEPSPEED_SCRIPT)
    env: dict[str, str] = {}
    if w.needs != "-" or path:
        if not path:
            raise InputError(
                f"--measure-with {trainer} needs {w.what}: set {w.var}=/path (e.g. {w.example}) or pass --trainer-home"
            )
        _check_path(w, Path(path), "--trainer-home" if home else w.var)
        env[w.var] = str(Path(path).resolve())
    version = _check_modules(trainer, w, py, environ)
    cwd = env.get("TORCHTITAN")
    text = f"{trainer} {version}".strip() + (f" ({w.var}={env[w.var]})" if env else "") + f", Python {py}"
    if trainer == "deepspeed" and Path(env["DEEPSPEED_SCRIPT"]) == BUNDLED_DEEPSPEED_SCRIPT:
        text += "; autopar's DeepSpeed script (set DEEPSPEED_SCRIPT for your own)"
    return TrainerHome(trainer, py, env, cwd, version, text)


def _check_path(w: Where, path: Path, given_as: str) -> None:
    """`given_as`: where the path came from, the flag or the environment variable, as the line names it."""
    shown = f"{given_as} {quoted(str(path))}" if given_as.startswith("--") else f"{given_as}={quoted(str(path))}"
    if w.needs == "":  # the path is the script itself
        if not path.is_file():
            raise InputError(f"{shown} is not a file; point it at {w.what}, e.g. {w.example}")
        return
    if not path.is_dir():
        raise InputError(f"{shown} is not a directory; point it at {w.what}, e.g. {w.example}")
    if w.needs != "-" and not (path / w.needs).is_file():
        raise InputError(
            f"{shown} has no {w.needs}; point it at {w.what} (the folder that holds {w.needs}), e.g. {w.example}"
        )


_FIND = (
    "import importlib.util as u, importlib.metadata as m, sys\n"
    "missing = [n for n in sys.argv[2:] if u.find_spec(n) is None]\n"
    "try:\n    v = m.version(sys.argv[1])\nexcept Exception:\n    v = ''\n"
    "print(' '.join(missing) if missing else 'ok ' + v)\n"
)


def _check_modules(trainer: str, w: Where, py: str, environ) -> str:
    """The trainer's version, after checking that its Python imports what it needs (a subprocess:
    that Python may not be this one)."""
    try:
        out = subprocess.run(
            [py, "-c", _FIND, w.package, *w.modules], capture_output=True, text=True, timeout=120, env=dict(environ)
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InputError(f"--trainer-python {quoted(py)} did not answer ({e}); give a working Python") from None
    if not out.startswith("ok"):
        raise InputError(
            f"--measure-with {trainer}: {py} cannot import {', '.join(out.split()) or 'its modules'}; install "
            f"{trainer} there, or pass --trainer-python naming the Python of the environment that has it"
        )
    return out[3:].strip()


def free_port() -> int:
    """A TCP port free on this machine now, for the launch's MASTER_PORT (two trials never share one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_env(home: TrainerHome, on_gpu: bool) -> dict[str, str]:
    """The environment of one short run on this node: the trainer's variables, its Python's bin/
    first on PATH (the export's launch script calls `torchrun`), unbuffered output (NeMo and
    DeepSpeed print without flush), and DeepSpeed's CPU accelerator where there is no GPU."""
    env = dict(os.environ) | home.env
    env["PATH"] = str(Path(home.python).parent) + os.pathsep + env.get("PATH", "")
    env |= {"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    if home.trainer == "deepspeed" and not on_gpu:
        env.setdefault("DS_ACCELERATOR", "cpu")
    return env


def log_files(workdir: Path) -> list[Path]:
    """Where a launch's output is: stdout and stderr of a local one (autopar.measured.launcher), the
    job's output file of a SLURM one (autopar.measured.slurm.run_export_job)."""
    return [workdir / "stdout.log", workdir / "stderr.log", *sorted(workdir.glob("slurm-*.out"))]


def read_log(workdir: Path) -> str:
    """The text of a launch's output files (`log_files`), the last LOG_BYTES of each."""
    parts = []
    for path in log_files(Path(workdir)):
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - LOG_BYTES))
                parts.append(f.read().decode("utf-8", "replace"))
        except OSError:
            continue
    return "\n".join(parts)
