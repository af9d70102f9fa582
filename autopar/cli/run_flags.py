"""The whole-run flags of `search` and `estimate`, declared once: `@with_run_flags` hands the command
one TrainingRun (autopar.spec.training_run), or None without --tokens, in its `run` parameter."""

from __future__ import annotations

from typing import Optional

import typer

from autopar.cli.option_groups import Opt, with_options
from autopar.spec.training_run import training_run

PANEL = "Whole run: time to train and cost"


def _opt(name: str, help: str):
    return typer.Option(name, help=help, rich_help_panel=PANEL, show_default=False)


RUN_OPTIONS = {
    "tokens": Opt(
        Optional[str],
        _opt(
            "--tokens",
            help="Tokens to train on (15T, 300B, 2.5e12): adds days to train, "
            "GPU-hours and goodput after checkpoints and failures.",
        ),
    ),
    "deadline": Opt(
        Optional[str],
        _opt(
            "--deadline",
            help="Finish within this (60d, 36h, 8w): a what-if names the cheapest plan that does; exit 2 if none can.",
        ),
    ),
    "price_per_gpu_hour": Opt(
        Optional[str],
        _opt("--price-per-gpu-hour", help="Price of one GPU-hour (2.5), or one per GPU kind (h100-sxm=2.5,b200=4.2)."),
    ),
    "budget": Opt(
        Optional[str],
        _opt(
            "--budget",
            help="Spend at most this (5M, 750000; the price's currency): a "
            "what-if names the fastest plan within it; exit 2 if none is.",
        ),
    ),
}


def with_run_flags(command):
    """Give `command(..., run: TrainingRun | None)` the whole-run flags as options."""
    return with_options(
        RUN_OPTIONS, "run", lambda v: training_run(v["tokens"], v["deadline"], v["price_per_gpu_hour"], v["budget"])
    )(command)
