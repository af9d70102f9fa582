"""The recompute_modules knob of a search space (Megatron-Core's selective recompute modules):
lists of module names, offered with selective recompute only and only where the model has every part
a list needs; a bad choice is one line naming it."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.errors import InputError
from autopar.search.enumerate import enumerate_plans
from autopar.search.space import space_from_dict
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.recompute_modules import modules_mask
from autopar.spec.table import RECOMP

H100 = default_cluster("h100-sxm")
KNOBS = {
    "tp": [1],
    "pp": [1],
    "cp": [1],
    "zero": [1],
    "mbs": [1],
    "recompute": ["none", "selective", "full"],
    "recompute_modules": ["core_attn", "moe_act,layernorm", "mla_up_proj,layernorm"],
    "pp_layout": ["auto"],
}


def _table(model_name: str, gpus: int):
    m = get_preset(model_name)
    q = Question(model=m, num_gpus=gpus, cluster=H100, seq_len=4096, global_batch_size=gpus, trainers=("megatron",))
    return enumerate_plans(space_from_dict({"knobs": KNOBS}, "hand"), q)


@pytest.mark.parametrize(
    "model,gpus,offered",
    [
        # a dense model: both lists need MoE or MLA, so plain selective only (3 recompute choices)
        ("llama3-8b", 8, {0}),
        # Qwen3 (MoE, no MLA): the default and moe_act,layernorm
        ("qwen3-30b-a3b", 8, {0, modules_mask(("layernorm", "moe_act"))}),
        # DeepSeek-V3 (MoE with MLA): all three
        ("deepseek-v3", 64, {0, modules_mask(("layernorm", "moe_act")), modules_mask(("layernorm", "mla_up_proj"))}),
    ],
)
def test_lists_are_offered_with_selective_recompute_where_the_model_has_their_parts(model, gpus, offered) -> None:
    t = _table(model, gpus)
    listed = np.asarray(t.recompute_modules)
    assert set(listed.tolist()) == offered
    assert np.all(np.asarray(t.recompute)[listed > 0] == RECOMP["selective"])
    # per layout: none, full, and one selective plan per list offered
    layouts = len({(int(a), int(b)) for a, b in zip(t.ep, t.etp)})
    assert len(t) == layouts * (2 + len(offered))


@pytest.mark.parametrize("choice", ["attn", "", 3])
def test_a_bad_choice_is_one_line_naming_it(choice) -> None:
    with pytest.raises(InputError, match="recompute_modules") as err:
        space_from_dict({"knobs": {"recompute_modules": [choice]}}, "mine.yaml")
    assert "\n" not in str(err.value)
