"""A calibration row against physical ranges (autopar.calibration.run_checks): every bundled row passes; a
row no real run can have is refused with a reason naming the field and the value, which
build_cases lists as the reason to skip the row while the others are evaluated."""

from __future__ import annotations

import pytest

from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_checks import row_problem
from autopar.calibration.run_rows import bundled_runs

#: a dense Megatron row of the bundled table, the way a user would copy it: 1.7B GPT on 48 H100
#: (tp1 pp1 dp48, gbs 192, 408.8 TFLOP/s)
ROW = next(r for r in bundled_runs() if r["row_id"] == "1")


def test_every_bundled_row_is_in_range() -> None:
    assert [r["row_id"] for r in bundled_runs() if row_problem(r)] == []


@pytest.mark.parametrize(
    "field, value, words",
    [
        # the tracebacks: an overflow and zero divisors
        ("num_gpus", "1e400", ["num_gpus", "inf"]),
        ("num_gpus", "0", ["num_gpus 0", "from 1"]),
        ("tp", "0", ["tp 0"]),
        ("pp", "0", ["pp 0"]),
        ("num_attention_heads", "0", ["num_attention_heads 0"]),
        ("micro_batch_size", "0", ["micro_batch_size 0"]),
        ("seq_len", "1e400", ["seq_len"]),
        ("hidden_size", "1e400", ["hidden_size"]),
        # impossible measures
        ("tflops_per_gpu", "-5", ["TFLOP/s", "-5", "above 0"]),
        ("tflops_per_gpu", "nan", ["tflops_per_gpu", "'nan'", "not a number"]),
        ("mfu", "500%", ["MFU", "500", "at most 100"]),
        ("tp", "2.5", ["tp 2.5", "whole number"]),
        ("tp", "1.2.3", ["tp", "'1.2.3'", "not a number"]),
        ("row_id", "1e400", ["row_id", "finite"]),
        ("num_gpus", "", ["num_gpus not stated"]),
        # layout products: 48 GPUs, tp1 pp1 -> dp 48
        ("dp", "47", ["tp*pp*cp*dp = 47", "num_gpus 48"]),
        ("tp", "5", ["tp*pp*cp = 5", "does not divide num_gpus 48"]),
        ("ep", "96", ["ep 96", "more than num_gpus 48"]),
        ("dp_derived", "65536", ["dp_derived 65536", "num_gpus 48"]),
        ("num_attention_heads", "4096", ["num_attention_heads 4,096", "hidden_size 2,048"]),
    ],
)
def test_a_row_out_of_range_names_the_field(field: str, value: str, words: list[str]) -> None:
    why = row_problem(dict(ROW, **{field: value}))
    assert why is not None
    for w in words:
        assert w.lower() in why.lower(), why


@pytest.mark.parametrize(
    "field, value", [("tokens_per_sec_per_gpu", "-5"), ("step_time_s", "-1"), ("tokens_per_sec_per_gpu", "0")]
)
def test_negative_or_zero_throughput_is_refused(field: str, value: str) -> None:
    assert row_problem(dict(ROW, **{field: value})) is not None


def test_a_bad_row_is_skipped_and_the_others_are_evaluated() -> None:
    """Five rows, the first with tp = 0: it is skipped with its reason, rows 2-5 are cases."""
    rows = [r for r in bundled_runs() if r["row_id"] in ("1", "2", "3", "4", "5")]
    cases, skipped = build_cases([dict(rows[0], tp="0")] + rows[1:])
    assert sorted(c.row_id for c in cases) == ["2", "3", "4", "5"]
    assert [(rid, why[:4]) for rid, _, why in skipped] == [("1", "tp 0")]
