"""torchtitan's op-level selective activation checkpointing priced in time
(autopar.cost.compute.op_sac_recompute): its policy saves the outputs of matmuls and the SDPA kernels
"except every second mm" (torchtitan distributed/activation_checkpoint.py `_custom_policy`,
models/llama3/infra/parallelize.py `_op_sac_save_list`), so the backward runs wk, wo and w3 again,
not the attention core, and every elementwise op again. Derived here by hand on a published
torchtitan run (Llama 3.1 8B, FSDP on 8 H100, local batch 2 x 8192, selective AC: row 79)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar.calibration.case_batch import case_cluster, prime_inputs
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs
from autopar.cost.kernels import gemm_rate
from autopar.spec.table import DTYPE


@pytest.fixture(scope="module")
def row79():
    case = next(c for c in build_cases(load_runs(None))[0] if c.row_id == "79")
    assert case.plan.recompute == "selective" and case.plan.trainer == "torchtitan"
    return case


def _raw(case, recompute: str):
    c = replace(case, inputs=None, plan=case.plan.with_(recompute=recompute))
    prime_inputs([c])
    return c.inputs.raw


def test_op_sac_runs_wk_wo_and_w3_again_and_not_the_attention_core(row79):
    sac, bare = _raw(row79, "selective"), _raw(row79, "none")
    cluster = case_cluster(row79)
    h, kv, ffn, layers = 4096.0, 1024.0, 14336.0, 32
    tokens = 2 * 8192  # one microbatch, tp 1
    bf16 = DTYPE["bf16"]

    def rate(dim):
        return float(gemm_rate(cluster, bf16, min(tokens, h, dim)))

    # by hand: per layer 2 h x 1024 (wk), 2 h x h (wo), 2 h x ffn (w3) forward FLOPs per token
    extra = tokens * layers * (2 * h * kv / rate(kv) + 2 * h * h / rate(h) + 2 * h * ffn / rate(ffn))
    assert float((sac.gemm_bf16 - bare.gemm_bf16)[0, 0]) == pytest.approx(extra, rel=1e-9)
    assert float((sac.recompute_flops - bare.recompute_flops)[0, 0]) == pytest.approx(
        tokens * layers * 2 * h * (kv + h + ffn), rel=1e-9
    )
    assert np.allclose(sac.attention, bare.attention)  # SDPA's output is saved


def test_op_sac_runs_every_elementwise_op_again(row79):
    # none of torchtitan's saved ops is elementwise: the memory-bound traffic counts one more
    # forward, as a full recompute's does
    sac, bare = _raw(row79, "selective"), _raw(row79, "none")
    assert np.allclose(sac.elementwise, 2.0 * bare.elementwise)
