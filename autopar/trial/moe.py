"""The routed mixture-of-experts block of the built-in model (Mixtral / DeepSeek-MoE): router, grouped
experts, optional shared expert, auxiliary load-balancing loss; knows nothing of parallelism (the
dispatch to expert ranks and the sequence-wide statistics are swapped in by
autopar.trial.parallel.expert and autopar.trial.parallelize).

Sources: Mixtral (Jiang et al. 2024: top-k of the router logits, softmax over the k chosen),
DeepSeek-V3 (aux-loss-free router bias, sequence-wise auxiliary loss), Switch Transformer (Fedus et
al. 2021: the load-balancing loss), torchtitan `GroupedExperts` (stacked expert weights).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autopar.spec.model import ModelSpec
from autopar.trial.layers import FeedForward


class GroupedExperts(nn.Module):
    """E SwiGLU experts as stacked weights [E, ...] (torchtitan `GroupedExperts`), run locally.
    Under expert parallelism a rank holds experts [offset, offset + E_local) of `total`; under expert
    tensor parallelism the FFN columns [ffn_offset, ffn_offset + ffn_local) of `ffn_total` (its
    output is then a partial sum over the shards)."""

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        ffn: int,
        offset: int = 0,
        total: int | None = None,
        ffn_offset: int = 0,
        ffn_total: int | None = None,
    ) -> None:
        super().__init__()
        self.offset, self.total = offset, total if total is not None else num_experts
        self.ffn_offset, self.ffn_total = ffn_offset, ffn_total if ffn_total is not None else ffn
        self.w1 = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        # factor on the weight gradients (expert parallelism: 1/ep, autopar.trial.parallel.expert)
        self.grad_scale = 1.0

    def forward(self, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Rows of x grouped by local expert (`sizes[e]` rows for expert e, in order) through their
        experts, in one call (an FSDP unit must run one forward per step, or it re-gathers)."""
        weights = (self.w1, self.w2, self.w3)
        if self.grad_scale != 1.0:
            weights = tuple(GradScale.apply(w, self.grad_scale) for w in weights)
        # one unbind per weight: its backward stacks the experts' gradients once (indexing each
        # expert would allocate a whole [E, ...] gradient per expert)
        w1, w2, w3 = (w.unbind(0) for w in weights)
        outs = [
            (F.silu(part @ w1[e].t()) * (part @ w3[e].t())) @ w2[e].t()
            for e, part in enumerate(x.split(sizes))
            if part.shape[0]
        ]
        return torch.cat(outs) if outs else x[:0]


