"""Whether PyTorch is installed, asked without importing it.

torch is an optional extra (`pip install autopar[trial]`): the analytic planner never needs it, the
trial processes (torchrun workers, the probe's benchmarks) do. The commands that start them check
here first, so a missing torch is one line (InputError: exit 2) naming what to install, not a
worker's traceback. This module imports no torch.
"""

from __future__ import annotations

import importlib.util

from autopar.errors import InputError

#: what to install for trials, probe and calibration rounds (the Makefile's set-up does the same)
INSTALL_HINT = "pip install 'autopar[trial]' (on a CPU machine: pip install torch==2.13.0 first)"
#: what a process without torch prints when it imports it
MISSING_MARKER = "No module named 'torch'"


def torch_installed() -> bool:
    """Whether `import torch` can find a torch package here (found, not imported)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a parent import failed / sys.modules["torch"] is None or lacks a spec
        return False


def require_torch(what: str) -> None:
    """One line (InputError) when torch is missing: `what` (e.g. "autopar trial") needs PyTorch."""
    if not torch_installed():
        raise InputError(f"{what} needs PyTorch: {INSTALL_HINT}")
