"""Two mechanisms of a dense layer, derived here by hand from the trainers' code.

1. Each GEMM class of a layer runs at the fall-off of its own smallest per-GPU dimension
   (autopar.cost.compute.dense_gemm_shapes): under TP, Megatron's column-parallel QKV is
   tokens x h -> (q + k + v) / tp, the row-parallel output projection tokens x attn_out / tp -> h,
   the MLP tokens x h -> ffn / tp and back; only the output projection pays the heads' slice.
2. Megatron-Core saves only its sequence shard of each column-parallel input under sequence
   parallelism and all-gathers it again in the backward for the weight gradient
   (LinearWithGradAccumulationAndAsyncCommunication.backward, megatron/core/tensor_parallel/layers.py):
   per dense layer pass 4 collectives forward (AG, RS per sync point) and 6 backward (AG of the
   row-parallel output gradient, RS of the column-parallel input gradient, and the re-gather), 10
   in all where DTensor's sequence parallelism (which saves the gathered input) issues 8.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from autopar.cost.comm import tp_calls
from autopar.cost.compute import layer_gemm_seconds_per_flop
from autopar.cost.kernels import gemm_rate
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.table import DTYPE

H100 = default_cluster("h100-sxm")


def _one_dense_layer(tokens: float, tp: int) -> SimpleNamespace:
    """The plan arrays the GEMM shapes read: one dense layer, `tokens` per microbatch, TP `tp`."""
    one = np.array([1.0])
    return SimpleNamespace(tokens=tokens * one, tp_float=tp * one, dense_layers=one, moe_layers=0 * one)


def test_each_gemm_class_pays_its_own_shape_llama3_70b_tp8() -> None:
    m = get_preset("llama3-70b")
    h, tp, tokens = 8192, 8, 8192.0
    assert (m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size) == (8192, 64, 8, 28672)
    # by hand: q = 64 x 128 = 8192, k = v = 8 x 128 = 1024; per token forward FLOPs 2 x weights
    qkv_flops, qkv_dim = 2 * h * (8192 + 1024 + 1024), (8192 + 2048) / tp  # 1280
    proj_flops, proj_dim = 2 * 8192 * h, 8192 / tp  # 1024
    mlp_flops, mlp_dim = 2 * h * 28672 * 3, 28672 / tp  # 3584 (SwiGLU: three h x ffn GEMMs)
    bf16 = np.array([DTYPE["bf16"]])

    def rate(d):
        return gemm_rate(H100, bf16, np.array([d]))[0]

    want = qkv_flops / rate(qkv_dim) + proj_flops / rate(proj_dim) + mlp_flops / rate(mlp_dim)
    got = layer_gemm_seconds_per_flop(_one_dense_layer(tokens, tp), m, H100, bf16)[0]
    assert got == pytest.approx(want, rel=1e-12)
    # every GEMM at the output projection's 1024 (the smallest of the layer) would be slower
    assert got < (qkv_flops + proj_flops + mlp_flops) / rate(proj_dim)


def test_a_few_tokens_bound_every_class_alike() -> None:
    # 256 tokens per microbatch at TP 1: the tokens are every GEMM's smallest dimension
    m = get_preset("llama3-70b")
    bf16 = np.array([DTYPE["bf16"]])
    flops = 2.0 * m.attention_weight_params + 2 * 8192 * 28672 * 3
    got = layer_gemm_seconds_per_flop(_one_dense_layer(256.0, 1), m, H100, bf16)[0]
    assert got == pytest.approx(flops / gemm_rate(H100, bf16, np.array([256.0]))[0], rel=1e-12)


def _collectives(regather: float) -> dict[str, float]:
    m = get_preset("llama3-70b")
    zero = np.array(0.0)
    calls = tp_calls(
        m, np.array(4096.0), np.array(True), np.array(1.0), zero, zero, zero, zero, np.array(8), 2.0, regather
    )
    out: dict[str, float] = {}
    for c in calls:
        if float(np.sum(c.count)) > 0:
            assert float(c.full_bytes) == 4096 * 8192 * 2  # every one moves the s x h bf16 activations
            out[c.kind] = out.get(c.kind, 0.0) + float(c.count)
    return out


def test_megatron_issues_ten_tp_collectives_per_dense_layer_under_sp() -> None:
    # two sync points (attention, MLP): forward AG + RS each, backward AG + RS each, + 2 re-gathers
    assert _collectives(1.0) == {"all_gather": 6.0, "reduce_scatter": 4.0}


def test_dtensor_sequence_parallelism_issues_eight() -> None:
    assert _collectives(0.0) == {"all_gather": 4.0, "reduce_scatter": 4.0}
