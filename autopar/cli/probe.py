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
Device = Annotated[
    str,
    typer.Option(
        "--device",
        help="cpu: this machine's cores as ranks (the `local` profile); cuda: GPU 0 as the published "
        "hardware tables measure it, written as a cluster file for --cluster (default "
        "~/.autopar/<gpu>-probed.yaml).",
    ),
]


@app.command()
def probe(ranks: Ranks = None, out: Out = None, timeout: Timeout = 120.0, device: Device = "cpu") -> None:
    """GEMM throughput by shape, memory bandwidth, collective bandwidth/latency per group size -> a profile.

    Example: autopar probe && autopar search --model tiny --gpus 2 --gpu local --trials 8
    On a GPU: autopar probe --device cuda && autopar search --model 8b --gpus 64 --cluster ~/.autopar/h200-probed.yaml
    """
    import os

    from autopar.cli.checks import output_file
    from autopar.errors import InputError
    from autopar.measured.local_profile import probe_machine, write_local_profile
    from autopar.measured.needs_torch import require_torch
    from autopar.spec.hardware import local_profile_path
    from autopar.spec.schema import check_flags

    check_flags({"--ranks": ranks, "--timeout": timeout})
    if device not in ("cpu", "cuda"):
        raise InputError(f"--device must be cpu or cuda, got {device!r}")
    require_torch("autopar probe")  # its benchmarks run torch in subprocesses
    if device == "cuda":
        if ranks is not None:
            raise InputError("--ranks is for --device cpu; on a GPU node the probe runs a rank per GPU")
        _probe_gpu(out, timeout)
        return
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


def _probe_gpu(out: Optional[Path], timeout: float) -> None:
    """GPU 0 (and the node's collectives) measured and written as a cluster file; the raw result
    beside it (.json)."""
    from autopar.cli.checks import output_file
    from autopar.errors import InputError
    from autopar.measured.local_profile import probe_gpu, write_gpu_cluster
    from autopar.spec.hardware import local_profile_path, preset_for_device

    if out is not None:
        output_file(out, "--out")
    scratch = local_profile_path().parent / "gpu-probe.json"
    doc = probe_gpu(timeout, scratch)
    preset = preset_for_device(doc["device"])
    if preset is None:
        raise InputError(
            f"no GPU preset describes '{doc['device']}' (autopar hardware lists them); its measurements are in "
            f"{scratch}: write its datasheet figures under gpu: in a cluster file and copy them under behaviour:"
        )
    dest = out or local_profile_path().parent / f"{preset}-probed.yaml"
    body = write_gpu_cluster(dest, doc)
    raw = dest.with_suffix(".json")
    scratch.replace(raw)
    b = body["behaviour"]
    fp8 = f", FP8 {b['fp8_tflops']:.0f}" if "fp8_tflops" in b else ""
    print(
        f"{doc['device']}: GEMM BF16 {b['bf16_tflops']:.0f}{fp8} TFLOP/s achievable (half rate at dimension "
        f"{b['gemm_half_dim']:.0f}), copy {b['hbm_gbps']:.0f} GB/s, launch {doc['launch_us']:.1f} us per kernel"
    )
    node = doc.get("node_collectives") or {}
    if "nvlink_all_reduce_busbw" in b:
        print(
            f"NVLink, {b['nvlink_gpus']} GPUs: all-reduce {b['nvlink_all_reduce_busbw'][-1]:.0f}, all-gather "
            f"{b['nvlink_all_gather_busbw']:.0f}, all-to-all {b['nvlink_all_to_all_busbw']:.0f} GB/s busbw"
        )
    elif "error" in node:
        print(f"NVLink collectives not measured ({node['error']}): the published figures stay")
    print(f"Cluster file: {dest} (raw: {raw}); use it with --cluster {dest}")
