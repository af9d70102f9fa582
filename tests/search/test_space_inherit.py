"""A space file inherits every knob and constraint it does not set from the default space; without
--space the space is chosen from the model and the sequence length (moe, long-context, both)."""

from __future__ import annotations

from pathlib import Path

from autopar.search.space import LONG_CONTEXT_SEQ, chosen_space, load_space

#: search_spaces/default.yaml, copied by hand: what a file that sets only dtype must inherit
DEFAULT_KNOBS = {
    "tp": [1, 2, 4, 8],
    "pp": [1, 2, 4, 8, 16],
    "vpp": [1, 2, 4, 5, 6, 8, 10],
    "cp": [1, 2, 4],
    "ep": "auto",
    "etp": ["tp"],
    "zero": [1, 3],
    "dp_shard": ["all"],
    "sp": "auto",
    "mbs": [1, 2, 4],
    "pp_schedule": ["1f1b", "zero-bubble"],
    "recompute": ["none", "selective", "full"],
    "dtype": ["bf16"],
    "fp8_recipe": ["default"],
    "fp8_param_gather": ["default"],
    "tp_comm_overlap": [False, True],
    "compile": [False],
    "offload_modules": ["none"],
    "moe_dispatcher": ["alltoall", "deepep"],
    "pp_layout": ["auto", "balanced"],
    "tokens_per_step": 4194304,
}
DEFAULT_CONSTRAINTS = {"tp_within_node": True, "max_pp": 16, "memory_headroom_gib": 2.0, "headroom_trade": 0.05}


def test_a_file_setting_only_dtype_is_the_default_with_that_dtype(tmp_path):
    path = tmp_path / "fp8.yaml"
    path.write_text("knobs:\n  dtype: [fp8]\n")
    sp = load_space(str(path))
    assert load_space("default").knobs == DEFAULT_KNOBS  # the hand copy is the shipped file
    for knob, choices in DEFAULT_KNOBS.items():  # knob by knob: the default's, dtype replaced
        assert sp.knobs[knob] == (["fp8"] if knob == "dtype" else choices), knob
    assert set(sp.knobs) == set(DEFAULT_KNOBS)
    assert sp.constraints == DEFAULT_CONSTRAINTS
    assert "dtype" not in sp.inherited and {"tp", "max_pp"} <= set(sp.inherited)


def test_a_file_keeps_what_it_sets(tmp_path):
    path = tmp_path / "narrow.yaml"
    path.write_text("knobs:\n  tp: [8]\nconstraints:\n  max_pp: 4\n")
    sp = load_space(str(path))
    assert sp.knobs["tp"] == [8] and sp.constraints["max_pp"] == 4
    assert sp.knobs["cp"] == [1, 2, 4] and sp.constraints["tp_within_node"] is True  # inherited


def test_shipped_spaces_inherit_only_what_they_leave_out():
    assert load_space("default").inherited == ()
    assert load_space("moe").inherited == ()  # sets every knob of the default
    # long-context names no MoE dispatcher: it takes the default's (DeepEP searched for MoE models)
    assert load_space("long-context").inherited == ("moe_dispatcher",)
    assert load_space("long-context").knobs["moe_dispatcher"] == ["alltoall", "deepep"]
    # CPU trials: no DeepEP; read from this checkout's file (an editable install may map another one)
    local = Path(__file__).parents[2] / "search_spaces" / "local.yaml"
    assert load_space(str(local)).knobs["moe_dispatcher"] == ["alltoall"]


def test_chosen_space_by_model_and_sequence():
    assert chosen_space(False, 8192).knobs == DEFAULT_KNOBS
    assert chosen_space(True, 8192).knobs == load_space("moe").knobs
    assert chosen_space(False, LONG_CONTEXT_SEQ).knobs == load_space("long-context").knobs
    assert chosen_space(False, LONG_CONTEXT_SEQ - 1).name == "default"
    assert chosen_space(True, 131072).chosen_because == "chosen for an MoE model, seq 131,072 >= 32,768"


def test_moe_and_long_context_compose():
    both = chosen_space(True, 131072)
    assert both.name == "moe+long-context"
    # long-context's own choices (search_spaces/long-context.yaml) win where both differ from the default
    assert both.knobs["cp"] == [1, 2, 4, 8, 16, 32] and both.knobs["mbs"] == [1]
    assert both.knobs["pp"] == [1, 2, 4, 8] and both.knobs["vpp"] == [1, 2]
    assert both.constraints["max_pp"] == 8
    # moe's expert knobs (search_spaces/moe.yaml) stay: long-context leaves them at the default
    assert both.knobs["etp"] == ["tp", 1] and both.knobs["ep_comm_overlap"] == [False, True]
    assert both.constraints["ep_within"] == 64
    assert both.knobs["zero"] == [1, 3]  # both keep FSDP (torchtitan's EP lives in its FSDP group)
    assert both.knobs["pp_schedule"] == ["1f1b"]  # both set 1f1b alone
    assert both.knobs["tp"] == [1, 2, 4, 8]  # neither differs from the default