class GradScale(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by a constant."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


#: router modes: "topk" (learned), "balanced" (round-robin by token position: every expert gets the
#: same count; Megatron-Bridge's forced balancing for MoE benchmarks), "skewed" (top-k of the logits
#: plus a fixed ramp favouring low expert ids: deliberately uneven splits, for tests)
ROUTING_MODES = ("topk", "balanced", "skewed")


class AuxLossScaler(torch.autograd.Function):
    """Identity on the activations whose backward also feeds d(aux)/d(aux) = scale to the auxiliary
    loss (Megatron `MoEAuxLossAutoScaler`): the load-balancing loss trains the router without
    changing the reported language-model loss."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


def sort_copies(top: torch.Tensor, keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The routed copies (token t, slot j -> id t*k + j) kept by the capacity mask, sorted by expert
    (stable: token order inside each expert): (copy ids, their experts)."""
    expert_of_copy = top.reshape(-1)
    copy_ids = torch.arange(top.numel(), device=top.device)
    if keep is not None:  # capacity: dropped copies are neither run nor combined
        copy_ids = copy_ids[keep.reshape(-1)]
        expert_of_copy = expert_of_copy[copy_ids]
    order = torch.argsort(expert_of_copy, stable=True)
    return copy_ids[order], expert_of_copy[order]


class MoE(nn.Module):
    """Top-k routed experts + optional shared expert (Mixtral / DeepSeek-MoE).

    Router: softmax top-k (the k weights are the softmax over the k chosen logits, Mixtral), an
    optional DeepSeek-V3 bias that steers only the choice, and the Switch-Transformer auxiliary
    load-balancing loss aux = coeff * E * sum_e f_e * P_e (Fedus et al. 2021), computed per sequence
    and averaged over sequences (DeepSeek-V3's sequence-wise form): f_e is the share of the
    sequence's k*s routed copies sent to expert e, P_e its mean router probability. Its statistics
    are global to the sequence (`sequence_stats`: when other ranks hold other tokens of the same
    sequences, autopar.trial.parallelize swaps in their sum over those ranks), so every parallel
    layout trains the same loss as one process.

    `routed_experts` runs the routed copies through the experts held here; expert parallelism
    (autopar.trial.parallel.expert.apply_ep) swaps in its dispatch to the experts' ranks and the
    combine back. `capacity_factor` (None = dropless) caps each expert at ceil(cf * copies / E) of
    this rank's copies, dropping the rest."""

    def __init__(
        self, spec: ModelSpec, routing: str = "topk", capacity_factor: float | None = None, aux_loss_coeff: float = 0.0
    ) -> None:
        super().__init__()
        m = spec.moe
        assert m is not None
        if routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {ROUTING_MODES}, got {routing!r}")
        self.top_k = m.top_k
        self.num_experts = m.num_experts
        self.groups, self.group_topk = m.router_groups, m.router_group_topk
        self.routing, self.capacity_factor, self.aux_loss_coeff = routing, capacity_factor, aux_loss_coeff
        self.router = nn.Linear(spec.hidden_size, m.num_experts, bias=False)
        # DeepSeek-V3 aux-loss-free bias: steers the choice only, updated outside autograd
        self.expert_bias = nn.Parameter(torch.zeros(m.num_experts), requires_grad=False) if m.router_bias else None
        self.experts = GroupedExperts(m.num_experts, spec.hidden_size, m.expert_ffn_hidden_size)
        self.shared_expert = (
            FeedForward(spec.hidden_size, m.shared_expert_ffn_hidden_size) if m.num_shared_experts else None
        )
        self.aux_scale = 1.0  # gradient of the aux loss per microbatch (1/microbatches outside a pipeline)
        self.positions: torch.Tensor | None = None  # token positions (for balanced routing), set per forward
        self.last_counts: torch.Tensor | None = None  # routed copies per expert, last forward (no grad)

    def route(self, flat: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(chosen experts [T, k], their weights [T, k], probabilities [T, E]) of T = b*seq tokens."""
        logits = self.router(flat).float()
        probs = torch.softmax(logits, dim=-1)
        e, k = self.num_experts, self.top_k
        if self.routing == "balanced":
            pos = self.positions if self.positions is not None else torch.arange(seq)
            pos = pos.to(flat.device).repeat(flat.shape[0] // seq)
            top = (pos[:, None] * k + torch.arange(k, device=flat.device)) % e
        else:
            choice = logits.detach() + self.expert_bias if self.expert_bias is not None else logits.detach()
            if self.routing == "skewed":
                choice = choice + torch.linspace(4.0, 0.0, e, device=flat.device)
            if 1 < self.group_topk < self.groups:
                choice = self.limit_to_groups(choice)
            top = choice.topk(k, dim=-1).indices
        weights = torch.softmax(logits.gather(-1, top), dim=-1)
        return top, weights, probs

    def limit_to_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """Group-limited routing (megatron/core/transformer/moe/moe_utils.py group_limited_topk): the
        experts in `groups` runs of consecutive experts, each scored by the sum of its top
        top_k / group_topk probabilities; the experts outside a token's best `group_topk` groups are
        masked out of its choice [T, E]."""
        t, g, per = choice.shape[0], self.groups, self.num_experts // self.groups
        scores = torch.softmax(choice, dim=-1).view(t, g, per)
        group_scores = scores.topk(self.top_k // self.group_topk, dim=-1).values.sum(-1)  # [T, G]
        chosen = torch.zeros_like(group_scores, dtype=torch.bool)
        chosen.scatter_(1, group_scores.topk(self.group_topk, dim=-1).indices, True)
        return choice.masked_fill(~chosen.repeat_interleave(per, dim=1), float("-inf"))

    def keep_mask(self, top: torch.Tensor) -> torch.Tensor | None:
        """Capacity factor: True for the copies kept (the first `capacity` per expert in token order)."""
        if self.capacity_factor is None:
            return None
        flat = top.reshape(-1)
        cap = math.ceil(self.capacity_factor * flat.numel() / self.num_experts)
        onehot = F.one_hot(flat, self.num_experts)
        rank_in_expert = (onehot.cumsum(0) * onehot).sum(-1) - 1
        return (rank_in_expert < cap).view(top.shape)

    def aux_loss(self, top: torch.Tensor, probs: torch.Tensor, b: int, seq: int) -> torch.Tensor:
        e, k = self.num_experts, self.top_k
        counts = F.one_hot(top, e).sum(1).view(b, seq, e).sum(1).float()  # [b, E]
        prob_sum = probs.view(b, seq, e).sum(1)  # [b, E]
        n = torch.tensor(float(seq), device=probs.device)
        counts, prob_sum, n = self.sequence_stats(counts, prob_sum, n)
        f = counts / (n * k)
        p = prob_sum / n
        return self.aux_loss_coeff * e * (f * p).sum(-1).mean()

    def sequence_stats(
        self, counts: torch.Tensor, prob_sum: torch.Tensor, n: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The routing statistics of whole sequences from this rank's tokens of them: (copies per
        expert [b, E], probability sums [b, E], tokens); here every token of a sequence is local."""
        return counts, prob_sum, n

    def routed_experts(
        self, flat: torch.Tensor, top: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """The routed-expert output [T, h] of tokens `flat` [T, h] with every expert here: one
        grouped call (an FSDP unit runs one forward per microbatch)."""
        copy_sorted, expert_sorted = sort_copies(top, keep)
        sizes = torch.bincount(expert_sorted, minlength=self.num_experts).tolist()
        y_sorted = self.experts(flat[copy_sorted // self.top_k], sizes)
        y_copies = y_sorted.new_zeros(top.numel(), flat.shape[-1]).index_copy(0, copy_sorted, y_sorted)
        return (y_copies.view(*top.shape, -1) * weights[..., None]).sum(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        b, seq = shape[0], shape[1]
        flat = x.reshape(-1, shape[-1])
        top, weights, probs = self.route(flat, seq)
        keep = self.keep_mask(top)
        if keep is not None:
            weights = weights * keep
        self.last_counts = torch.bincount(
            top[keep] if keep is not None else top.reshape(-1), minlength=self.num_experts
        ).detach()
        out = self.routed_experts(flat, top, weights.type_as(x), keep)
        if self.shared_expert is not None:  # on [b, s, h]: under TP its region gathers the sequence
            out = out + self.shared_expert(x).reshape(flat.shape)
        if self.aux_loss_coeff and self.training and torch.is_grad_enabled():
            out = AuxLossScaler.apply(out, self.aux_loss(top, probs, b, seq), self.aux_scale)
        return out.view(shape)
