"""The search and the exporters agree, because both read the trainers' capability table.

For every production trainer T: enumerate a broad space (every schedule, vpp, cp, ZeRO 0-3, every
recompute mode with partial recompute, bf16/fp8/fp32 with every FP8 recipe, TP overlap, SP on and off, uneven layouts,
no, half or all of the optimizer offloaded;
dense and MoE models, one with MLA and one with QK-norm, MoE plans with dropless and capacity
dispatch) for all trainers at once, as `autopar search` does, check its rules, and on a seeded
sample of a few hundred of T's plans:
- every plan valid for T renders with T's exporter and parses back to the plan;
- every plan whose only broken rules are T's capability lines is refused by T's exporter with
  exactly one of those lines' sentences (ExportRefused, one line);
and the search's estimate calls valid exactly the plans that break no rule.
"""

from __future__ import annotations

import zlib
from functools import cache

import numpy as np
import pytest

from autopar.calibration.estimate import estimate_table
from autopar.export import ExportOptions, ExportRefused, get_exporter, plan_view
from autopar.search.enumerate import enumerate_plans
from autopar.search.space import SearchSpace
from autopar.spec.fp8_recipes import PARAM_GATHER, RECIPE_CHOICES
from autopar.spec.presets import resolve_model
from autopar.spec.question import Question
from autopar.spec.resolve import resolve_cluster
from autopar.spec.rules import check_rules
from autopar.spec.table import DISPATCH, DISPATCHER, DTYPE, PlanTable
from autopar.spec.trainers import TRAINERS

CLUSTER = resolve_cluster("h100-sxm")
SEQ = 4096
PER_CLASS = 40  # sampled plans per (trainer, model, class): valid / refused by T's capability lines only

KNOBS = dict(
    tp=[1, 2],
    pp=[1, 2, 4],
    vpp=[1, 2],
    cp=[1, 2],
    zero=[0, 1, 2, 3],
    sp=[False, True],
    mbs=[1],
    pp_schedule=["gpipe", "1f1b", "zero-bubble"],
    recompute=["none", "selective", "full"],
    recompute_layers=[0, 1, 2],
    dtype=["bf16", "fp8", "fp32"],
    tp_comm_overlap=[False, True],
    pp_layout=["auto", "embedding+loss"],
    optimizer_offload=[0.0, 0.5, 1.0],
)
MOE_KNOBS = dict(ep=[1, 8], etp=["tp", 1], offload_modules=["none", "expert_fc1,moe_act"])
#: model -> GPUs. llama3-8b: dense GQA; qwen3-30b-a3b: MoE with QK-norm; deepseek-v3: MoE with MLA and
#: 61 layers (uneven stages); llama2-13b: dense without a NeMo 2 / Megatron-Bridge recipe.
MODELS = {"llama3-8b": 16, "qwen3-30b-a3b": 32, "deepseek-v3": 64, "llama2-13b": 16}


def models_for(trainer: str) -> list[str]:
    """torchtitan exports need a base config for the model (--torchtitan-base, an export option the
    table leaves out: see test_torchtitan_needs_a_base_config_for_models_without_one)."""
    from autopar.export.torchtitan import TORCHTITAN_MODELS

    return [m for m in MODELS if trainer != "torchtitan" or m in TORCHTITAN_MODELS]


@cache
def space(model_name: str):
    """(model, table, rule result) of the whole space for every trainer; a quarter of the plans keep
    bf16 main gradients, FP8 plans draw a recipe, half the MoE plans use capacity dispatch (factor
    1.25), and MoE plans with EP draw the DeepEP dispatcher and the EP all-to-all overlap at random
    (axes kept out of the product to keep it small)."""
    model = resolve_model(model_name)
    knobs = KNOBS | (MOE_KNOBS if model.moe is not None else {})
    q = Question(
        model=model, num_gpus=MODELS[model_name], cluster=CLUSTER, seq_len=SEQ, global_batch_size=64, trainers=TRAINERS
    )
    table = enumerate_plans(SearchSpace("agreement", "", knobs, {}), q)
    rng = np.random.default_rng(7)
    # bf16 main gradients only with bf16 / fp8 training: fp32 training has fp32 gradients in every
    # trainer (Megatron's main_grad takes the parameter dtype), a plan rule autopar.spec.rules lacks yet
    table.columns["main_grads_fp32"] = (rng.random(len(table)) >= 0.25) | (table.dtype == DTYPE["fp32"])
    # FP8 plans draw a scaling recipe (the trainer's default or any named one: trainers refuse the
    # ones they lack, and MXFP8 on an H100 breaks a GPU rule) and an FP8 parameter gather
    fp8 = table.dtype == DTYPE["fp8"]
    table.columns["fp8_recipe"] = np.where(fp8, rng.integers(0, len(RECIPE_CHOICES), len(table)), 0)
    table.columns["fp8_param_gather"] = np.where(fp8, rng.integers(0, len(PARAM_GATHER), len(table)), 0)
    if model.moe is not None:
        capacity = rng.random(len(table)) < 0.5
        table.columns["moe_dispatch"] = np.where(capacity, DISPATCH["capacity"], DISPATCH["dropless"])
        table.columns["capacity_factor"] = np.where(capacity, 1.25, 1.0)
        ep = table.ep > 1
        table.columns["moe_dispatcher"] = np.where(
            ep & (rng.random(len(table)) < 0.5), DISPATCHER["deepep"], DISPATCHER["alltoall"]
        )
        table.columns["ep_comm_overlap"] = ep & (rng.random(len(table)) < 0.3)
    return model, table, check_rules(table, model, num_gpus=q.num_gpus, cluster=CLUSTER, seq_len=SEQ)


