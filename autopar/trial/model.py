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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from autopar.measured.features import model_problems
from autopar.spec.model import ModelSpec
from autopar.trial.layers import FeedForward
from autopar.trial.moe import MoE

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
    (autopar.measured.features.model_problems, which needs no torch)."""
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
        """Causal attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d] through SDPA (context
        parallelism swaps in a ring over the sequence's ranks: autopar.trial.parallel.context)."""
        rep = q.shape[1] // k.shape[1]
        if rep > 1:  # explicit repeat: the CPU flash kernel has no GQA path
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + ffn(norm(x))."""

    def __init__(self, spec: ModelSpec, moe_layer: bool, eps: float, config: "ModelConfig | None" = None) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden_size, eps)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.hidden_size, eps)
        self.feed_forward = None if moe_layer else FeedForward(spec.hidden_size, spec.ffn_hidden_size)
        self.moe = (
            (
                MoE(spec, config.moe_routing, config.moe_capacity_factor, config.moe_aux_loss_coeff)
                if config is not None
                else MoE(spec)
            )
            if moe_layer
            else None
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        mlp = self.feed_forward if self.feed_forward is not None else self.moe
        assert mlp is not None  # a block has a dense FFN or an MoE
        return x + mlp(self.ffn_norm(x))


class Transformer(nn.Module):
    """The decoder: tokens [b, s] -> logits [b, s, vocab_rows]. Parts set to None are skipped,
    so a pipeline stage is this module with the parts it does not hold removed."""

    rope_cos: torch.Tensor  # buffers (register_buffer), declared for the type checker
    rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        spec = config.spec
        self.config = config
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(config.vocab_rows, spec.hidden_size)
        self.layers = nn.ModuleDict(
            {
                str(i): TransformerBlock(spec, spec.is_moe_layer(i), config.norm_eps, config)
                for i in range(spec.num_layers)
            }
        )
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

    def blocks(self) -> Iterable[tuple[str, TransformerBlock]]:
        """`layers.items()`, typed: (global layer index as a string, its block)."""
        return cast("Iterable[tuple[str, TransformerBlock]]", self.layers.items())

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
        cos, sin = rope_table(
            spec.head_dim, self.config.max_seq_len, self.config.rope_theta, device=self.rope_cos.device
        )
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
