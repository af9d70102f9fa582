"""Expert parallelism: the routed experts of each MoE layer split over an EP group, tokens moved by
all-to-all (dispatch, then combine), forward and backward.

Sources: GShard (Lepikhin et al. 2020) / Switch (Fedus et al. 2021) all-to-all dispatch; Megatron-Core
`MoEAlltoAllTokenDispatcher` (count exchange, variable splits, sort by local expert, combine with the
swapped splits, unsort); torch.distributed
`all_to_all_single` with uneven splits (it works on gloo).

Groups (autopar.trial.mesh.build_expert_mesh): inside a pipeline stage the tp*cp*dp ranks are
re-viewed as (edp, ep, etp), etp innermost, so an EP group takes ep ranks at stride etp: with
etp = tp it spans dp x cp ranks; with etp = 1 under tp > 1 it folds the tp ranks in (each holds its
own sequence shard under SP: Megatron-Core's MoE parallel folding). EP rank j holds experts
[j*E/ep, (j+1)*E/ep). With etp = tp > 1 (expert tensor parallelism, Megatron-Core's default) each
expert's FFN is split over the etp ranks like a dense MLP (w1/w3 columns, w2 rows): after the
dispatch the etp ranks all-gather the rows they received (variable sizes, after gathering their
per-expert counts), run their FFN shard, and reduce-scatter the partial outputs back to the rows'
owners before the combine (`gather_from_sequence_parallel_region` / `reduce_scatter_to_sequence_
parallel_region` with split sizes in Megatron-Core). Dense parameters reduce their gradients over
dp x cp; expert parameters over expert-dp (edp = tp*cp*dp/(ep*etp)), scaled by `expert_grad_scale`
in their backward.

One MoE layer per microbatch, on each EP rank with T local tokens and k copies each:
1. count exchange: all_to_all_single of the per-expert copy counts (E int64): each rank learns how
   many rows it receives from each peer for each of its local experts (the receive buffer size);
2. dispatch: the k*T copies sorted by expert, all_to_all_single with splits per destination rank;
3. the received rows (source-major, expert-sorted inside each source) regrouped by local expert and
   run through the local experts;
4. combine: the outputs back with the swapped splits, unsorted to (token, slot) and summed with the
   router weights (top-k > 1: k rows per token, scatter-added back).
The two payload all-to-alls are differentiable (their backward is the all-to-all with the splits
swapped), so per layer a rank hands over k*T rows (dispatch), R rows (combine, R = rows received),
and the same again backward: 2(kT + R) rows, = 4kT with balanced routing (autopar.cost.comm.ep_calls).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autopar.trial.model import Transformer
from autopar.trial.moe import GroupedExperts, MoE, sort_copies


class AllToAll(torch.autograd.Function):
    """all_to_all_single with explicit splits; the backward sends the gradients back (splits swapped)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(
            out, x.contiguous(), output_split_sizes=out_splits, input_split_sizes=in_splits, group=group
        )
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(
            back, grad.contiguous(), output_split_sizes=in_splits, input_split_sizes=out_splits, group=ctx.group
        )
        return back, None, None, None


class GatherRows(torch.autograd.Function):
    """All-gather of a variable number of rows per rank (rank i holds rows[i]); the backward
    reduce-scatters the gradient back to each rank's rows (Megatron-Core
    `gather_from_sequence_parallel_region` with output_split_sizes)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: list[int], group) -> torch.Tensor:
        ctx.rows, ctx.group = rows, group
        return gather_rows(x, rows, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return reduce_scatter_rows(grad, ctx.rows, ctx.group), None, None


class ScatterRows(torch.autograd.Function):
    """Reduce-scatter (sum) of variable row blocks: rank i gets the sum of every rank's block i; the
    backward all-gathers (Megatron-Core `reduce_scatter_to_sequence_parallel_region`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: list[int], group) -> torch.Tensor:
        ctx.rows, ctx.group = rows, group
        return reduce_scatter_rows(x, rows, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return gather_rows(grad, ctx.rows, ctx.group), None, None


def gather_rows(x: torch.Tensor, rows: list[int], group) -> torch.Tensor:
    """Every rank's rows, concatenated in rank order. gloo's all-gather needs equal sizes: the
    blocks are padded to the largest (equal under balanced routing, so nothing is padded then)."""
    if dist.get_backend(group) != "gloo":
        parts = [x.new_empty((n,) + tuple(x.shape[1:])) for n in rows]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)
    most = max(rows)
    buf = x.new_zeros((most,) + tuple(x.shape[1:]))
    buf[: x.shape[0]] = x
    out = x.new_empty((most * len(rows),) + tuple(x.shape[1:]))
    dist.all_gather_into_tensor(out, buf, group=group)
    return torch.cat([out[i * most : i * most + n] for i, n in enumerate(rows)])


