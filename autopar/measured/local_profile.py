"""`autopar probe`'s work: microbenchmark this machine (GEMM, memory bandwidth, collectives per group
size, each a subprocess of autopar.trial.probe) and write the `local` hardware profile; or, on a GPU,
measure what the published hardware tables hold and write a cluster file whose `behaviour:` replaces
them. Imports no torch."""

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

    from autopar.calibration.calibrate import profile_from_probe

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


def probe_gpu(timeout_s: float, raw: Path) -> dict:
    """GPU 0 measured by `python -m autopar.trial.probe gpu` (a subprocess: this process imports no
    torch); its raw result is written to `raw` as soon as it exists, so nothing measured is lost."""
    from autopar.atomic import write_atomic
    from autopar.errors import InputError
    from autopar.measured.launcher import run_command

    work = Path(tempfile.mkdtemp(prefix="autopar-probe-"))
    out = work / "gpu.json"
    r = run_command(
        [sys.executable, "-m", "autopar.trial.probe", "gpu", "--device", "cuda", "--out", str(out)],
        out,
        timeout_s=timeout_s,
        workdir=work,
        env=dict(os.environ),
    )
    if not r.result:
        raise InputError(f"the GPU probe failed ({r.outcome}): {_last_line(r.stderr_tail)}")
    doc = r.result
    if int(doc.get("device_count") or 1) > 1:  # the node's NVLink collectives, a rank per GPU
        doc["node_collectives"] = node_collectives(int(doc["device_count"]), "cuda", timeout_s, work)
    raw.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(raw, dumps(doc, indent=1))
    return doc


def node_collectives(ranks: int, device: str, timeout_s: float, work: Path, quick: bool = False) -> dict:
    """The node's collectives (autopar.trial.probe node_collectives), a torchrun rank per GPU; an
    error line in place of the figures when they could not be measured (the GEMM and attention
    figures stand without them)."""
    from autopar.measured.launcher import rendezvous_command, run_command

    out = work / "node-collectives.json"
    cmd = rendezvous_command(ranks) + ["-m", "autopar.trial.probe", "node-collectives", "--device", device]
    r = run_command(
        cmd + ["--out", str(out)] + (["--quick"] if quick else []),
        out,
        timeout_s=timeout_s,
        workdir=work,
        env=dict(os.environ),
    )
    return r.result or {"error": f"{r.outcome}: {_last_line(r.stderr_tail)}"}


def _last_line(stderr: str) -> str:
    """What a failed worker said last (its exception, usually), at most 300 characters."""
    return next((ln.strip()[-300:] for ln in reversed(stderr.splitlines()) if ln.strip()), "no output")


def write_gpu_cluster(dest: Path, doc: dict) -> dict:
    """The cluster file of a GPU probe written to `dest` (the raw measurements as comments below it);
    returns the file's mapping. A card no preset describes is refused, naming the fix."""
    import yaml

    from autopar.atomic import write_atomic
    from autopar.calibration.calibrate import cluster_from_gpu_probe
    from autopar.errors import InputError
    from autopar.spec.hardware import cluster_from_dict, preset_for_device

    preset = preset_for_device(doc["device"])
    if preset is None:
        raise InputError(
            f"no GPU preset describes '{doc['device']}' (autopar hardware lists them); write its datasheet "
            f"figures under gpu: in a cluster file and copy the measurements from the probe's raw result"
        )
    body = cluster_from_gpu_probe(doc, preset)
    cluster_from_dict(body, origin="the probed cluster")  # what --cluster will read back
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        dest,
        f"# autopar probe: {doc['device']} measured on {doc['date']} (--cluster {dest})\n"
        + yaml.safe_dump(body, sort_keys=False)
        + "# raw measurements\n"
        + "".join(f"# {ln}\n" for ln in dumps(doc).splitlines()),
    )
    return body
