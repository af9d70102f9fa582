"""Context parallelism: hand-written ring attention over the cp axis (CPU/gloo and CUDA alike).

Sources: Liu et al. 2023 Ring Attention; Megatron-Core / TransformerEngine p2p context parallelism
(`AttnFuncWithCPAndKVP2P`: load-balanced chunks, K/V re-circulated in the backward together with
dK/dV); the online-softmax merge of blockwise results (Milakov & Gimelshein 2018; FlashAttention);
hand-written because torch's `context_parallel()` has no CPU path in 2.13; an autograd-built ring
deadlocks in the backward unless every ring step stays in the graph.

Layout (load-balanced, the default): the sequence of length s is cut into 2*cp chunks of
c = s/(2cp); cp rank r holds chunks r and 2cp-1-r (positions `cp_positions`), so every rank has the
same amount of causal work. Ring step i brings the K/V block of rank src = (r - i) mod cp:
- src == r: the local causal (diagonal) block, the two local chunks in position order;
- src <  r: every local query sees the first K/V chunk (chunk src) and none of the second;
- src >  r: only the second local query chunk (chunk 2cp-1-r) sees both K/V chunks.
Without load balancing (contiguous chunks, `load_balance=False`) src > r is fully masked: rank 0
computes nothing after step 0, but still takes part in every exchange.

The ring is one autograd Function, not autograd over P2P shifts: the forward sends the local K/V
block cp-1 times (computing the current block while the next arrives); the backward sends K/V
cp-1 times again and the travelling dK/dV cp-1 times (the last hop returns it to its owner), as
the cost model counts (autopar.cost.comm.cp_calls: 3(cp-1) sends of a K/V-sized block per layer).
Every rank issues every send and receive whatever its mask, so no rank can leave a peer waiting.
Blocks keep the un-repeated KV heads (GQA): the K/V block on the wire is tokens x (k + v) / tp.
Scores, the softmax statistics and dK/dV accumulate in fp32 (bf16 inputs); the travelling dK/dV is
sent in the K/V dtype, as TE does, so the bytes are the cost model's in bf16 too.

On CUDA a fused blockwise kernel (flash attention returning the log-sum-exp) could replace the
per-block math behind this same Function; not done: the CPU path is the tested one.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist


def cp_positions(seq_len: int, cp: int, rank: int, load_balance: bool = True) -> torch.Tensor:
    """The token positions cp rank `rank` holds (load-balanced: chunks r and 2cp-1-r of 2cp)."""
    if not load_balance:
        n = seq_len // cp
        return torch.arange(rank * n, (rank + 1) * n)
    if seq_len % (2 * cp):
        raise ValueError(f"load-balanced context parallelism needs seq_len % (2*cp) == 0, got {seq_len}, cp={cp}")
    c = seq_len // (2 * cp)
    return torch.cat(
        [torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]
    )


def _shift(t: torch.Tensor, group, tag: int = 0) -> tuple[torch.Tensor, list]:
    """Start sending `t` to the next rank of the ring and receiving the previous rank's block
    (K/V on tag 0, the travelling dK/dV on tag 1, so the two streams never cross)."""
    r, w = dist.get_rank(group), dist.get_world_size(group)
    t = t.contiguous()
    out = torch.empty_like(t)
    ops = [
        dist.P2POp(dist.isend, t, dist.get_global_rank(group, (r + 1) % w), group, tag),
        dist.P2POp(dist.irecv, out, dist.get_global_rank(group, (r - 1) % w), group, tag),
    ]
    return out, dist.batch_isend_irecv(ops)


def _wait(reqs: list) -> None:
    for req in reqs:
        req.wait()


def _blocks(r: int, src: int, s: int, load_balance: bool):
    """(query slice, key slice, causal) pieces of ring step with K/V from `src`; [] if all masked."""
    full = slice(0, s)
    if src == r:
        return [(full, full, True)]
    if not load_balance:
        return [(full, full, False)] if src < r else []
    h = s // 2
    if src < r:
        return [(full, slice(0, h), False)]
    return [(slice(h, s), full, False)]


def _expand(t: torch.Tensor, rep: int) -> torch.Tensor:
    return t.repeat_interleave(rep, dim=1) if rep > 1 else t


def _scores(q, k, scale, causal):
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """out = causal softmax(q k^T / sqrt(d)) v over the whole (cp-sharded) sequence.
    q [b, h, s_local, d]; k, v [b, h_kv, s_local, d] (GQA: h a multiple of h_kv)."""

    @staticmethod
    def forward(ctx, q, k, v, group, load_balance):
        r, w = dist.get_rank(group), dist.get_world_size(group)
        rep = q.shape[1] // k.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)  # fp32 accumulation for bf16 inputs
        scale = q.shape[-1] ** -0.5
        s = q.shape[-2]
        qf = q.to(acc)
        out = torch.zeros_like(qf)
        lse = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=acc, device=q.device)
        kv = torch.stack([k, v])
        for step in range(w):
            reqs = []
            if step < w - 1:
                nxt, reqs = _shift(kv, group)
            src = (r - step) % w
            for qs, ks, causal in _blocks(r, src, s, load_balance):
                kk = _expand(kv[0][:, :, ks].to(acc), rep)
                vv = _expand(kv[1][:, :, ks].to(acc), rep)
                sc = _scores(qf[:, :, qs], kk, scale, causal)
                b_lse = torch.logsumexp(sc, -1, keepdim=True)
                b_out = torch.exp(sc - b_lse) @ vv
                old_lse = lse[:, :, qs]
                new = torch.logaddexp(old_lse, b_lse)
                out[:, :, qs] = out[:, :, qs] * torch.exp(old_lse - new) + b_out * torch.exp(b_lse - new)
                lse[:, :, qs] = new
            if reqs:
                _wait(reqs)
                kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.load_balance = group, load_balance
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, load_balance = ctx.group, ctx.load_balance
        r, w = dist.get_rank(group), dist.get_world_size(group)
        rep = q.shape[1] // k.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)  # fp32 accumulation for bf16 inputs
        scale = q.shape[-1] ** -0.5
        s = q.shape[-2]
        qf, do = q.to(acc), dout.to(acc)
        delta = (do * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(qf)
        kv = torch.stack([k, v])
        travel = None  # dK/dV of the block currently held, travelling with it
        local = None  # dK/dV of this rank's own block (step 0)
        incoming = None  # dK/dV arriving from the previous holder (step 1 on)
        dkv_reqs: list = []
        for step in range(w):
            reqs = []
            if step < w - 1:
                nxt, reqs = _shift(kv, group)
            src = (r - step) % w
            grad = torch.zeros(kv.shape, dtype=acc, device=kv.device)
            for qs, ks, causal in _blocks(r, src, s, load_balance):
                kk = _expand(kv[0][:, :, ks].to(acc), rep)
                vv = _expand(kv[1][:, :, ks].to(acc), rep)
                sc = _scores(qf[:, :, qs], kk, scale, causal)
                p = torch.exp(sc - lse[:, :, qs])
                dv = p.transpose(-1, -2) @ do[:, :, qs]
                ds = p * (do[:, :, qs] @ vv.transpose(-1, -2) - delta[:, :, qs])
                dq[:, :, qs] += (ds @ kk) * scale
                dk = (ds.transpose(-1, -2) @ qf[:, :, qs]) * scale
                if rep > 1:
                    dk = dk.unflatten(1, (-1, rep)).sum(2)
                    dv = dv.unflatten(1, (-1, rep)).sum(2)
                grad[0][:, :, ks] += dk
                grad[1][:, :, ks] += dv
            if step == 0:
                local = grad
            elif step == 1:
                travel = grad
            else:
                _wait(dkv_reqs)
                travel = incoming.to(acc) + grad
            if step >= 1:
                # hand the accumulated dK/dV on: to the next holder, or (last step) home to its owner
                incoming, dkv_reqs = _shift(travel.to(kv.dtype), group, tag=1)
            if reqs:
                _wait(reqs)
                kv = nxt
        if w > 1:
            _wait(dkv_reqs)
            local = local + incoming.to(acc)
        dk, dv = local[0].to(k.dtype), local[1].to(v.dtype)
        return dq.to(q.dtype), dk, dv, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, load_balance: bool = True) -> torch.Tensor:
    """Causal attention of the local queries over the whole sequence held by the cp `group`."""
    return RingAttention.apply(q, k, v, group, load_balance)


def ring_core(group, load_balance: bool) -> partial:
    """An attention core (`Attention.core`'s signature) that runs as a ring over the cp `group`."""
    core = partial(ring_attention, group=group, load_balance=load_balance)
    # selective recomputation leaves a ring alone (autopar.trial.parallel.recompute); a partial
    # object takes attributes, which its type does not declare
    core.ring = True  # type: ignore[attr-defined]
    return core


def apply_cp(model, cp_mesh, seq_len: int, load_balance: bool = True) -> torch.Tensor:
    """Split attention of `model` (the whole model, before pipelining: stages share its blocks)
    over `cp_mesh`; returns this rank's token positions (the batch columns it trains on)."""
    group = cp_mesh.get_group()
    pos = cp_positions(seq_len, cp_mesh.size(), cp_mesh.get_local_rank(), load_balance)
    for block in model.layers.values():
        block.attention.core = ring_core(group, load_balance)
    model.rope_positions = pos
    return pos