def reduce_scatter_rows(x: torch.Tensor, rows: list[int], group) -> torch.Tensor:
    """This rank's block of the sum over ranks of x split into `rows` blocks."""
    me = dist.get_rank(group)
    out = x.new_empty((rows[me],) + tuple(x.shape[1:]))
    dist.reduce_scatter(out, [b.contiguous() for b in x.split(rows)], group=group)
    return out


class ExpertDispatch:
    """`MoE.routed_experts` under expert parallelism: the routed copies go to their experts' ranks
    (`ep_group`, None: ep = 1), each expert's FFN split over `etp_group` (None: etp = 1), and come
    back. `rows_log`, when a list, records (rows sent, rows received) per dispatch."""

    def __init__(self, moe: MoE, ep_group, etp_group) -> None:
        self.moe, self.ep_group, self.etp_group = moe, ep_group, etp_group
        self.rows_log: list | None = None

    def __call__(
        self, flat: torch.Tensor, top: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        return expert_parallel_forward(self.moe, flat, top, weights, keep, self.ep_group, self.etp_group, self.rows_log)


def rows_logs(moes: list[MoE]) -> list[list]:
    """Start recording the dispatched rows of every expert-parallel MoE layer; the lists to read."""
    out = []
    for moe in moes:
        if isinstance(moe.routed_experts, ExpertDispatch):
            moe.routed_experts.rows_log = []
            out.append(moe.routed_experts.rows_log)
    return out


def stop_rows_logs(moes: list[MoE]) -> None:
    for moe in moes:
        if isinstance(moe.routed_experts, ExpertDispatch):
            moe.routed_experts.rows_log = None


def sequence_stats_over(group):
    """`MoE.sequence_stats` when other ranks of `group` hold other tokens of the same sequences:
    the counts and probability sums summed over them (the latter with its gradient), the tokens
    times the group size (Megatron-Core sums them over tp x cp: sequence_load_balancing_loss_func)."""
    import torch.distributed.nn.functional as dnn

    def stats(counts: torch.Tensor, prob_sum: torch.Tensor, n: torch.Tensor):
        counts = counts.clone()
        dist.all_reduce(counts, group=group)
        return counts, dnn.all_reduce(prob_sum, group=group), n * dist.get_world_size(group)

    return stats


def expert_parallel_forward(
    moe: MoE,
    flat: torch.Tensor,
    top: torch.Tensor,
    weights: torch.Tensor,
    keep: torch.Tensor | None,
    ep_group,
    etp_group,
    rows_log: list | None = None,
) -> torch.Tensor:
    """The routed-expert output [T, h] of this rank's tokens, experts spread over `ep_group`
    (None: ep = 1) and each expert's FFN over `etp_group` (None: etp = 1)."""
    ep = dist.get_world_size(ep_group) if ep_group is not None else 1
    e, k = moe.num_experts, moe.top_k
    local_e = e // ep
    t = flat.shape[0]
    copy_sorted, expert_sorted = sort_copies(top, keep)  # capacity: dropped copies are not sent
    x_sorted = flat[copy_sorted // k]
    counts = torch.bincount(expert_sorted, minlength=e)  # copies this rank sends to each expert
    # 1. count exchange: row r of recv = counts source rank r sends to each of my local experts
    recv = counts
    if ep_group is not None:
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, group=ep_group)
    send_splits = counts.view(ep, local_e).sum(1).tolist()
    recv_counts = recv.view(1, ep, local_e)
    recv_splits = recv_counts.sum((0, 2)).tolist()
    # 2. dispatch (and, under expert TP, every expert-TP rank takes the rows all of them received)
    x_recv = AllToAll.apply(x_sorted, recv_splits, send_splits, ep_group) if ep_group is not None else x_sorted
    if etp_group is not None:
        etp = dist.get_world_size(etp_group)
        gathered = recv.new_empty(etp * recv.numel())
        dist.all_gather_into_tensor(gathered, recv, group=etp_group)
        recv_counts = gathered.view(etp, ep, local_e)
        etp_rows = recv_counts.sum((1, 2)).tolist()
        x_recv = GatherRows.apply(x_recv, etp_rows, etp_group)
    # 3. regroup (etp rank, source, expert)-major -> expert-major, run the local experts, restore
    seg = recv_counts.reshape(-1).tolist()
    starts = [0]
    for n in seg:
        starts.append(starts[-1] + n)
    blocks = recv_counts.shape[0] * ep  # (etp rank, source) blocks, each expert-sorted
    pieces: list[tuple[int, int]] = []  # (start, len) in received order, expert-major
    sizes: list[int] = []
    for j in range(local_e):
        idx = [i * local_e + j for i in range(blocks)]
        pieces.extend((starts[i], seg[i]) for i in idx)
        sizes.append(sum(seg[i] for i in idx))
    if x_recv.shape[0]:
        perm = torch.cat([torch.arange(s, s + n, device=flat.device) for s, n in pieces])
        y_expert_major = moe.experts(x_recv.index_select(0, perm), sizes)
        y_recv = y_expert_major.new_zeros(x_recv.shape).index_copy(0, perm, y_expert_major)
    else:
        y_recv = x_recv * 0  # keeps the graph (and the backward collectives) when nothing arrived
    if etp_group is not None:  # sum the FFN shards' partial outputs, each rank keeping its rows
        y_recv = ScatterRows.apply(y_recv, etp_rows, etp_group)
    if rows_log is not None:
        rows_log.append((sum(send_splits), sum(recv_splits)))
    # 4. combine, unsort, weight and sum the k copies of each token
    y_sorted = AllToAll.apply(y_recv, send_splits, recv_splits, ep_group) if ep_group is not None else y_recv
    y_copies = y_sorted.new_zeros(t * k, y_sorted.shape[-1]).index_copy(0, copy_sorted, y_sorted)
    return (y_copies.view(t, k, -1) * weights[..., None]).sum(1)


def expert_grad_scale(tp: int, ep: int, etp: int) -> float:
    """Factor on the expert gradients so that, after the expert-dp average, they are the mean over
    the dp*cp data-parallel losses like the dense gradients: each rank's expert gradient sums the
    tokens its EP group routed to it, every token of a dp x cp group is held by exactly one of its
    tp ranks (SP), so the sum over all edp groups covers every dp x cp loss once; averaging divides
    by edp = tp*cp*dp/(ep*etp) instead of dp*cp, hence tp/(ep*etp) (1/ep without TP)."""
    return tp / (ep * etp)


def apply_ep(model: Transformer, ep_mesh, etp_mesh, grad_scale: float) -> list[nn.Parameter]:
    """Give every MoE layer of `model` (before pipelining, on the meta device or initialised) only
    this rank's experts (its EP rank's E/ep, when `ep_mesh`) and of each only its FFN shard (its
    expert-TP rank's ffn/etp columns of w1, w3 and rows of w2, when `etp_mesh`), and the groups;
    returns the expert parameters (reduced over expert-dp), whose backward multiplies their
    gradient by `grad_scale` (`expert_grad_scale`)."""
    spec = model.config.spec
    assert spec.moe is not None
    ep, rank = (ep_mesh.size(), ep_mesh.get_local_rank()) if ep_mesh is not None else (1, 0)
    etp, etp_rank = (etp_mesh.size(), etp_mesh.get_local_rank()) if etp_mesh is not None else (1, 0)
    if spec.moe.num_experts % ep:
        raise ValueError(f"{spec.moe.num_experts} experts do not divide by ep={ep}")
    if spec.moe.expert_ffn_hidden_size % etp:
        raise ValueError(f"expert FFN size {spec.moe.expert_ffn_hidden_size} does not divide by etp={etp}")
    local, ffn = spec.moe.num_experts // ep, spec.moe.expert_ffn_hidden_size // etp
    rows, cols = slice(rank * local, (rank + 1) * local), slice(etp_rank * ffn, (etp_rank + 1) * ffn)
    params: list[nn.Parameter] = []
    for _, block in model.blocks():
        moe = block.moe
        if moe is None:
            continue
        old = moe.experts
        on_meta = old.w1.is_meta
        device = "meta" if on_meta else old.w1.device
        with torch.device(device):
            new = GroupedExperts(
                local,
                spec.hidden_size,
                ffn,
                offset=rank * local,
                total=spec.moe.num_experts,
                ffn_offset=etp_rank * ffn,
                ffn_total=spec.moe.expert_ffn_hidden_size,
            )
        if not on_meta:
            with torch.no_grad():
                new.w1.copy_(old.w1[rows, cols])
                new.w3.copy_(old.w3[rows, cols])
                new.w2.copy_(old.w2[rows, :, cols])
        new.grad_scale = grad_scale
        moe.experts = new
        moe.routed_experts = ExpertDispatch(  # type: ignore[method-assign]  # the per-instance hook MoE documents
            moe,
            ep_mesh.get_group() if ep_mesh is not None else None,
            etp_mesh.get_group() if etp_mesh is not None else None,
        )
        params.extend(new.parameters())
    return params


def init_local_experts(model: Transformer, seed: int) -> None:
    """Set each local expert stack to its slice (experts, and FFN columns under expert TP) of the
    full initial value (after materialisation, which sees only the local shape)."""
    from autopar.trial.model import initial_value

    spec = model.config.spec
    with torch.no_grad():
        for key, block in model.blocks():
            if block.moe is None or not isinstance(block.moe.routed_experts, ExpertDispatch):
                continue
            ex = block.moe.experts
            rows = slice(ex.offset, ex.offset + ex.w1.shape[0])
            cols = slice(ex.ffn_offset, ex.ffn_offset + ex.w1.shape[1])
            ffn, h = ex.ffn_total, spec.hidden_size
            for name, shape in (("w1", (ex.total, ffn, h)), ("w2", (ex.total, h, ffn)), ("w3", (ex.total, ffn, h))):
                full = initial_value(model.config, f"layers.{key}.moe.experts.{name}", shape, seed)
                getattr(ex, name).copy_(full[rows, :, cols] if name == "w2" else full[rows, cols])
