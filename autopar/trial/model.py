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

INIT_STD = 0.02  # GPT-2 / Megatron `init_method_std`


@dataclass(frozen=True)
class ModelConfig:
    """What the built-in model needs beyond the spec: padded vocabulary and RoPE table length."""

    spec: ModelSpec
    vocab_rows: int  # padded vocabulary (>= spec.vocab_size)
    max_seq_len: int  # RoPE table length: the full sequence, never a local (SP/PP) slice
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        problems = unsupported(self.spec)
        if self.vocab_rows < self.spec.vocab_size:
            problems.append(f"vocab_rows {self.vocab_rows} < vocab size {self.spec.vocab_size}")
        if problems:
            raise ValueError(f"model '{self.spec.name}' cannot be built: " + "; ".join(problems))


def unsupported(spec: ModelSpec) -> list[str]:
    """Spec features the built-in Llama-style model does not implement, as sentences."""
    out = []
    if spec.mla is not None:
        out.append("multi-head latent attention (MLA) is not implemented")
    if not spec.gated_mlp:
        out.append("only the gated (SwiGLU) MLP is implemented")
    if spec.norm != "rmsnorm":
        out.append("only RMSNorm is implemented")
    if spec.qk_norm or spec.qkv_bias or spec.linear_bias:
        out.append("QK-norm and linear biases are not implemented")
    if spec.learned_position_embeddings:
        out.append("learned position embeddings are not implemented (the model uses RoPE)")
    if spec.head_dim % 2:
        out.append(f"RoPE needs an even head_dim, got {spec.head_dim}")
    if spec.moe is not None and spec.moe.num_shared_experts and not spec.moe.shared_expert_ffn_hidden_size:
        out.append("shared experts need shared_expert_ffn_hidden_size")
    return out


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
    column-sharded copy (fewer local heads) runs unchanged."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.head_dim = d
        self.wq = nn.Linear(h, spec.num_attention_heads * d, bias=False)
        self.wk = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.wv = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.wo = nn.Linear(spec.num_attention_heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos[:s], sin[:s]), apply_rope(k, cos[:s], sin[:s])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        rep = q.shape[1] // k.shape[1]
        if rep > 1:  # explicit repeat: the CPU flash kernel has no GQA path
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


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
    """E SwiGLU experts as stacked weights [E, ...] (torchtitan `GroupedExperts`), run locally."""

    def __init__(self, num_experts: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(num_experts, ffn, hidden))

    def forward(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        return (F.silu(x @ self.w1[expert].t()) * (x @ self.w3[expert].t())) @ self.w2[expert].t()


class MoE(nn.Module):
    """Top-k routed experts + optional shared expert (Mixtral / DeepSeek-MoE). All experts are
    computed on this process; expert parallelism will move the dispatch into an all-to-all. No
    load-balancing loss (it does not change the parallel structure)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        m = spec.moe
        assert m is not None
        self.top_k = m.top_k
        self.router = nn.Linear(spec.hidden_size, m.num_experts, bias=False)
        # DeepSeek-V3 aux-loss-free bias: steers the choice only, updated outside autograd
        self.expert_bias = nn.Parameter(torch.zeros(m.num_experts), requires_grad=False) if m.router_bias else None
        self.experts = GroupedExperts(m.num_experts, spec.hidden_size, m.expert_ffn_hidden_size)
        self.shared_expert = (FeedForward(spec.hidden_size, m.shared_expert_ffn_hidden_size)
                              if m.num_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = self.router(flat).float()
        choice = logits + self.expert_bias if self.expert_bias is not None else logits
        top = choice.topk(self.top_k, dim=-1).indices
        weights = torch.softmax(logits.gather(-1, top), dim=-1).type_as(x)
        out = torch.zeros_like(flat)
        for e in range(self.experts.w1.shape[0]):
            token, slot = (top == e).nonzero(as_tuple=True)
            if token.numel():
                y = self.experts(flat[token], e) * weights[token, slot, None]
                out = out.index_add(0, token, y)
        if self.shared_expert is not None:
            out = out + self.shared_expert(flat)
        return out.view(shape)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + ffn(norm(x))."""

    def __init__(self, spec: ModelSpec, moe_layer: bool, eps: float) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden_size, eps)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.hidden_size, eps)
        self.feed_forward = None if moe_layer else FeedForward(spec.hidden_size, spec.ffn_hidden_size)
        self.moe = MoE(spec) if moe_layer else None

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
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, spec.is_moe_layer(i), config.norm_eps)
                                     for i in range(spec.num_layers)})
        self.norm: RMSNorm | None = RMSNorm(spec.hidden_size, config.norm_eps)
        self.output: nn.Linear | None = nn.Linear(spec.hidden_size, config.vocab_rows, bias=False)
        self.tie_weights()
        cos, sin = rope_table(spec.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
            dtype = _autocast_dtype(x)
            if dtype is not None:  # keep the residual stream in the compute dtype (Megatron bf16)
                x = x.to(dtype)
        for layer in self.layers.values():
            x = layer(x, self.rope_cos, self.rope_sin)
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
