"""`autopar probe`: microbenchmark this machine and write the `local` hardware profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.cli import app


@app.command()
def probe(
    ranks: Annotated[
        Optional[int], typer.Option("--ranks", help="Ranks per node the profile describes (default: the CPU count).")
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            help="Profile file (default: $AUTOPAR_LOCAL_PROFILE or ~/.autopar/local.yaml, what --gpu local reads).",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per benchmark launch.")] = 120.0,
) -> None:
    """GEMM throughput by shape, memory bandwidth, collective bandwidth/latency per group size -> a profile.

    Example: autopar probe && autopar search --model tiny --gpus 2 --gpu local --trials 8
    """
    import json
    import os
    import sys
    import tempfile

    import yaml

    from autopar.cli.checks import output_file
    from autopar.cost.calibrate import profile_from_probe
    from autopar.errors import InputError
    from autopar.spec.hardware import local_profile_path
    from autopar.spec.schema import check_flags
    from autopar.trial.launcher import rendezvous_command, run_command

    check_flags({"--ranks": ranks, "--timeout": timeout})
    most = 4 * (os.cpu_count() or 1)  # each rank is a process of this machine
    if ranks is not None and ranks > most:
        raise InputError(
            f"--ranks {ranks} would start {ranks} processes on this machine's {os.cpu_count()} CPU cores; "
            f"give at most {most}"
        )
    output_file(out or local_profile_path(), "--out" if out else "the profile path")
    n = ranks or os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="autopar-probe-"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    g = run_command(
        [sys.executable, "-m", "autopar.trial.probe", "gemm", "--out", str(work / "gemm.json")],
        work / "gemm.json",
        timeout_s=timeout,
        workdir=work,
        env=env,
    )
    if not g.result:
        raise InputError(f"the GEMM probe failed ({g.outcome}): {g.stderr_tail[-300:]}")
    colls = []
    sizes = sorted({s for s in (2, 4, 8, n) if 2 <= s <= max(n, 2)})
    for size in sizes:
        path = work / f"coll{size}.json"
        c = run_command(
            rendezvous_command(size) + ["-m", "autopar.trial.probe", "collectives", "--out", str(path)],
            path,
            timeout_s=timeout,
            workdir=work,
            env=env,
        )
        if c.result:
            colls.append(c.result)
            ar = c.result["all_reduce"][-1]
            print(
                f"group {size}: all-reduce {ar['bytes'] >> 10} KiB busbw {ar['busbw_gbps']:.2f} GB/s, "
                f"latency {c.result['all_reduce'][0]['seconds'] * 1e6:.0f} us"
            )
    for r in g.result["gemm"]:
        print(f"GEMM {r['m']}x{r['n']}x{r['k']}: {r['flops_per_s'] / 1e9:.1f} GFLOP/s")
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    prof = profile_from_probe(g.result, colls, n, ram) | {
        "probe": {"gemm": g.result["gemm"], "memory_bytes_per_s": g.result["memory_bytes_per_s"], "collectives": colls}
    }
    dest = out or local_profile_path()
    dest.parent.mkdir(parents=True, exist_ok=True)
    body = {k: v for k, v in prof.items() if k != "probe"}
    dest.write_text(
        "# autopar probe: this machine's profile (--gpu local / --cluster)\n"
        + yaml.safe_dump(body)
        + "# raw measurements\n"
        + "".join(f"# {ln}\n" for ln in json.dumps(prof["probe"]).splitlines())
    )
    print(
        f"Profile: {dest} (fp32 peak {body['gpu']['bf16_tflops'] * body['constants']['gemm_efficiency'] / 2 * 1e3:.1f}"
        f" GFLOP/s/rank, {n} ranks)"
    )
