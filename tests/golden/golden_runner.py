"""Run a golden case in-process and return what is compared: the plans frame and top.json of a
search, the JSON object of an estimate. The `local` profile is pinned to its built-in defaults
(no probe file) so the CPU cases do not depend on the machine."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pandas as pd


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


def run_search(args: list[str], run_dir: Path) -> tuple[pd.DataFrame, dict]:
    os.environ["AUTOPAR_LOCAL_PROFILE"] = str(run_dir / "no-local-profile.yaml")
    _main(["search", *args, "--run-dir", str(run_dir), "--json"])
    plans = pd.read_parquet(run_dir / "plans.parquet")
    top = json.loads((run_dir / "top.json").read_text())
    return plans, top


def run_estimate(args: list[str], tmp: Path) -> dict:
    os.environ["AUTOPAR_LOCAL_PROFILE"] = str(tmp / "no-local-profile.yaml")
    return json.loads(_main(["estimate", *args, "--json"]))
