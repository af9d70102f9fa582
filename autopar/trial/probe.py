"""Microbenchmarks of this machine for `autopar probe`: GEMM throughput by shape, memory bandwidth,
collective bandwidth and latency by group size (torch.matmul / torch.distributed, timed with
time.perf_counter after a warm-up, as nccl-tests does: algbw = bytes / time, busbw = algbw x 2(n-1)/n
for all-reduce, (n-1)/n for all-gather; nccl-tests PERFORMANCE.md).

`python -m autopar.trial.probe gemm --out g.json` runs single-process (one thread, as a torchrun
rank gets); `python -m torch.distributed.run --nproc_per_node N -m autopar.trial.probe collectives
--out c.json` runs the collectives, rank 0 writes. `python -m autopar.trial.probe gpu --device cuda
--out g.json` measures GPU 0 as the published tables do (autopar/spec/data/hardware_behaviour.toml):
the achievable BF16 and FP8 GEMM rates and the fall-off with a small dimension, a copy's HBM
bandwidth, SDPA attention forward and backward by sequence length (cuDNN and FlashAttention-2
backends), the host's launch floor; CUDA events time the kernels. `python -m torch.distributed.run
--nproc_per_node G -m autopar.trial.probe node-collectives --device cuda --out c.json` measures the
node's NCCL all-reduce, all-gather, all-to-all and send/recv bandwidth.
"""

from __future__ import annotations

import argparse
import functools
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


def gemm(shapes=GEMM_SHAPES, dtype=torch.float32, budget_s: float = 0.2) -> list[dict]:
    """Achieved FLOP/s of (m x k) @ (k x n) per shape on this CPU, median of repeats filling ~budget_s
    (a GPU's: gpu_gemm)."""
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=dtype)
        b = torch.randn(k, n, dtype=dtype)

        def mm():
            a @ b

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


#: large GEMMs the achievable rate (MAMF) is the best of: ml-engineering's mamf-finder sweeps shapes
#: like these and reports the best (stas00/ml-engineering compute/accelerator/benchmarks/mamf-finder.py)
MAMF_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 4096), (16384, 8192, 8192), (6144, 12288, 8192))
#: the smallest GEMM dimension swept at N = K = 8192 (the shape fall-off x / (x + x_half))
SMALL_M = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: attention: sequence lengths, at head dim 128, 16 heads and 32K tokens per call
ATTENTION_SEQ = (1024, 2048, 4096, 8192, 16384)


