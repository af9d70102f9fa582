"""Microbenchmarks of this machine for `autopar probe`: GEMM throughput by shape, memory bandwidth,
collective bandwidth and latency by group size (torch.matmul / torch.distributed, timed with
time.perf_counter after a warm-up, as nccl-tests does: algbw = bytes / time, busbw = algbw x 2(n-1)/n
for all-reduce, (n-1)/n for all-gather; nccl-tests PERFORMANCE.md).

`python -m autopar.trial.probe gemm --out g.json` runs single-process (one thread, as a torchrun
rank gets); `python -m torch.distributed.run --nproc_per_node N -m autopar.trial.probe collectives
--out c.json` runs the collectives, rank 0 writes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from autopar.json_out import dumps

GEMM_SHAPES = (
    (64, 64, 64),
    (128, 128, 128),
    (128, 352, 128),
    (256, 256, 256),
    (256, 704, 128),
    (512, 512, 512),
    (1024, 1024, 1024),
)
COLL_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)  # bytes


def _time(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


GPU_GEMM_SHAPES = (
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 4096, 4096),
    (8192, 8192, 8192),
)


def gemm(shapes=GEMM_SHAPES, dtype=torch.float32, budget_s: float = 0.2, device: str = "cpu") -> list[dict]:
    """Achieved FLOP/s of (m x k) @ (k x n) per shape, median of repeats filling ~budget_s (on CUDA
    each repeat is synchronised)."""
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

        def mm():
            a @ b
            sync()

        one = _time(mm, 3)
        t = _time(mm, max(3, int(budget_s / max(one, 1e-6))))
        out.append({"m": m, "n": n, "k": k, "seconds": t, "flops_per_s": 2 * m * n * k / t})
    return out


def memory_bandwidth(n_bytes: int = 64 << 20) -> float:
    """Bytes/s of an out-of-place add (read 2, write 1), the elementwise-kernel traffic model."""
    x, y = torch.ones(n_bytes // 4), torch.ones(n_bytes // 4)
    z = torch.empty_like(x)
    t = _time(lambda: torch.add(x, y, out=z), 5)
    return 3 * n_bytes / t


def collectives(sizes=COLL_SIZES, reps: int = 10) -> dict:
    """all_reduce / all_gather time per payload size over the whole world (rank 0's view)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    res: dict[str, Any] = {"world_size": n, "all_reduce": [], "all_gather": []}
    for size in sizes:
        x = torch.ones(max(1, size // 4))
        outs = [torch.empty_like(x) for _ in range(n)]
        for name, fn, factor in (
            ("all_reduce", lambda: dist.all_reduce(x), 2 * (n - 1) / n),
            ("all_gather", lambda: dist.all_gather(outs, x), (n - 1) / n),
        ):
            dist.barrier()
            t = torch.tensor(_time(fn, reps))
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            sec = float(t)
            res[name].append(
                {"bytes": size, "seconds": sec, "algbw_gbps": size / sec / 1e9, "busbw_gbps": size * factor / sec / 1e9}
            )
    return res


def _collectives_main(out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    res = collectives()
    if dist.get_rank() == 0:
        out.write_text(dumps(res, indent=1))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # skip gloo's process-group teardown, which may abort at interpreter exit


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m autopar.trial.probe", description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("gemm", "collectives"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: bf16 GEMMs on GPU 0")
    args = ap.parse_args(argv)
    if args.what == "collectives":
        _collectives_main(args.out)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.device == "cuda":
        res = gemm(GPU_GEMM_SHAPES, torch.bfloat16, device="cuda")
        doc: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "dtype": "bf16", "gemm": res}
    else:
        doc = {"threads": torch.get_num_threads(), "gemm": gemm(), "memory_bytes_per_s": memory_bandwidth()}
    args.out.write_text(dumps(doc | {"torch": torch.__version__}, indent=1))


if __name__ == "__main__":
    main()
