"""`autopar probe`'s work: microbenchmark this machine (GEMM, memory bandwidth, collectives per group
size, each a subprocess of autopar.trial.probe) and write the `local` hardware profile; imports no torch."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from autopar.json_out import dumps


def probe_machine(ranks: int, timeout_s: float, say: Callable[[str], None] = print) -> tuple[dict, list[dict]]:
    """Run the GEMM probe, then the collective probe for each group size of 2, 4, 8 and `ranks`, in a
    scratch folder; `say` gets one line per collective group and per GEMM shape. Returns (the GEMM probe's
    result, the results of the collective probes that succeeded)."""
    from autopar.errors import InputError
    from autopar.measured.launcher import rendezvous_command, run_command

    work = Path(tempfile.mkdtemp(prefix="autopar-probe-"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    g = run_command(
        [sys.executable, "-m", "autopar.trial.probe", "gemm", "--out", str(work / "gemm.json")],
        work / "gemm.json",
        timeout_s=timeout_s,
        workdir=work,
        env=env,
    )
    if not g.result:
        raise InputError(f"the GEMM probe failed ({g.outcome}): {g.stderr_tail[-300:]}")
    colls = []
    sizes = sorted({s for s in (2, 4, 8, ranks) if 2 <= s <= max(ranks, 2)})
    for size in sizes:
        path = work / f"coll{size}.json"
        c = run_command(
            rendezvous_command(size) + ["-m", "autopar.trial.probe", "collectives", "--out", str(path)],
            path,
            timeout_s=timeout_s,
            workdir=work,
            env=env,
        )
        if c.result:
            colls.append(c.result)
            ar = c.result["all_reduce"][-1]
            say(
                f"group {size}: all-reduce {ar['bytes'] >> 10} KiB busbw {ar['busbw_gbps']:.2f} GB/s, "
                f"latency {c.result['all_reduce'][0]['seconds'] * 1e6:.0f} us"
            )
    for r in g.result["gemm"]:
        say(f"GEMM {r['m']}x{r['n']}x{r['k']}: {r['flops_per_s'] / 1e9:.1f} GFLOP/s")
    return g.result, colls


def write_local_profile(dest: Path, gemm: dict, colls: list[dict], ranks: int) -> dict:
    """The profile of these measurements (this machine's RAM, `ranks` ranks per node) written to `dest`:
    the profile as YAML, the raw measurements as comments below it. Returns the profile (without them)."""
    import yaml

    from autopar.cost.calibrate import profile_from_probe

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    prof = profile_from_probe(gemm, colls, ranks, ram) | {
        "probe": {"gemm": gemm["gemm"], "memory_bytes_per_s": gemm["memory_bytes_per_s"], "collectives": colls}
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    body = {k: v for k, v in prof.items() if k != "probe"}
    dest.write_text(
        "# autopar probe: this machine's profile (--gpu local / --cluster)\n"
        + yaml.safe_dump(body)
        + "# raw measurements\n"
        + "".join(f"# {ln}\n" for ln in dumps(prof["probe"]).splitlines())
    )
    return body