def _cuda_time(fn, budget_s: float = 0.15, reps: int | None = None) -> float:
    """Median seconds of fn on the current CUDA stream (CUDA events), after a warm-up; repeats fill
    about budget_s, or exactly `reps` (a collective: every rank must make the same calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    times = []
    for _ in range(reps if reps is not None else max(5, min(200, int(budget_s / one)))):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def gpu_gemm(shapes, dtype: str, device: str = "cuda", budget_s: float = 0.15) -> list[dict]:
    """FLOP/s of (m x k) @ (k x n) per shape on random data, in BF16 (torch.matmul) or FP8 e4m3 with
    per-tensor scales (torch._scaled_mm, what Transformer Engine's tensorwise recipe runs)."""
    out = []
    for m, n, k in shapes:
        if dtype == "fp8":
            a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
            one = torch.ones((), device=device)
            mm = functools.partial(torch._scaled_mm, a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
            mm = functools.partial(torch.matmul, a, b)
        t = _cuda_time(mm, budget_s) if device == "cuda" else _time(mm, 3)
        out.append({"m": m, "n": n, "k": k, "seconds": t, "flops_per_s": 2 * m * n * k / t})
        del a, b
    return out


def gpu_copy_bandwidth(n_bytes: int = 4 << 30, device: str = "cuda") -> float:
    """Bytes/s a device-to-device copy reads plus writes (the HBM bandwidth of memory-bound kernels)."""
    x = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    t = _cuda_time(lambda: y.copy_(x)) if device == "cuda" else _time(lambda: y.copy_(x), 3)
    return 2 * n_bytes / t


def attention_rates(backend: str, seqs=ATTENTION_SEQ, tokens: int = 32768, heads: int = 16, device: str = "cuda"):
    """FLOP/s of PyTorch SDPA on one backend ("cudnn": cuDNN fused attention, Hopper-native; "flash":
    FlashAttention-2) at head dim 128, causal and unmasked: forward FLOPs 4 B S^2 H D (/2 causal),
    backward 2.5 x that (the convention of the published tables); backward time = forward+backward
    time - forward time. An `error` in place of the rows where the backend does not run here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    kind = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = []
    for s in seqs:
        b = max(1, tokens // s)
        q, k, v = (torch.randn(b, heads, s, 128, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, heads, s, 128, device=device, dtype=dtype)
        row: dict[str, Any] = {"seq": s, "batch": b, "heads": heads, "head_dim": 128}
        for causal in (True, False):
            flops = 4 * b * s * s * heads * 128 / (2 if causal else 1)

            def fwd(causal=causal):
                with torch.no_grad():
                    sdpa(q, k, v, is_causal=causal)

            def fwd_bwd(causal=causal):
                sdpa(q, k, v, is_causal=causal).backward(grad)

            try:
                with sdpa_kernel([kind] if device == "cuda" else [SDPBackend.MATH]):
                    timer = _cuda_time if device == "cuda" else (lambda f: _time(f, 2))
                    tf, tfb = timer(fwd), timer(fwd_bwd)
            except RuntimeError as e:  # the backend does not support this GPU / shape
                return {"backend": backend, "error": str(e).splitlines()[0][:200]}
            name = "causal" if causal else "full"
            row[f"{name}_fwd_flops_per_s"] = flops / tf
            row[f"{name}_bwd_flops_per_s"] = 2.5 * flops / max(tfb - tf, 1e-9)
            row[f"{name}_fwd_bwd_flops_per_s"] = 3.5 * flops / tfb
        rows.append(row)
    return {"backend": backend, "rows": rows}


def launch_floor_us(n: int = 2000, device: str = "cuda") -> float:
    """Host microseconds per eager PyTorch kernel launch (an in-place add on one element, n launches,
    one synchronisation): the issue rate below which a layer pass waits on the host."""
    x = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(100):
        x.add_(1)
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def gpu_probe(device: str = "cuda", quick: bool = False) -> dict:
    """Everything `autopar probe --device cuda` measures on GPU 0 (quick: tiny sizes, for a CPU smoke test)."""
    mamf = ((256, 256, 256),) if quick else MAMF_SHAPES
    small = tuple((m, 256, 256) for m in (16, 64, 256)) if quick else tuple((m, 8192, 8192) for m in SMALL_M)
    seqs = (64, 128) if quick else ATTENTION_SEQ
    tokens = 256 if quick else 32768
    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "device_count": torch.cuda.device_count() if device == "cuda" else 1,
        "memory_bytes": torch.cuda.get_device_properties(0).total_memory if device == "cuda" else 0,
        "capability": list(torch.cuda.get_device_capability(0)) if device == "cuda" else [0, 0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"),
        "bf16_gemm": gpu_gemm(mamf, "bf16", device),
        "bf16_gemm_small_m": gpu_gemm(small, "bf16", device),
    }
    if device == "cuda" and tuple(torch.cuda.get_device_capability(0)) >= (8, 9):
        try:
            doc["fp8_gemm"] = gpu_gemm(mamf, "fp8", device)
        except (RuntimeError, TypeError) as e:  # no FP8 GEMM in this torch build
            doc["fp8_gemm_error"] = str(e).splitlines()[0][:200]
    doc["copy_bytes_per_s"] = gpu_copy_bandwidth((8 << 20) if quick else (4 << 30), device)
    doc["attention"] = [attention_rates(b, seqs, tokens, device=device) for b in ("cudnn", "flash")]
    doc["launch_us"] = launch_floor_us(200 if quick else 2000, device)
    return doc


#: message sizes of the node's collectives (the nccl-tests "size": the whole buffer), 1 MiB .. 1 GiB
NODE_COLL_SIZES = tuple(1 << e for e in range(20, 31, 2))


def node_collectives(sizes=NODE_COLL_SIZES, device: str = "cuda", reps: int = 10) -> dict:
    """On every GPU of this node (a torchrun rank each; NCCL on CUDA, gloo on the CPU): all-reduce,
    all-gather and all-to-all bus bandwidth by buffer size, and rank 0 -> 1 send/recv bandwidth at
    the largest size, the slowest rank's time of each (nccl-tests PERFORMANCE.md conventions:
    busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and all-to-all)."""
    import torch.distributed as dist

    n, rank = dist.get_world_size(), dist.get_rank()
    # torch 2.13 renamed all_gather_into_tensor (same arguments); older releases have only that name
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    elem = torch.finfo(dtype).bits // 8

    def timed(fn) -> float:
        dist.barrier()
        t = _cuda_time(fn, reps=reps) if device == "cuda" else _time(fn, reps)
        worst = torch.tensor([t], device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return float(worst)

    rows = []
    for size in sizes:
        count = max(n, size // elem // n * n)  # divisible by n: the all-to-all and all-gather shards
        buf = torch.ones(count, dtype=dtype, device=device)
        out = torch.empty_like(buf)
        shard = buf[: count // n]
        ar = timed(lambda buf=buf: dist.all_reduce(buf))
        ag = timed(lambda out=out, shard=shard: all_gather(out, shard))
        a2a = timed(lambda out=out, buf=buf: dist.all_to_all_single(out, buf))
        nbytes = count * elem
        rows.append(
            {
                "bytes": nbytes,
                "all_reduce_busbw_gbps": nbytes / ar * 2 * (n - 1) / n / 1e9,
                "all_gather_busbw_gbps": nbytes / ag * (n - 1) / n / 1e9,
                "all_to_all_busbw_gbps": nbytes / a2a * (n - 1) / n / 1e9,
            }
        )
    res = {"world_size": n, "backend": dist.get_backend(), "rows": rows, "p2p_gbps": None}
    if n < 2:  # no peer to send to: a send to rank 1 would wait forever
        return res
    buf = torch.ones(max(1, sizes[-1] // elem), dtype=dtype, device=device)

    def p2p(buf=buf):
        if rank == 0:
            dist.send(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)

    return res | {"p2p_gbps": buf.numel() * elem / timed(p2p) / 1e9}


def _node_collectives_main(out: Path, device: str, quick: bool) -> None:
    import torch.distributed as dist

    if device == "cuda":
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=local)  # the rank's GPU, not NCCL's guess
    else:
        dist.init_process_group("gloo")
    res = node_collectives((1 << 12, 1 << 16) if quick else NODE_COLL_SIZES, device)
    if dist.get_rank() == 0:
        out.write_text(dumps(res, indent=1))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # skip the process group's teardown, which may abort at interpreter exit


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m autopar.trial.probe", description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("gemm", "collectives", "gpu", "node-collectives"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: on GPU 0")
    ap.add_argument("--quick", action="store_true", help="gpu: tiny sizes (a smoke test of the probe itself)")
    args = ap.parse_args(argv)
    if args.what == "collectives":
        _collectives_main(args.out)
    if args.what == "node-collectives":
        _node_collectives_main(args.out, args.device, args.quick)
    if args.what == "gpu":
        args.out.write_text(dumps(gpu_probe(args.device, args.quick), indent=1))
        return
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.device == "cuda":
        res = gpu_gemm(GPU_GEMM_SHAPES, "bf16")
        doc: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "dtype": "bf16", "gemm": res}
    else:
        doc = {"threads": torch.get_num_threads(), "gemm": gemm(), "memory_bytes_per_s": memory_bandwidth()}
    args.out.write_text(dumps(doc | {"torch": torch.__version__}, indent=1))


if __name__ == "__main__":
    main()