def sample(trainer: str, model_name: str) -> tuple[list[int], list[int]]:
    """Seeded row samples of T's plans: (valid ones, ones broken only by T's capability lines)."""
    model, table, rules = space(model_name)
    mine = table.trainer == TRAINERS.index(trainer)
    own = np.zeros(len(table), bool)
    other = np.zeros(len(table), bool)
    for name, mask in rules.masks.items():
        if name.startswith("trainer:"):  # a capability kind, on a row of T: one of T's lines
            own |= mask
        else:
            other |= mask
    rng = np.random.default_rng(zlib.crc32(f"{trainer} {model_name}".encode()))
    pick = [rng.permutation(np.flatnonzero(mine & cls))[:PER_CLASS].tolist() for cls in (~own & ~other, own & ~other)]
    return pick[0], pick[1]


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_search_and_the_exporter_agree(trainer) -> None:
    exporter = get_exporter(trainer)
    rendered = refused = 0
    for model_name in models_for(trainer):
        model, table, rules = space(model_name)
        valid_rows, refused_rows = sample(trainer, model_name)
        rows = np.asarray(valid_rows + refused_rows, dtype=np.int64)
        if len(rows):  # the search's own verdict on the sample
            est = estimate_table(table.take(rows), model, CLUSTER, num_gpus=MODELS[model_name], seq_len=SEQ)
            assert est["valid"].tolist() == [True] * len(valid_rows) + [False] * len(refused_rows)
        options = ExportOptions(seq_len=SEQ)
        for i in valid_rows:
            plan = table.plan(i)
            bundle = exporter.render(plan, model, CLUSTER, options)
            assert exporter.parse(bundle) == plan_view(plan, model), (model_name, plan)
            rendered += 1
        for i in refused_rows:
            plan = table.plan(i)
            names = rules.labels(int(i))
            sentences = dict(zip(names, rules.reasons(int(i))))
            assert names and all(n.startswith(f"{trainer}:") for n in names)
            with pytest.raises(ExportRefused) as err:
                exporter.render(plan, model, CLUSTER, options)
            msg = str(err.value)
            assert "\n" not in msg and err.value.trainer == trainer
            assert err.value.reason in sentences.values(), (model_name, plan, msg, sentences)
            assert msg == f"{trainer} cannot run this plan: {err.value.reason}"
            refused += 1
    assert rendered >= 40 and refused >= 40, (rendered, refused)


def test_the_sample_is_broad() -> None:
    """The sampled plans cover every axis the brief names, valid and refused, for each trainer."""
    seen: dict[str, set] = {}
    for trainer in TRAINERS:
        for model_name in models_for(trainer):
            _, table, rules = space(model_name)
            valid_rows, refused_rows = sample(trainer, model_name)
            broken = {n for i in refused_rows for n in rules.labels(int(i))}
            seen.setdefault(trainer, set()).update(broken)
            plans = [table.plan(i) for i in valid_rows]
            seen.setdefault("valid", set()).update(
                {p.pp_schedule for p in plans if p.pp > 1}
                | {f"zero{p.zero_stage}" for p in plans}
                | {p.dtype for p in plans}
                | {p.recompute for p in plans}
                | {p.moe_dispatch for p in plans}
                | {"vpp" for p in plans if p.vpp > 1}
                | {"cp" for p in plans if p.cp > 1}
                | {"overlap" for p in plans if p.tp_comm_overlap and p.tp > 1}
                | {"no-sp" for p in plans if p.tp > 1 and not p.sequence_parallel}
                | {"partial" for p in plans if p.recompute_layers}
                | {"ep" for p in plans if p.ep > 1}
                | {"uneven" for p in plans if p.layout is not None}
                | {"bf16-grads" for p in plans if not p.main_grads_fp32}
                | {p.moe_dispatcher for p in plans}
                | {"ep-overlap" for p in plans if p.ep_comm_overlap}
            )
    assert {
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "zero-bubble",
        "zero0",
        "zero1",
        "zero2",
        "zero3",
        "bf16",
        "fp8",
        "fp32",
        "none",
        "selective",
        "full",
        "dropless",
        "capacity",
        "vpp",
        "cp",
        "overlap",
        "no-sp",
        "partial",
        "ep",
        "uneven",
        "bf16-grads",
        "alltoall",
        "deepep",
        "ep-overlap",
    } <= seen["valid"]
    assert {"megatron:pp_schedules", "megatron:partial_recompute", "megatron:tp_comm_overlap"} <= seen["megatron"]
    assert {"nemo:fp32", "nemo:recipes", "bridge:fp32", "bridge:recipes"} <= seen["nemo"] | seen["bridge"]
    assert {
        "torchtitan:zero_stages",
        "torchtitan:moe_dispatch",
        "torchtitan:etp",
        "torchtitan:bf16_main_grads",
        "torchtitan:partial_recompute",
        "torchtitan:ep_comm_overlap",
    } <= seen["torchtitan"]
    assert {
        "deepspeed:cp",
        "deepspeed:moe",
        "deepspeed:zero_stages_with_pp",
        "deepspeed:uneven_stages",
        "deepspeed:fp8",
        "deepspeed:attention_variants",
    } <= seen["deepspeed"]


