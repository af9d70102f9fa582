"""The shipped MoE space searches FSDP2 with expert parallelism, torchtitan's way of running MoE:
torchtitan carves EP out of its FSDP group (torchtitan/distributed/parallel_dims.py), so its
capability table refuses EP at ZeRO 1 (`ep_in_fsdp`), and a space fixed at ZeRO 1 would leave
torchtitan with nothing for every MoE model."""

from __future__ import annotations

from autopar.search.options import SearchOptions
from autopar.search.results import row_plan
from autopar.search.run import run_search
from autopar.spec.rules import plan_problems


def test_the_moe_space_holds_zero_3(sh):
    _, space = sh.question("qwen3-30b-a3b", 64, "moe")
    assert 3 in space.knobs["zero"] and 1 in space.knobs["zero"]


def test_torchtitan_gets_an_fsdp2_ep_plan_for_qwen3_30b_on_64_gpus(sh, tmp_path):
    q, space = sh.question("qwen3-30b-a3b", 64, "moe")
    r = run_search(q, SearchOptions(space=space, run_dir=tmp_path / "run", top_k=3))
    best = r.per_trainer["torchtitan"]
    assert best is not None
    plan = row_plan(best, r.layouts)
    assert plan.zero_stage == 3 and plan.ep > 1, plan.describe()
    # the same plan at ZeRO 1 is one torchtitan refuses, with its table's line
    problems = plan_problems(plan.with_(zero_stage=1, trainer="torchtitan"), q.model, num_gpus=64)
    assert any("parallel_dims.py" in p for p in problems), problems
