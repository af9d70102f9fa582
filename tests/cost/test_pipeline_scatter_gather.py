"""Megatron-LM 2021-22's scatter/gather of pipeline sends (Narayanan et al. SC21 sec. 4.1): without
sequence parallelism each of a stage's tp ranks sends 1/tp of the boundary tensor across nodes and
the receiving stage all-gathers the pieces over NVLink; megatron-core sends the whole tensor from
every TP rank. Figures derived here by hand for GPT-3 175B (h 12288) at one microbatch of 2048
tokens, TP 8, PP 8, fp16."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs
from autopar.cost.comm import pp_calls, pp_gather_calls
from autopar.spec.model import ModelSpec

GPT3 = ModelSpec(
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    num_kv_heads=96,
    ffn_hidden_size=49152,
    vocab_size=51200,
    head_dim=128,
    seq_len=2048,
)
WHOLE = 2048 * 12288 * 2  # bytes of one boundary tensor: tokens x h x 2


def _calls(sp: bool, scatter: float, rank: int = 3):
    args = (GPT3, np.array(2048.0), np.array(8), np.array(sp), np.array(8), np.array(1), np.array(rank), 2.0, scatter)
    return pp_calls(*args), pp_gather_calls(*args)


def test_megatron_core_sends_the_whole_tensor_without_sp() -> None:
    (send,), (gather,) = _calls(sp=False, scatter=0.0)
    assert float(send.full_bytes) == WHOLE
    assert float(send.count) == 2  # a middle stage: one activation forward, one gradient backward
    assert float(gather.count) == 0


def test_megatron_2021_sends_an_eighth_and_gathers_it_over_tp() -> None:
    (send,), (gather,) = _calls(sp=False, scatter=1.0)
    assert float(send.full_bytes) == WHOLE / 8
    assert float(send.count) == 2
    assert gather.kind == "all_gather"
    assert float(gather.full_bytes) == WHOLE and float(gather.count) == 2


def test_sequence_parallel_sends_its_shard_either_way() -> None:
    for scatter in (0.0, 1.0):
        (send,), (gather,) = _calls(sp=True, scatter=scatter)
        assert float(send.full_bytes) == WHOLE / 8
        assert float(gather.count) == 0


def test_first_and_last_stage_send_one_way() -> None:
    (first,), _ = _calls(sp=False, scatter=1.0, rank=0)
    (last,), _ = _calls(sp=False, scatter=1.0, rank=7)
    assert float(first.count) == float(last.count) == 1


@pytest.fixture(scope="module")
def old_megatron_cases():
    cases, _ = build_cases(load_runs(None))
    return [c for c in cases if c.source in ("megatron-readme-2021", "korthikanti-2022")]


def test_runs_of_2021_22_megatron_scatter_and_predate_sequence_parallelism(old_megatron_cases) -> None:
    assert old_megatron_cases
    for c in old_megatron_cases:
        assert c.kernel_overrides.get("pp_scatter_gather") == 1.0, c.row_id
        if c.source == "megatron-readme-2021" and c.plan.tp > 1:
            # April 2021: a year before sequence parallelism was published (arXiv 2205.05198)
            assert not c.plan.sequence_parallel, c.row_id
