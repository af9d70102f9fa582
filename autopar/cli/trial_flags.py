"""The measured-stage flags of `autopar search`, declared once: `@with_trial_flags` hands the command
one TrialFlags in its `measure` parameter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import typer

from autopar.cli.option_groups import Opt, with_options
from autopar.errors import InputError, quoted
from autopar.spec.schema import check_flags

if TYPE_CHECKING:  # imported by _build (the measured stage's module is loaded only when asked for)
    from autopar.measured.stage import TrialOptions

PANEL = "Measured stage (trials)"


def _opt(name: str, help: str):
    return typer.Option(name, help=help, rich_help_panel=PANEL)


#: where --measure-with's trainer lives (`search` and `trial`)
OWN_TRAINER_OPTIONS = {
    "measure_with": Opt(
        Optional[str],
        _opt(
            "--measure-with",
            help="Measure with your own trainer instead of autopar's built-in model: megatron, bridge, nemo, "
            "torchtitan or deepspeed (each plan exported for a short run on mock data, launched here or "
            "through SLURM, its log parsed; docs/trials.md).",
        ),
    ),
    "trainer_home": Opt(
        Optional[str],
        _opt(
            "--trainer-home",
            help="Where --measure-with's trainer lives: the Megatron-LM / Megatron-Bridge / torchtitan "
            "checkout, or DeepSpeed's training script (default: MEGATRON_LM, MEGATRON_BRIDGE, TORCHTITAN, "
            "DEEPSPEED_SCRIPT).",
        ),
    ),
    "trainer_python": Opt(
        Optional[str],
        _opt(
            "--trainer-python",
            help="The Python of the environment that has --measure-with's trainer (default: "
            "AUTOPAR_TRAINER_PYTHON, else this one).",
        ),
    ),
}

TRIAL_OPTIONS = {
    "trials": Opt(
        int,
        _opt(
            "--trials",
            help="Measured stage: run the analytic top-K plans for real (torchrun on "
            "this machine, as scaled-down proxies where a plan does not fit it; or "
            "SLURM jobs, --launcher slurm), ranked by measured step time.",
        ),
        0,
    ),
    "trial_budget": Opt(
        Optional[int], _opt("--trial-budget", help="Plans to measure per round (>= K; the sampler proposes the rest).")
    ),
    "rounds": Opt(int, _opt("--rounds", help="Measure, recalibrate, re-rank the untried, repeat."), 1),
    "trial_steps": Opt(int, _opt("--trial-steps", help="Timed steps per trial (after warm-up)."), 5),
    "trial_timeout": Opt(float, _opt("--trial-timeout", help="Seconds before a trial is killed."), 120.0),
    "launcher": Opt(
        str,
        _opt(
            "--launcher",
            help="Where trials run: local (torchrun on this machine) | slurm (one "
            "sbatch job per trial on the cluster the plans are for; a rerun "
            "adopts jobs still running).",
        ),
        "local",
    ),
    "max_local_ranks": Opt(
        Optional[int],
        _opt(
            "--max-local-ranks",
            help="Most ranks a local trial starts "
            "(default: the GPUs, or the CPU cores; "
            "more oversubscribes the cores).",
        ),
    ),
    "proxy": Opt(
        bool,
        _opt(
            "--proxy/--no-proxy",
            help="Run a scaled-down proxy of a plan that does not fit this "
            "machine, scaled back by the estimate's ratio (default); "
            "--no-proxy records it as not runnable.",
        ),
        True,
    ),
    "proxy_layers": Opt(
        Optional[int], _opt("--proxy-layers", help="Proxy: layers per pipeline stage (default: the most that fit).")
    ),
    "proxy_width": Opt(
        Optional[int],
        _opt(
            "--proxy-width",
            help="Proxy: divide every width (hidden, heads then "
            "head size, FFN, vocabulary) by this (default: "
            "the least that fits).",
        ),
    ),
    "proxy_seq": Opt(
        Optional[int],
        _opt("--proxy-seq", help="Proxy: divide the sequence length by this (default: the least that fits)."),
    ),
    "sbatch_args": Opt(
        Optional[str],
        _opt("--sbatch-args", help="Extra sbatch options for --launcher slurm, e.g. '--partition=gpu --account=ml'."),
    ),
    "trial_gpu_hours": Opt(
        Optional[float],
        _opt(
            "--trial-gpu-hours",
            help="The most GPU-hours the measured stage may spend (each trial priced at its GPUs x "
            "--trial-timeout); fewer trials run when they would not fit.",
        ),
    ),
} | OWN_TRAINER_OPTIONS


@dataclass(frozen=True)
class TrialFlags:
    """The measured stage as asked for: K plans (0: none), the budget, rounds, steps, timeout and
    where the trials run (autopar.measured.stage.TrialOptions)."""

    trials: int
    trial_budget: int | None
    rounds: int
    trial_steps: int
    trial_timeout: float
    options: TrialOptions


def _build(v: dict) -> TrialFlags:
    check_flags(
        {
            "--trials": v["trials"],
            "--trial-budget": v["trial_budget"],
            "--rounds": v["rounds"],
            "--trial-steps": v["trial_steps"],
            "--trial-timeout": v["trial_timeout"],
            "--max-local-ranks": v["max_local_ranks"],
            "--proxy-layers": v["proxy_layers"],
            "--proxy-width": v["proxy_width"],
            "--proxy-seq": v["proxy_seq"],
            "--trial-gpu-hours": v["trial_gpu_hours"],
        }
    )
    _check_used(v)
    from autopar.measured.stage import trial_options

    options = trial_options(
        v["launcher"],
        v["max_local_ranks"],
        v["proxy"],
        v["proxy_layers"],
        v["proxy_width"],
        v["proxy_seq"],
        v["sbatch_args"],
        v["measure_with"],
        v["trainer_home"],
        v["trainer_python"],
        v["trial_gpu_hours"],
    )
    return TrialFlags(v["trials"], v["trial_budget"], v["rounds"], v["trial_steps"], v["trial_timeout"], options)


#: measured-stage options -> their default: given without --trials they would do nothing
_STAGE_ONLY = {name: opt.default for name, opt in TRIAL_OPTIONS.items() if name != "trials"}


def _flag(name: str) -> str:
    return "--no-proxy" if name == "proxy" else "--" + name.replace("_", "-")


def _check_used(v: dict) -> None:
    """One line for a measured-stage option that would be ignored: given without --trials, or
    --sbatch-args without --launcher slurm (an unknown --launcher is named first)."""
    from autopar.measured.stage import LAUNCHERS

    if v["launcher"] not in LAUNCHERS:
        raise InputError(f"--launcher {quoted(v['launcher'])} is not one of {', '.join(LAUNCHERS)}; choose one of them")
    if v["trials"] == 0:
        given = [_flag(k) for k, default in _STAGE_ONLY.items() if v[k] != default]
        if given:
            raise InputError(
                f"{given[0]} applies to the measured stage only, which --trials 0 (the default) skips; "
                f"add --trials K (plans to measure), or leave {given[0]} out"
            )
    if v["sbatch_args"] is not None and v["launcher"] != "slurm":
        raise InputError(
            f"--sbatch-args applies to --launcher slurm only (got --launcher {quoted(v['launcher'])}); "
            f"add --launcher slurm, or leave --sbatch-args out"
        )


@dataclass(frozen=True)
class OwnTrainer:
    """--measure-with TRAINER and where it lives (autopar.measured.own_trainer.locate reads them)."""

    measure_with: str | None
    home: str | None
    python: str | None


def _build_own(v: dict) -> OwnTrainer:
    from autopar.measured.own_trainer import NEEDS_MEASURE_WITH

    if v["measure_with"] is None and (v["trainer_home"] or v["trainer_python"]):
        raise InputError(NEEDS_MEASURE_WITH)
    return OwnTrainer(v["measure_with"], v["trainer_home"], v["trainer_python"])


def with_own_trainer_flags(command):
    """Give `command(..., own: OwnTrainer)` the --measure-with flags (`autopar trial`)."""
    return with_options(OWN_TRAINER_OPTIONS, "own", _build_own)(command)


def with_trial_flags(command):
    """Give `command(..., measure: TrialFlags)` the measured-stage flags as options."""
    return with_options(TRIAL_OPTIONS, "measure", _build)(command)
