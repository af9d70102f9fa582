"""Enumeration of a search space (autopar/search/enumerate.py): the number of plans equals a count
derived by hand from the canonicalisation rules, no plan appears twice, and every plan uses all
the GPUs."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest

from autopar.errors import InputError
from autopar.search.enumerate import enumerate_plans, knob_choices, space_size
from autopar.search.space import load_space, space_from_dict
from autopar.spec.hardware import default_cluster
from autopar.spec.layout import auto_layout
from autopar.spec.presets import get_preset
from autopar.spec.question import Question
from autopar.spec.table import SCHED

H100 = default_cluster("h100-sxm")  # 8 GPUs per node

# llama3-8b: 32 layers. 16 GPUs.
HAND_KNOBS = {
    "tp": [1, 2, 4],
    "pp": [1, 2, 4, 3],  # 3 does not divide 16: never a plan
    "cp": [1, 2],
    "vpp": [1, 2],  # 2 means interleaved-1f1b
    "pp_schedule": ["1f1b", "zero-bubble"],
    "zero": [1, 3],
    "mbs": [1, 2],
    "recompute": ["none", "full"],
    "recompute_layers": [1],  # only with full recompute
    "tp_comm_overlap": [False, True],  # only with tp > 1
    "pp_layout": ["auto", "embedding+loss"],
    # sp: auto (default) -> follows tp; dtype: bf16 only; dense model -> ep 1, etp = tp
}

# The hand count.
#
# (tp, pp, cp) with tp*pp*cp dividing 16, tp in {1,2,4}, pp in {1,2,4} (3 never divides 16),
# cp in {1,2}: every combination except tp4*pp4*cp2 = 32.
#   weight of a (tp, cp) pair = tp_comm_overlap choices = 1 for tp 1, 2 for tp > 1:
#   pp 1: tp1 (cp1, cp2) 1+1 = 2; tp2: 2+2 = 4; tp4: 2+2 = 4            -> 10
#   pp 2: the same                                                      -> 10
#   pp 4: tp1: 1+1 = 2; tp2: 2+2 = 4; tp4: cp1 only, 2                  -> 8
# (schedule, vpp, layout) per pp:
#   pp 1: one schedule (1f1b), vpp 1, auto layout only                  -> 1
#   pp 2: 1f1b/v1 and zero-bubble/v1 on 2 stages: embedding+loss counts 34 units -> [17,17]
#         -> [16,16] = the even auto layout, so no variant: 1 + 1;
#         interleaved/v2 on 4 stages: 34 -> [8,9,9,8] -> [7,9,9,7] != [8,8,8,8]: 2    -> 4
#   pp 4: 1f1b/v1 and zero-bubble/v1 on 4 stages: 2 + 2; interleaved/v2 on 8 stages:
#         34 -> [4,5,5,4,4,4,4,4] -> [3,5,5,4,4,4,4,3] != [4]*8: 2               -> 6
# inner knobs: zero 2 x mbs 2 x (recompute none: 1 + full: 2 (all layers, or 1 layer)) = 12
# total = 12 * (10*1 + 10*4 + 8*6) = 12 * 98 = 1176
HAND_COUNT = 12 * (10 * 1 + 10 * 4 + 8 * 6)


def q8b(gpus: int = 16, gbs: int = 64, trainers: tuple[str, ...] = ("megatron",)) -> Question:
    return Question(
        model=get_preset("llama3-8b"),
        num_gpus=gpus,
        cluster=H100,
        seq_len=4096,
        global_batch_size=gbs,
        trainers=trainers,
    )


@pytest.fixture(scope="module")
def hand_table():
    space = space_from_dict({"knobs": HAND_KNOBS}, "hand")
    return enumerate_plans(space, q8b())


def test_hand_count(hand_table):
    assert HAND_COUNT == 1176
    assert len(hand_table) == HAND_COUNT


def test_every_trainer_is_a_copy_of_the_space():
    """Without --trainer every production trainer gets the whole space (its capability table rejects
    what it cannot run, with the reason): five times the hand count, each trainer once per plan."""
    from autopar.spec.trainers import TRAINERS

    space = space_from_dict({"knobs": HAND_KNOBS}, "hand")
    table = enumerate_plans(space, q8b(trainers=TRAINERS))
    assert len(table) == HAND_COUNT * len(TRAINERS)
    assert collections.Counter(table.trainer.tolist()) == {i: HAND_COUNT for i in range(len(TRAINERS))}


def test_hand_count_by_pipeline_depth(hand_table):
    # the per-pp split of the hand count above
    by_pp = collections.Counter(hand_table.pp.tolist())
    assert by_pp == {1: 12 * 10 * 1, 2: 12 * 10 * 4, 4: 12 * 8 * 6}


def _plans(table):
    return [table.plan(i) for i in range(len(table))]


def test_no_duplicate_plans(hand_table):
    plans = _plans(hand_table)
    dup = [p for p, n in collections.Counter(plans).items() if n > 1]
    assert not dup, f"{len(dup)} plans appear more than once, e.g. {dup[0]}"


def test_every_plan_uses_all_gpus(hand_table):
    t = hand_table
    assert np.all(t.tp * t.pp * t.cp * t.dp == 16)
    assert all(p.num_gpus == 16 for p in _plans(t))


def test_canonical_rows(hand_table):
    t = hand_table
    pp1 = t.pp == 1
    # pp = 1: one schedule, no interleaving, auto layout
    assert np.all(t.schedule[pp1] == SCHED["1f1b"]) and np.all(t.vpp[pp1] == 1) and np.all(t.layout_id[pp1] == -1)
    # vpp > 1 exactly when interleaved
    assert np.array_equal(t.vpp > 1, t.schedule == SCHED["interleaved-1f1b"])
    # sp follows tp; TP overlap needs TP; recompute layers only with full recompute; dense: etp = tp, ep = 1
    assert np.array_equal(t.sequence_parallel, t.tp > 1)
    assert not np.any(t.tp_comm_overlap & (t.tp == 1))
    assert np.all((t.recompute_layers < 0) | (t.recompute == 2))
    assert np.array_equal(t.etp, t.tp) and np.all(t.ep == 1)
    assert np.all(t.global_batch_size == 64)
    # layout variants only with a pipeline, and only where they differ from the auto layout
    for i in np.flatnonzero(t.layout_id >= 0):
        lay = t.layouts[t.layout_id[i]]
        assert t.pp[i] > 1
        assert lay.stages != auto_layout(32, int(t.pp[i]), int(t.vpp[i])).stages
        assert sum(lay.stages) == 32 and len(lay.stages) == t.pp[i] * t.vpp[i]
    # every (pp, vpp) where embedding+loss differs got its variant: pp2/v2, pp4/v1, pp4/v2
    variants = {(int(t.pp[i]), int(t.vpp[i])) for i in np.flatnonzero(t.layout_id >= 0)}
    assert variants == {(2, 2), (4, 1), (4, 2)}


def test_space_size_bounds_the_enumeration(hand_table):
    space = space_from_dict({"knobs": HAND_KNOBS}, "hand")
    assert space_size(space, q8b()) >= len(hand_table)


# ---- MoE ------------------------------------------------------------------------------------------


def test_moe_expert_knobs_hand_count():
    """tiny-moe (4 experts) on 8 GPUs, tp in {1, 2}, pp 1, cp 1: ep auto = divisors of 4 = {1, 2, 4};
    etp in {tp, 1}: with tp 1 both are etp 1 (one plan), with tp 2 they differ (two plans).
    Count = 3 ep x (1 + 2) = 9 distinct plans."""
    space = space_from_dict({"knobs": {"tp": [1, 2], "etp": ["tp", 1], "ep": "auto"}}, "moe-hand")
    q = Question(
        model=get_preset("tiny-moe"),
        num_gpus=8,
        cluster=H100,
        seq_len=128,
        global_batch_size=16,
        trainers=("megatron",),
    )
    assert knob_choices(space, q)["ep"] == [1, 2, 4]
    t = enumerate_plans(space, q)
    plans = _plans(t)
    assert len(set(plans)) == 9
    assert len(t) == 9, (
        f"{len(t)} rows for 9 distinct plans: tp=1 rows appear once with etp='tp' and once "
        f"with etp=1, which are the same plan"
    )


def test_moe_shipped_space_has_no_duplicates():
    space = load_space("moe")
    m = get_preset("mixtral-8x7b")
    q = Question(model=m, num_gpus=64, cluster=H100, seq_len=m.seq_len, global_batch_size=512)
    t = enumerate_plans(space, q)
    c = collections.Counter(_plans(t))
    assert len(c) == len(t), f"{len(t)} rows, {len(c)} distinct plans"


# ---- the shipped spaces ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model,gpus,space_name",
    [("llama3-70b", 256, "default"), ("llama3-70b", 512, "dense-large"), ("llama3-8b", 64, "long-context")],
)
def test_shipped_dense_spaces_are_canonical(model, gpus, space_name):
    space = load_space(space_name)
    m = get_preset(model)
    q = Question(model=m, num_gpus=gpus, cluster=H100, seq_len=m.seq_len, global_batch_size=256)
    t = enumerate_plans(space, q)
    assert np.all(t.tp * t.pp * t.cp * t.dp == gpus)
    assert np.all(t.tp <= 8)  # tp_within_node
    assert np.all(t.pp <= space.constraints["max_pp"])
    assert len(set(_plans(t))) == len(t)
    assert space_size(space, q) >= len(t)


# ---- constraints and errors -------------------------------------------------------------------------


def test_constraints_narrow_the_choices():
    space = space_from_dict(
        {
            "knobs": {"tp": [1, 2, 4, 8, 16], "pp": [1, 2, 4, 8], "cp": [1, 2, 4]},
            "constraints": {"tp_within_node": True, "max_tp": 4, "max_pp": 2, "max_cp": 2},
        },
        "c",
    )
    ch = knob_choices(space, q8b(64))
    assert ch["tp"] == [1, 2, 4] and ch["pp"] == [1, 2] and ch["cp"] == [1, 2]
    t = enumerate_plans(space, q8b(64))
    assert t.tp.max() == 4 and t.pp.max() == 2 and t.cp.max() == 2


def test_tp_within_node_follows_gpus_per_node():
    space = space_from_dict({"knobs": {"tp": [2, 4, 8]}, "constraints": {"tp_within_node": True}}, "n")
    q = Question(
        model=get_preset("llama3-8b"),
        num_gpus=16,
        cluster=default_cluster("h100-sxm", gpus_per_node=4),
        seq_len=4096,
        global_batch_size=64,
    )
    assert knob_choices(space, q)["tp"] == [2, 4]


def test_ep_within_limits_expert_parallelism():
    space = space_from_dict({"knobs": {"ep": "auto"}, "constraints": {"ep_within": 4}}, "e")
    m = get_preset("mixtral-8x7b")  # 8 experts
    q = Question(model=m, num_gpus=64, cluster=H100, seq_len=4096, global_batch_size=64)
    assert knob_choices(space, q)["ep"] == [1, 2, 4]
    # dense model: ep is always 1
    assert knob_choices(space, q8b())["ep"] == [1]


def test_empty_after_constraints_is_input_error():
    space = space_from_dict({"knobs": {"tp": [16]}, "constraints": {"tp_within_node": True}}, "e")
    with pytest.raises(InputError, match="empty"):
        enumerate_plans(space, q8b())


def test_no_layout_divides_is_input_error():
    space = space_from_dict({"knobs": {"tp": [8], "pp": [1], "cp": [1]}}, "d")
    with pytest.raises(InputError, match="12 GPUs"):
        enumerate_plans(space, q8b(12))


# ---- library bugs, kept honest -----------------------------------------------------------------------


def _plan_set(knobs: dict, q: Question) -> set:
    return set(_plans(enumerate_plans(space_from_dict({"knobs": knobs}, "x"), q)))


def test_pp_layout_order_does_not_matter():
    base = {"tp": [1, 2], "pp": [1, 2, 3]}
    q = q8b(24)
    a = _plan_set(base | {"pp_layout": ["auto", "balanced"]}, q)
    b = _plan_set(base | {"pp_layout": ["balanced", "auto"]}, q)
    assert any(p.pp == 1 for p in a)
    assert a == b, f"only with auto first: {sorted(p.describe() for p in a - b)}"


def test_etp_auto_is_rejected_or_works():
    m = get_preset("tiny-moe")
    q = Question(model=m, num_gpus=8, cluster=H100, seq_len=128, global_batch_size=16)
    try:
        space = space_from_dict({"knobs": {"tp": [1, 2], "etp": "auto"}}, "x")
    except InputError:
        return  # rejected up front: fine
    try:
        assert len(enumerate_plans(space, q)) > 0
    except InputError:
        pass  # a one-line error the user can act on: fine


def test_repeated_choices_do_not_duplicate_plans():
    space = space_from_dict({"knobs": {"tp": [1, 2], "recompute": ["full", "full"], "dtype": ["bf16", "bf16"]}}, "x")
    t = enumerate_plans(space, q8b(8))
    assert len(set(_plans(t))) == len(t)


def test_space_size_bounds_explicit_sp():
    space = space_from_dict({"knobs": {"tp": [2, 4], "sp": [True, False]}}, "x")
    assert space_size(space, q8b()) >= len(enumerate_plans(space, q8b()))


def test_layout_ids_match_the_registry_row_by_row():
    # every (pp, vpp, variant) of a wide space, plus ones the registry does not hold (auto: -1),
    # looked up against the registry itself, one key at a time
    from autopar.search.enumerate import Enumerator

    q = Question(model=get_preset("llama3-70b"), num_gpus=4096, cluster=default_cluster("h100-sxm"), seq_len=8192)
    e = Enumerator(load_space(str(Path(__file__).parents[2] / "benchmarks" / "spaces" / "scale-l.yaml")), q)
    keys = list(e._layout_index) + [(5, 1, 1), (2, 9, 1), (4, 2, 0)]
    pp, vpp, choice = (np.array([k[i] for k in keys]) for i in range(3))
    got = e.layout_id(pp, vpp, choice)
    want = [e._layout_index.get(k, -1) for k in keys]
    assert got.tolist() == want
    assert {-2, -1} <= set(want) and max(want) == len(e.layouts) - 1


def test_a_space_listing_only_named_fp8_recipes_searches_them():
    """With no "default" recipe in the space, the trainer's default recipe named is not a duplicate
    of another plan, and the walk keeps the layouts whose inner choices include it. By hand, 16
    GPUs, tp 1-2 x pp 1-2 (all divide 16), megatron, fp8 with [delayed, tensorwise]: 4 layouts x 2
    recipes = 8 plans (the walk found none: it tried each layout with the first recipe only, and
    dropped delayed as Megatron's default)."""
    knobs = {"tp": [1, 2], "pp": [1, 2], "mbs": [1], "recompute": ["none"], "dtype": ["fp8"]}
    table = enumerate_plans(space_from_dict({"knobs": knobs | {"fp8_recipe": ["delayed", "tensorwise"]}}, "r"), q8b())
    assert len(table) == 8
    assert sorted(table.plan(i).fp8_recipe for i in range(len(table))) == ["delayed"] * 4 + ["tensorwise"] * 4
