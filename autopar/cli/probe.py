"""`autopar probe`: microbenchmark this machine and write the `local` hardware profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app

Ranks = Annotated[
    Optional[int], typer.Option("--ranks", help="Ranks per node the profile describes (default: the CPU count).")
]
Out = Annotated[
    Optional[Path],
    typer.Option(
        "--out", help="Profile file (default: $AUTOPAR_LOCAL_PROFILE or ~/.autopar/local.yaml, what --gpu local reads)."
    ),
]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds per benchmark launch.")]


@app.command()
def probe(ranks: Ranks = None, out: Out = None, timeout: Timeout = 120.0) -> None:
    """GEMM throughput by shape, memory bandwidth, collective bandwidth/latency per group size -> a profile.

    Example: autopar probe && autopar search --model tiny --gpus 2 --gpu local --trials 8
    """
    import os

    from autopar.cli.checks import output_file
    from autopar.errors import InputError
    from autopar.measured.local_profile import probe_machine, write_local_profile
    from autopar.measured.needs_torch import require_torch
    from autopar.spec.hardware import local_profile_path
    from autopar.spec.schema import check_flags

    check_flags({"--ranks": ranks, "--timeout": timeout})
    require_torch("autopar probe")  # its benchmarks run torch in subprocesses
    most = 4 * (os.cpu_count() or 1)  # each rank is a process of this machine
    if ranks is not None and ranks > most:
        raise InputError(
            f"--ranks {ranks} would start {ranks} processes on this machine's {os.cpu_count()} CPU cores; "
            f"give at most {most}"
        )
    output_file(out or local_profile_path(), "--out" if out else "the profile path")
    n = ranks or os.cpu_count() or 1
    gemm, colls = probe_machine(n, timeout)
    dest = out or local_profile_path()
    body = write_local_profile(dest, gemm, colls, n)
    print(
        f"Profile: {dest} (fp32 peak {body['gpu']['bf16_tflops'] * body['constants']['gemm_efficiency'] / 2 * 1e3:.1f}"
        f" GFLOP/s/rank, {n} ranks)"
    )
