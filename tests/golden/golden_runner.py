"""Run a golden case in-process and return what is compared: the plans frame and top.json of a
search, the JSON object of an estimate. The `local` profile is pinned to its built-in defaults
(written as a profile file) so the CPU cases do not depend on the machine."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pandas as pd
import yaml

from autopar.spec.hardware import LOCAL_DEFAULTS


def _main(args: list[str]) -> str:
    from autopar.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(args)
        except SystemExit as e:
            if e.code not in (0, None):
                raise RuntimeError(f"autopar {' '.join(args)} exited {e.code}") from None
    return buf.getvalue()


def unprobed_profile(folder: Path) -> str:
    """The unprobed local defaults as this machine's profile (a profile a test names must exist)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "unprobed-local.yaml"
    path.write_text(yaml.safe_dump(LOCAL_DEFAULTS))
    return str(path)


def run_search(args: list[str], run_dir: Path) -> tuple[pd.DataFrame, dict]:
    os.environ["AUTOPAR_LOCAL_PROFILE"] = unprobed_profile(run_dir.parent)
    _main(["search", *args, "--run-dir", str(run_dir), "--json"])
    plans = pd.read_parquet(run_dir / "plans.parquet")
    top = json.loads((run_dir / "top.json").read_text())
    return plans, top


def run_estimate(args: list[str], tmp: Path) -> dict:
    os.environ["AUTOPAR_LOCAL_PROFILE"] = unprobed_profile(tmp)
    return json.loads(_main(["estimate", *args, "--json"]))
