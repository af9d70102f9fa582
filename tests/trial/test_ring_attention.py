"""Ring attention (autopar.trial.parallel.context) against full causal SDPA, forward and backward,
on 2 and 4 gloo processes: load-balanced and contiguous chunks, GQA. The contiguous layout leaves
rank 0 with every non-diagonal block masked: it must still take part in every exchange (the known
backward hang of autograd-built rings); the process timeout proves no hang."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from autopar.trial.comm_count import CommBytesMode
from autopar.trial.parallel.context import cp_positions, ring_attention

pytestmark = [pytest.mark.timeout(120), pytest.mark.distributed, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, n: int, port: int, load_balance: bool, heads: int, kv_heads: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world = n
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        b, s, d = 2, 8 * world, 8
        q = torch.randn(b, heads, s, d, dtype=torch.float64)
        k = torch.randn(b, kv_heads, s, d, dtype=torch.float64)
        v = torch.randn(b, kv_heads, s, d, dtype=torch.float64)
        dout = torch.randn(b, heads, s, d, dtype=torch.float64)
        rep = heads // kv_heads
        ref_q, ref_k, ref_v = (t.clone().requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(
            ref_q, ref_k.repeat_interleave(rep, 1), ref_v.repeat_interleave(rep, 1), is_causal=True
        )
        ref.backward(dout)
        pos = cp_positions(s, world, rank, load_balance)
        lq, lk, lv = (t[:, :, pos].clone().requires_grad_() for t in (q, k, v))
        with CommBytesMode({frozenset(range(world)): "cp"}) as cb:
            o = ring_attention(lq, lk, lv, dist.group.WORLD, load_balance)
            o.backward(dout[:, :, pos])
        errs = [
            (o - ref[:, :, pos]).abs().max().item(),
            (lq.grad - ref_q.grad[:, :, pos]).abs().max().item(),
            (lk.grad - ref_k.grad[:, :, pos]).abs().max().item(),
            (lv.grad - ref_v.grad[:, :, pos]).abs().max().item(),
        ]
        kv_bytes = 2 * b * kv_heads * len(pos) * d * 8
        out[rank] = {"errs": errs, "sent": dict(cb.count.bytes_by_axis).get("cp", 0), "kv_bytes": kv_bytes}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "n,load_balance,heads,kv_heads",
    [(2, True, 4, 2), (4, True, 2, 2), (2, False, 4, 2), (4, False, 4, 1)],
    ids=["cp2-balanced-gqa", "cp4-balanced", "cp2-contiguous", "cp4-contiguous-mqa"],
)
def test_ring_attention_matches_sdpa(n: int, load_balance: bool, heads: int, kv_heads: int) -> None:
    world = n
    ctx = mp.get_context("spawn")
    out = ctx.Manager().dict()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, load_balance, heads, kv_heads, out)) for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    hung = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"ring attention hung (ranks {hung} still running after 60 s)"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    for rank, res in sorted(out.items()):
        assert max(res["errs"]) < 1e-10, (rank, res)
        # K/V forward cp-1 times, K/V and dK/dV backward cp-1 times each (autopar.cost.comm.cp_calls)
        assert res["sent"] == 3 * (world - 1) * res["kv_bytes"], (rank, res)
