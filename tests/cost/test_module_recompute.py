"""Megatron-Core's --recompute-modules priced in time (autopar.cost.compute.module_recompute): each
listed module of GEMMs runs its forward once more in the backward, derived here by hand from the
published runs' own layouts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar.calibration.case_batch import prime_inputs
from autopar.calibration.row_cells import row_recompute_modules
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs
from autopar.cost.price import prepare
from autopar.spec.table import PlanTable


@pytest.fixture(scope="module")
def cases():
    return {c.row_id: c for c in build_cases(load_runs(None))[0]}


def _with_and_without(case):
    """The case's step inputs priced with its modules and with none."""
    listed = replace(case, inputs=None)
    bare = replace(case, inputs=None, plan=case.plan.with_(recompute="none", recompute_modules=None))
    prime_inputs([listed])
    prime_inputs([bare])
    return listed.inputs, bare.inputs


def test_the_rows_modules_are_read_from_their_recompute_cells(cases):
    # the plan holds them (ParallelPlan.recompute_modules): selective recompute of those modules only
    assert cases["282"].plan.selective_modules == ("layernorm", "moe")
    assert cases["290"].plan.selective_modules == ("mlp", "mla_up_proj")
    assert cases["277"].plan.selective_modules == row_recompute_modules("selective: norm, act")
    assert cases["277"].plan.recompute == "selective"
    assert cases["1"].plan.recompute_modules is None  # recompute not stated


def test_a_recomputed_moe_layer_runs_its_experts_and_all_to_alls_once_more(cases):
    # Qwen3-235B-A22B, TP4 PP8 VPP4 EP8, "layernorm, moe": nothing else recomputed (share 0), so the
    # expert GEMMs run 3 + 1 forward-equivalents instead of 3 (Megatron's backward = 2 x forward),
    # half a layer pass more per MoE layer, and the dispatch and combine all-to-alls (one of each
    # forward, one of each backward) 3 times instead of 2, the count exchange 2 times instead of 1
    listed, bare = _with_and_without(cases["282"])
    assert np.allclose(listed.raw.expert_bf16, bare.raw.expert_bf16 * 4 / 3)
    assert np.allclose(listed.raw.gemm_bf16, bare.raw.gemm_bf16)  # attention GEMMs untouched
    assert np.allclose(listed.raw.attention, bare.raw.attention)
    layers = 94 / 8  # layers per pipeline rank, on average
    extra_passes = (listed.raw.moe_layer_passes - bare.raw.moe_layer_passes)[:, 0]
    assert extra_passes.mean() == pytest.approx(0.5 * layers, rel=0.05)
    ratio = listed.ep / bare.ep
    assert np.all((ratio > 1.5 - 1e-9) & (ratio < 2.0))  # the small count exchange doubles


def test_recomputed_dense_mlps_and_mla_up_projections_add_their_forward_flops(cases):
    # DeepSeek-V3, PP8 VPP4 EP32 on GB200 (row 290): "mlp (dense layers) + mla up_proj"; the first
    # three layers are dense (ffn 18432), every layer has MLA up-projections q 1536 x 128 x 192 and
    # kv 512 x 128 x (128 + 128); forward FLOPs 2 per weight per token, TP 1
    case = cases["290"]
    listed, bare = _with_and_without(case)
    extra = (listed.raw.recompute_flops - bare.raw.recompute_flops)[:, 0]
    tokens = case.plan.micro_batch_size * case.seq_len
    dense_mlp = 2 * 7168 * 18432 * 3
    up = 2 * (1536 * 128 * 192 + 512 * 128 * 256)
    # the layers of each priced pipeline rank (its virtual stages together)
    p = prepare(
        PlanTable.from_plans([case.plan]),
        case.model,
        case.cluster,
        num_gpus=case.plan.num_gpus,
        seq_len=case.seq_len,
        trainer_capabilities=False,
        time_ranks=True,
    )
    x = p.timed[0]
    dense, layers = x.dense_layers[:, 0], x.layers[:, 0]
    assert dense.sum() >= 1 and np.all(dense <= 3)  # the three dense layers, on the ranks priced
    assert np.allclose(extra, tokens * (dense * dense_mlp + layers * up), rtol=1e-9)
    # the experts are not recomputed: only dense GEMMs grow
    assert np.allclose(listed.raw.expert_fp8, bare.raw.expert_fp8)
    assert np.all(listed.raw.gemm_fp8 >= bare.raw.gemm_fp8)
    assert np.allclose(listed.ep, bare.ep)
