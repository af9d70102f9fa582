"""One test per line of the capability table that can refuse a plan (a line with what to use
instead: the last section of docs/trainers.md lists them). Each line is broken, alone where the
table allows it, by a plan of one of 14 small spaces searched for every trainer (`SPACES`: a few
knobs each, over few choices, with torch.compile, hybrid sharding, selective-recompute and offload
modules, FP8 recipes, capacity dispatch, bf16 main gradients and a model with MoE biases among
them). The plan's trainer's exporter refuses it with that line's sentence, one line, as the search
rejects it.

A line that never breaks alone (another line of the same trainer always refuses such a plan
first: torchtitan's DeepEP-with-capacity line behind its dropless-only line) is checked where it
breaks with others: the exporter refuses with one of the broken lines' sentences; a line that
repeats a rule every trainer applies (DeepSpeed's optimizer offload only with ZeRO 1-3) is
checked where both break: the plan is refused as invalid, one line."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from autopar.errors import InputError
from autopar.export import ExportOptions, ExportRefused, get_exporter
from autopar.search.enumerate import enumerate_plans
from autopar.search.space import SearchSpace
from autopar.spec.presets import resolve_model
from autopar.spec.question import Question
from autopar.spec.resolve import resolve_cluster
from autopar.spec.rules import check_rules
from autopar.spec.table import DISPATCH
from autopar.spec.trainers import TRAINERS, get_trainer

CLUSTER = resolve_cluster("h100-sxm")
SEQ = 4096
COMMON = dict(mbs=[1], tp=[1, 2], pp=[1, 2], dtype=["bf16"], recompute=["none"])
MOE = "qwen3-30b-a3b"


def _capacity_and_bf16_grads(table):
    """What the knobs do not enumerate: every second row dispatches with capacity (factor 1.25, as
    the agreement test draws), every third keeps bf16 main gradients."""
    rows = np.arange(len(table))
    capacity = rows % 2 == 1
    table.columns["moe_dispatch"] = np.where(capacity, DISPATCH["capacity"], DISPATCH["dropless"])
    table.columns["capacity_factor"] = np.where(capacity, 1.25, 1.0)
    table.columns["main_grads_fp32"] = rows % 3 != 0
    return table


#: (model, GPUs, global batch, knobs, columns set after the walk): small spaces, each varying a few
#: knobs the others keep fixed; a model name with "+bias" has linear biases (its MoE experts too)
SPACES = (
    (
        "llama3-8b",
        16,
        64,
        COMMON
        | dict(
            vpp=[1, 2],
            pp_schedule=["gpipe", "1f1b", "zero-bubble"],
            zero=[0, 1, 2, 3],
            pp_layout=["auto", "embedding+loss"],
        ),
        None,
    ),
    ("llama3-8b", 16, 56, COMMON | dict(tp=[1], pp=[2], pp_schedule=["zero-bubble"]), None),  # 7 microbatches
    (
        "llama3-8b",
        16,
        64,
        COMMON | dict(cp=[1, 2], zero=[0, 1, 3], sp=[False, True], tp_comm_overlap=[False, True]),
        None,
    ),
    ("llama3-8b", 16, 64, COMMON | dict(compile=[False, True], tp_comm_overlap=[False, True], sp=[True]), None),
    (
        "llama3-8b",
        16,
        64,
        COMMON | dict(dtype=["bf16", "fp8", "fp32"], zero=[0, 1, 3], pp=[1]),
        _capacity_and_bf16_grads,
    ),
    (
        "llama3-8b",
        16,
        64,
        COMMON | dict(dtype=["fp8"], fp8_recipe=["default", "delayed", "tensorwise", "blockwise", "mxfp8", "rowwise"]),
        None,
    ),
    (
        "llama3-8b",
        16,
        64,
        COMMON | dict(dtype=["fp8"], fp8_param_gather=["default", "on", "off"], zero=[0, 1, 3]),
        None,
    ),
    ("llama3-8b", 16, 64, COMMON | dict(zero=[1, 2, 3], dp_shard=[2, 4, 8], pp=[1]), None),
    ("llama3-8b", 16, 64, COMMON | dict(zero=[0, 1, 3], optimizer_offload=[0.0, 0.5, 1.0]), None),
    (
        "llama3-8b",
        16,
        64,
        COMMON
        | dict(
            recompute=["none", "selective", "full"],
            recompute_layers=[0, 1],
            recompute_modules=["core_attn", "layernorm", "mlp"],
            vpp=[1, 2],
        ),
        None,
    ),
    (
        MOE,
        32,
        64,
        COMMON
        | dict(
            ep=[1, 8],
            etp=["tp", 1],
            zero=[1, 3],
            offload_modules=["none", "expert_fc1,moe_act"],
            moe_dispatcher=["alltoall", "deepep"],
        ),
        _capacity_and_bf16_grads,
    ),
    (MOE, 32, 64, COMMON | dict(ep=[8], pp=[2], vpp=[1, 2], ep_comm_overlap=[False, True]), None),
    (
        MOE,
        32,
        64,
        COMMON
        | dict(ep=[8], dtype=["fp8"], recompute=["selective"], recompute_modules=["core_attn", "moe_act", "layernorm"]),
        None,
    ),
    (f"{MOE}+bias", 32, 64, COMMON | dict(ep=[8], etp=["tp", 1], tp=[2]), None),
)


def _restricting_lines() -> list[tuple[str, str]]:
    return [(trainer, c.kind) for trainer in TRAINERS for c in get_trainer(trainer).capabilities.values() if c.instead]


@cache
def _space(i: int):
    name, gpus, gbs, knobs, columns = SPACES[i]
    model = resolve_model(name.removesuffix("+bias"))
    if name.endswith("+bias"):
        model = replace(model, linear_bias=True)
    q = Question(model=model, num_gpus=gpus, cluster=CLUSTER, seq_len=SEQ, global_batch_size=gbs, trainers=TRAINERS)
    table = enumerate_plans(SearchSpace(f"rules-{i}", "", knobs, {}), q)
    if columns is not None:
        table = columns(table)
    return model, table, check_rules(table, model, num_gpus=gpus, cluster=CLUSTER, seq_len=SEQ)


@cache
def _breaking(trainer: str, kind: str) -> tuple[int, int, str] | None:
    """(space, row, how) of the first plan of `trainer` that breaks the line: one broken by it
    alone where one exists ("alone"), else by it and other lines of the same trainer only
    ("with its trainer's lines"), else by it and a rule of the plan that every trainer applies
    ("with a plan rule": the line repeats that rule for this trainer)."""
    mask_name, t = f"trainer:{kind}", TRAINERS.index(trainer)
    found: dict[str, tuple[int, int, str]] = {}
    for i in range(len(SPACES)):
        _, table, rules = _space(i)
        if mask_name not in rules.masks:
            continue
        broken = rules.masks[mask_name] & (table.trainer == t)
        if not broken.any():
            continue
        others = np.zeros(len(table), int)
        foreign = np.zeros(len(table), bool)
        for name, mask in rules.masks.items():
            if name != mask_name:
                others += mask
                if not name.startswith("trainer:"):  # a plan or model rule, not a trainer's line
                    foreign |= mask
        for how, rows in (
            ("alone", broken & (others == 0)),
            ("with its trainer's lines", broken & ~foreign),
            ("with a plan rule", broken),
        ):
            if rows.any() and how not in found:
                found[how] = (i, int(np.flatnonzero(rows)[0]), how)
        if "alone" in found:
            break
    return next((found[h] for h in ("alone", "with its trainer's lines", "with a plan rule") if h in found), None)


@pytest.mark.parametrize(("trainer", "kind"), _restricting_lines())
def test_each_line_refuses_a_plan_that_breaks_it(trainer, kind):
    found = _breaking(trainer, kind)
    assert found is not None, f"no plan of the rule spaces breaks {trainer}:{kind}: extend SPACES"
    i, row, how = found
    model, table, rules = _space(i)
    plan = table.plan(row)
    sentences = dict(zip(rules.labels(row), rules.reasons(row)))
    assert f"{trainer}:{kind}" in sentences
    if how == "with a plan rule":  # refused as an invalid plan before any trainer's line is read
        with pytest.raises((InputError, ExportRefused)) as err:
            get_exporter(trainer).render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ))
        assert "\n" not in str(err.value) and str(err.value)
        return
    with pytest.raises(ExportRefused) as refused:
        get_exporter(trainer).render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ))
    assert "\n" not in str(refused.value) and refused.value.trainer == trainer
    if how == "alone":
        assert refused.value.reason == sentences[f"{trainer}:{kind}"], (plan, str(refused.value))
    else:
        assert refused.value.reason in sentences.values(), (plan, str(refused.value))