def test_torchtitan_needs_a_base_config_for_models_without_one() -> None:
    """The one torchtitan refusal outside the table: a model without a preset config needs
    --torchtitan-base (an export option, as --recipe is for NeMo 2; the table leaves it out so that
    the search still offers torchtitan for any model shape)."""
    model, table, rules = space("llama2-13b")
    valid_rows, _ = sample("torchtitan", "llama2-13b")
    plan = table.plan(valid_rows[0])
    with pytest.raises(ExportRefused, match="--torchtitan-base"):
        get_exporter("torchtitan").render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ))
    bf16 = plan.with_(dtype="bf16")
    opts = ExportOptions(seq_len=SEQ, torchtitan_base="torchtitan.models.llama3.config_registry:llama3_8b")
    bundle = get_exporter("torchtitan").render(bf16, model, CLUSTER, opts)
    assert get_exporter("torchtitan").parse(bundle) == plan_view(bf16, model)


def test_a_recipe_option_waives_the_recipe_line() -> None:
    """--recipe stands in for the table's preset -> recipe line (NeMo 2, Megatron-Bridge)."""
    model, table, rules = space("llama2-13b")
    for trainer, recipe in (("nemo", "llama2_7b"), ("bridge", "llama2_7b_pretrain_config")):
        _, refused_rows = sample(trainer, "llama2-13b")
        only_recipe = [i for i in refused_rows if rules.labels(int(i)) == [f"{trainer}:recipes"]]
        assert only_recipe
        plan = table.plan(only_recipe[0])
        with pytest.raises(ExportRefused, match="recipe"):
            get_exporter(trainer).render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ))
        bundle = get_exporter(trainer).render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ, recipe=recipe))
        assert get_exporter(trainer).parse(bundle) == plan_view(plan.with_(trainer=trainer), model)
        assert recipe in "".join(f.text for f in bundle.files)


def test_launchers_refuse_with_the_wrapped_trainers_line() -> None:
    """torchrun / slurm wrap the plan's own trainer unless --trainer says otherwise."""
    from autopar.export.capabilities import broken_rules

    model, table, rules = space("qwen3-30b-a3b")
    _, refused_rows = sample("deepspeed", "qwen3-30b-a3b")
    row = next(
        i
        for i in refused_rows
        if broken_rules(table.plan(i).with_(trainer="megatron"), model, CLUSTER, num_gpus=32, seq_len=SEQ).ok
    )
    plan = table.plan(row)
    sentences = rules.reasons(int(row))
    for launcher in ("torchrun", "slurm"):
        with pytest.raises(ExportRefused) as err:  # the launcher wraps the plan's own trainer by default
            get_exporter(launcher).render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ))
        assert err.value.trainer == "deepspeed" and err.value.reason in sentences
        bundle = get_exporter(launcher).render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ, trainer="megatron"))
        assert bundle.meta["trainer"] == "megatron"


def test_a_table_of_one_plan_gives_the_same_rules() -> None:
    """The exporter checks one plan (a table of one row): the same masks as in the whole space."""
    model, table, rules = space("deepseek-v3")
    rows = np.random.default_rng(3).choice(len(table), 50, replace=False)
    for i in rows:
        one = check_rules(PlanTable.from_plans([table.plan(int(i))]), model, num_gpus=64, cluster=CLUSTER, seq_len=SEQ)
        assert {n for n, m in one.masks.items() if m[0]} == {n for n, m in rules.masks.items() if m[i]}


def test_launchers_refuse_a_trainer_without_an_exporter() -> None:
    """A plan of autopar's built-in model (the measured stage's trainer) has no launch config."""
    model, table, rules = space("llama3-8b")
    plan = table.plan(sample("megatron", "llama3-8b")[0][0]).with_(trainer="autopar")
    with pytest.raises(ExportRefused, match="autopar's built-in model, which has no launch config"):
        get_exporter("torchrun").render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ))
    bundle = get_exporter("torchrun").render(plan, model, CLUSTER, ExportOptions(seq_len=SEQ, trainer="megatron"))
    assert bundle.meta["trainer"] == "megatron"
