"""NVIDIA's published recipes lie inside the space `autopar search` chooses for their model: for
every preset the capability table gives a Megatron-Bridge recipe, that recipe's layout and flags
(tp, pp, vpp, cp, ep, expert-TP, micro-batch, SP, TP overlap, recompute), as its source sets them
(autopar/export/data/bridge_recipes.json, read from megatron-bridge 0.3.1 by
scripts/bridge_recipe_values.py), are choices of the chosen space and a valid Bridge plan."""

from __future__ import annotations

import pytest

from autopar.export.bridge import BRIDGE_RECIPES
from autopar.export.recipe_values import recipe_values
from autopar.search.enumerate import knob_choices
from autopar.search.space import chosen_space
from autopar.spec.hardware import default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.rules import plan_problems
from autopar.spec.table import RECOMP, SCHED

#: data-parallel size that makes each recipe a whole plan (the recipes fix no GPU count): the
#: smallest where the MoE recipes' EP fits in dp x cp x tp (expert-TP 1) and the batch divides
DP = {"deepseek-v3": 32, "qwen3-235b-a22b": 1, "qwen3-30b-a3b": 1}


def _recipe_plan(preset: str) -> tuple[ParallelPlan, int, dict]:
    v = recipe_values("bridge", BRIDGE_RECIPES[preset])
    tp, pp, cp = (
        v["model.tensor_model_parallel_size"],
        v["model.pipeline_model_parallel_size"],
        v["model.context_parallel_size"],
    )
    vpp = v["model.virtual_pipeline_model_parallel_size"] or 1
    ep = v.get("model.expert_model_parallel_size", 1)
    etp = v.get("model.expert_tensor_parallel_size", tp)
    dp = DP.get(preset, 2)
    granularity = v["model.recompute_granularity"]
    plan = ParallelPlan(
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        dp=dp,
        ep=ep,
        etp=etp,
        sequence_parallel=bool(v["model.sequence_parallel"]),
        micro_batch_size=v["train.micro_batch_size"],
        global_batch_size=v["train.global_batch_size"],
        recompute=granularity or "none",
        tp_comm_overlap=bool(v.get("model.tp_comm_overlap")) and tp > 1,
        pp_schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
        trainer="bridge",
    )
    return plan, tp * pp * cp * dp, v


@pytest.mark.parametrize("preset", sorted(BRIDGE_RECIPES))
def test_each_bridge_recipe_is_a_plan_of_the_chosen_space(preset):
    model = get_preset(preset)
    plan, gpus, v = _recipe_plan(preset)
    seq = v.get("model.seq_length") or model.seq_len
    space = chosen_space(model.moe is not None, seq)
    q = Question(
        model=model,
        num_gpus=gpus,
        cluster=default_cluster("h100-sxm"),
        seq_len=seq,
        global_batch_size=plan.global_batch_size,
    )
    c = knob_choices(space, q)
    assert plan.tp in c["tp"] and plan.pp in c["pp"] and plan.cp in c["cp"], (space.name, plan.describe())
    assert (SCHED[plan.pp_schedule], plan.vpp) in c["sched_vpp"], (space.name, plan.vpp)
    assert plan.ep in c["ep"], (space.name, plan.ep)
    assert (0 if plan.etp == plan.tp else plan.etp) in c["etp"] or plan.etp == plan.tp
    assert plan.sequence_parallel in c["sp"]
    assert plan.micro_batch_size in c["mbs"], (space.name, plan.micro_batch_size)
    assert plan.tp_comm_overlap in c["tp_comm_overlap"]
    assert RECOMP[plan.recompute] in c["recompute"]
    assert plan_problems(plan, model, num_gpus=gpus, seq_len=seq) == []
