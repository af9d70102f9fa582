"""The README's worked example is the run's answer: its command run again gives the same layouts in the
same order, for the top plans and each trainer's best, with step times within the goldens' tolerance
(a refit of the profiles moves figures by hundredths of a percent; a change of the answer more)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a figure of the example against the run: as the goldens compare them (tests/golden), looser for
#: the three digits the table prints
RTOL = 5e-3


def _example() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Worked example")
    return text[start : text.index("```\n\n", text.index("```\n", start) + 4)]


def test_the_readme_example_is_the_runs_answer(tmp_path):
    from tests.cli.conftest import _run_in_process

    example = _example()
    assert "`autopar search --model 70b --gpus 256 --top-k 3`" in example
    r = _run_in_process("search", "--model", "70b", "--gpus", "256", "--top-k", "3", "--json", "--run-dir", tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    top = out["top"]
    rows = re.findall(r"^ (\d)  (\S+)(?: \+[a-z]+)*(?: \+\d+)?\s.*?\s[\d.]+/[\d.]+\s+([\d.]+)", example, re.M)
    assert [int(n) for n, _, _ in rows] == [1, 2, 3]
    for (_, layout, step), plan in zip(rows, top):
        assert plan["plan_name"] == layout
        assert float(step) == pytest.approx(plan["step_time_s"], rel=RTOL)
    best = out["per_trainer"]
    titles = {"Megatron-LM": "megatron", "torchtitan": "torchtitan", "DeepSpeed": "deepspeed"}
    per = re.findall(r"^ (Megatron-LM|torchtitan|DeepSpeed)\s+(\S+)\s+.*?\s([\d.]+)\s+[\d.]+-[\d.]+", example, re.M)
    assert len(per) == 3
    for title, layout, step in per:
        b = best[titles[title]]
        assert b["plan_name"] == layout, title
        assert float(step) == pytest.approx(b["step_time_s"], rel=RTOL), title
