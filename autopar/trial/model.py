"""Llama-style decoder built from a ModelSpec; knows nothing of parallelism.

Sources: Llama / Llama 3 (Touvron et al. 2023; Meta llama3 `model.py`) and torchtitan's llama3
model (RMSNorm, RoPE, GQA attention through SDPA, SwiGLU); Mixtral (Jiang et al. 2024) for the
routed MoE block (top-k of the router logits, softmax over the k chosen).

Module names are the ones the sharding tables (autopar/spec/sharding.py) and the cost model use:
`tok_embeddings`, `layers` (a ModuleDict keyed by the global layer index), per block
`attention.{wq,wk,wv,wo}`, `attention_norm`, `ffn_norm`, `feed_forward.{w1,w2,w3}` (dense) or
`moe.{router,experts,shared_expert}` (MoE), then `norm` and `output`. A part may be None (a
pipeline stage drops the parts it does not hold); forward skips it.

The embedding and LM head have `vocab_rows` rows: Megatron pads the vocabulary to a multiple of
128 * tp (`autopar.cost.flops.padded_vocab`), so the model and the cost model count the same
parameters. As in Megatron, the padded logits take part in the softmax (no target ever points at
them), so the padding is part of the model: compare runs only at equal `vocab_rows`.

Initialisation is a pure function of (seed, parameter name, shape): `initial_value` returns a
parameter's full value, so a sharded or pipelined copy can initialise exactly its own slice and
still equal the single-process model.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autopar.spec.model import ModelSpec
from autopar.trial.features import model_problems
from autopar.trial.parallel.context import ring_attention

INIT_STD = 0.02  # GPT-2 / Megatron `init_method_std`


@dataclass(frozen=True)
class ModelConfig:
    """What the built-in model needs beyond the spec: padded vocabulary and RoPE table length."""

    spec: ModelSpec
    vocab_rows: int  # padded vocabulary (>= spec.vocab_size)
    max_seq_len: int  # RoPE table length: the full sequence, never a local (SP/PP) slice
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    moe_routing: str = "topk"  # MoE router mode (model.ROUTING_MODES)
    moe_capacity_factor: float | None = None  # None = dropless
    moe_aux_loss_coeff: float = 1e-2  # Switch load-balancing loss weight (Megatron's usual 1e-2)

    def __post_init__(self) -> None:
        problems = unsupported(self.spec)
        if self.vocab_rows < self.spec.vocab_size:
            problems.append(f"vocab_rows {self.vocab_rows} < vocab size {self.spec.vocab_size}")
        if problems:
            raise ValueError(f"model '{self.spec.name}' cannot be built: " + "; ".join(problems))


def unsupported(spec: ModelSpec) -> list[str]:
    """Spec features the built-in Llama-style model does not implement, as sentences
    (autopar.trial.features.model_problems, which needs no torch)."""
    return model_problems(spec)


# ---- building blocks ------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019), computed in fp32 as Llama does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rope_table(head_dim: int, max_seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the rotary angles, [max_seq_len, head_dim/2] (Su et al. 2021, Llama `precompute_freqs_cis`)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64, device=device), inv)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of x [b, s, heads, head_dim] (Llama's complex-pair convention)."""
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    """GQA self-attention through SDPA (causal). Head counts come from the projection widths, so a
    column-sharded copy (fewer local heads) runs unchanged. `core` is the attention core
    softmax(QK^T/sqrt(d))V alone, the unit selective recomputation re-runs (Korthikanti et al. 2022
    section 5; autopar.trial.parallel.recompute)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.head_dim = d
        self.wq = nn.Linear(h, spec.num_attention_heads * d, bias=False)
        self.wk = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.wv = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.wo = nn.Linear(spec.num_attention_heads * d, h, bias=False)
        # context parallelism (autopar.trial.parallel.context.apply_cp): the cp process group, when
        # the sequence is split over ranks; attention then runs as a ring over it
        self.cp_group = None
        self.cp_load_balance = True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos[:s], sin[:s]), apply_rope(k, cos[:s], sin[:s])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d]: a ring over the cp
        group under context parallelism, else SDPA."""
        if self.cp_group is not None:
            return ring_attention(q, k, v, self.cp_group, self.cp_load_balance)
        rep = q.shape[1] // k.shape[1]
        if rep > 1:  # explicit repeat: the CPU flash kernel has no GQA path
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class FeedForward(nn.Module):
    """SwiGLU MLP (Shazeer 2020): w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GroupedExperts(nn.Module):
    """E SwiGLU experts as stacked weights [E, ...] (torchtitan `GroupedExperts`), run locally.
    Under expert parallelism a rank holds experts [offset, offset + E_local) of `total`; under expert
    tensor parallelism the FFN columns [ffn_offset, ffn_offset + ffn_local) of `ffn_total` (its
    output is then a partial sum over the shards)."""

    def __init__(self, num_experts: int, hidden: int, ffn: int, offset: int = 0, total: int | None = None,
                 ffn_offset: int = 0, ffn_total: int | None = None) -> None:
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
        outs = [(F.silu(part @ w1[e].t()) * (part @ w3[e].t())) @ w2[e].t()
                for e, part in enumerate(x.split(sizes)) if part.shape[0]]
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
    are global to the sequence: under context parallelism they are summed over the cp ranks
    (`stats_group`), so every parallel layout trains the same loss as one process.

    Expert parallelism (autopar.trial.parallel.expert.apply_ep) sets `ep_group` and/or `etp_group`;
    the routed copies then go to the experts' ranks by all-to-all (dispatch / combine), and are
    gathered over the expert-TP ranks that split each expert's FFN. `capacity_factor` (None =
    dropless) caps each expert at ceil(cf * copies / E) of this rank's copies, dropping the rest."""

    def __init__(self, spec: ModelSpec, routing: str = "topk", capacity_factor: float | None = None,
                 aux_loss_coeff: float = 0.0) -> None:
        super().__init__()
        m = spec.moe
        assert m is not None
        if routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {ROUTING_MODES}, got {routing!r}")
        self.top_k = m.top_k
        self.num_experts = m.num_experts
        self.routing, self.capacity_factor, self.aux_loss_coeff = routing, capacity_factor, aux_loss_coeff
        self.router = nn.Linear(spec.hidden_size, m.num_experts, bias=False)
        # DeepSeek-V3 aux-loss-free bias: steers the choice only, updated outside autograd
        self.expert_bias = nn.Parameter(torch.zeros(m.num_experts), requires_grad=False) if m.router_bias else None
        self.experts = GroupedExperts(m.num_experts, spec.hidden_size, m.expert_ffn_hidden_size)
        self.shared_expert = (FeedForward(spec.hidden_size, m.shared_expert_ffn_hidden_size)
                              if m.num_shared_experts else None)
        self.ep_group = None  # expert-parallel group (apply_ep)
        self.etp_group = None  # expert-tensor-parallel group: the experts' FFN split over it (apply_ep)
        self.stats_group = None  # ranks holding other tokens of the same sequences (cp), for aux stats
        self.aux_scale = 1.0  # gradient of the aux loss per microbatch (1/microbatches outside a pipeline)
        self.positions: torch.Tensor | None = None  # token positions (for balanced routing), set per forward
        self.last_counts: torch.Tensor | None = None  # routed copies per expert, last forward (no grad)
        self.rows_log: list | None = None  # EP: (rows sent, rows received) per forward, when a list

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
            top = choice.topk(k, dim=-1).indices
        weights = torch.softmax(logits.gather(-1, top), dim=-1)
        return top, weights, probs

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
        if self.stats_group is not None:
            import torch.distributed as dist
            import torch.distributed.nn.functional as dnn

            counts = counts.clone()
            dist.all_reduce(counts, group=self.stats_group)
            prob_sum = dnn.all_reduce(prob_sum, group=self.stats_group)
            n = n * dist.get_world_size(self.stats_group)
        f = counts / (n * k)
        p = prob_sum / n
        return self.aux_loss_coeff * e * (f * p).sum(-1).mean()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        b, seq = shape[0], shape[1]
        flat = x.reshape(-1, shape[-1])
        top, weights, probs = self.route(flat, seq)
        keep = self.keep_mask(top)
        if keep is not None:
            weights = weights * keep
        self.last_counts = torch.bincount(top[keep] if keep is not None else top.reshape(-1),
                                          minlength=self.num_experts).detach()
        weights = weights.type_as(x)
        if self.ep_group is not None or self.etp_group is not None:
            from autopar.trial.parallel.expert import expert_parallel_forward

            out = expert_parallel_forward(self, flat, top, weights, keep)
        else:  # every expert here: one grouped call (an FSDP unit runs one forward per microbatch)
            copy_sorted, expert_sorted = sort_copies(top, keep)
            sizes = torch.bincount(expert_sorted, minlength=self.num_experts).tolist()
            y_sorted = self.experts(flat[copy_sorted // self.top_k], sizes)
            y_copies = y_sorted.new_zeros(top.numel(), flat.shape[-1]).index_copy(0, copy_sorted, y_sorted)
            out = (y_copies.view(*top.shape, -1) * weights[..., None]).sum(1)
        if self.shared_expert is not None:  # on [b, s, h]: under TP its region gathers the sequence
            out = out + self.shared_expert(x).reshape(flat.shape)
        if self.aux_loss_coeff and self.training and torch.is_grad_enabled():
            out = AuxLossScaler.apply(out, self.aux_loss(top, probs, b, seq), self.aux_scale)
        return out.view(shape)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + ffn(norm(x))."""

    def __init__(self, spec: ModelSpec, moe_layer: bool, eps: float, config: "ModelConfig | None" = None) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden_size, eps)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.hidden_size, eps)
        self.feed_forward = None if moe_layer else FeedForward(spec.hidden_size, spec.ffn_hidden_size)
        self.moe = (MoE(spec, config.moe_routing, config.moe_capacity_factor, config.moe_aux_loss_coeff)
                    if config is not None else MoE(spec)) if moe_layer else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        mlp = self.feed_forward if self.feed_forward is not None else self.moe
        return x + mlp(self.ffn_norm(x))


class Transformer(nn.Module):
    """The decoder: tokens [b, s] -> logits [b, s, vocab_rows]. Parts set to None are skipped,
    so a pipeline stage is this module with the parts it does not hold removed."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        spec = config.spec
        self.config = config
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(config.vocab_rows, spec.hidden_size)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, spec.is_moe_layer(i), config.norm_eps, config)
                                     for i in range(spec.num_layers)})
        self.norm: RMSNorm | None = RMSNorm(spec.hidden_size, config.norm_eps)
        self.output: nn.Linear | None = nn.Linear(spec.hidden_size, config.vocab_rows, bias=False)
        self.tie_weights()
        cos, sin = rope_table(spec.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        #: token positions this rank holds when the sequence is split over cp ranks (None = all, in order)
        self.rope_positions: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
            dtype = _autocast_dtype(x)
            if dtype is not None:  # keep the residual stream in the compute dtype (Megatron bf16)
                x = x.to(dtype)
        cos, sin = self.rope_cos, self.rope_sin
        if self.rope_positions is not None:  # RoPE at this rank's real token positions (CP)
            pos = self.rope_positions.to(cos.device)
            cos, sin = cos[pos], sin[pos]
        for layer in self.layers.values():
            x = layer(x, cos, sin)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the spec ties them (again after `to_empty`,
        which replaces parameters one module at a time)."""
        if self.config.spec.tied_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def init_weights(self, seed: int) -> None:
        """Set every parameter to `initial_value` and recompute the RoPE buffers (after meta init)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(initial_value(self.config, name, tuple(p.shape), seed))
            self.reset_buffers()

    def reset_buffers(self) -> None:
        spec = self.config.spec
        cos, sin = rope_table(spec.head_dim, self.config.max_seq_len, self.config.rope_theta,
                              device=self.rope_cos.device)
        self.rope_cos, self.rope_sin = cos, sin


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


# ---- deterministic initialisation ----------------------------------------------------------------

def _generator(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % 2**63)


def initial_value(config: ModelConfig, name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The full fp32 CPU value of parameter `name` (a pure function of seed, name and shape).
    Norms start at 1 and the router bias at 0; matrices are N(0, 0.02), the output projections
    of each block (wo, w2) scaled by 1/sqrt(2 * layers) (GPT-2 / Megatron `scaled_init_method`).
    The padded vocabulary rows are drawn from their own stream, so the real rows do not depend on
    the padding."""
    leaf = name.rsplit(".", 1)[0].rsplit(".", 1)[-1] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith("expert_bias"):
        return torch.zeros(shape)
    std = INIT_STD
    if leaf in ("wo", "w2"):
        std = INIT_STD / math.sqrt(2.0 * config.spec.num_layers)
    if name in ("tok_embeddings.weight", "output.weight"):
        real, rows = config.spec.vocab_size, shape[0]
        out = torch.empty(shape)
        out[:real].normal_(0.0, std, generator=_generator(seed, name))
        if rows > real:
            out[real:].normal_(0.0, std, generator=_generator(seed, name + "#padding"))
        return out
    return torch.empty(shape).normal_(0.0, std, generator=_generator(seed, name))


def build_model(config: ModelConfig, seed: int, device: torch.device | str = "cpu") -> Transformer:
    """A plain, initialised model on `device` (the single-process reference, or a 1-GPU trial)."""
    with torch.device("meta"):
        model = Transformer(config)
    model.to_empty(device=device)
    model.tie_weights()
    model.init_weights(seed)
    return model
