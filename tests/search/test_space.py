"""Search spaces (autopar/search/space.py): the shipped YAML files load, and every kind of bad
space file is an InputError whose one-line message names the problem."""

from __future__ import annotations

import pytest

from autopar.errors import InputError
from autopar.search.space import KNOBS, SearchSpace, load_space, space_from_dict, space_names

SHIPPED = ("default", "dense-large", "moe", "long-context")
# The CLI side (`autopar search --space nosuch|defualt`) is in test_search_bad_input.py.


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_space_loads(name):
    sp = load_space(name)
    assert isinstance(sp, SearchSpace)
    assert sp.name == name
    assert sp.description
    assert set(sp.knobs) <= set(KNOBS)
    # every shipped space searches the core layout knobs and keeps TP inside a node
    for knob in ("tp", "pp", "cp", "recompute", "mbs"):
        assert knob in sp.knobs, f"{name}: no '{knob}' knob"
    assert sp.constraints.get("tp_within_node") is True
    assert sp.constraints.get("memory_headroom_gib", 0) >= 0
    assert isinstance(sp.knobs["tokens_per_step"], int) and sp.knobs["tokens_per_step"] > 0


def test_space_names_are_the_shipped_files():
    assert set(SHIPPED) <= set(space_names())


def test_space_by_file_path_equals_by_name(sh):
    by_name = load_space("moe")
    by_file = load_space(str(sh.repo / "search_spaces" / "moe.yaml"))
    assert by_file.knobs == by_name.knobs
    assert by_file.constraints == by_name.constraints


def _write(tmp_path, text: str, name: str = "space.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# (id, YAML text, substrings the message must contain (case-insensitive))
BAD = [
    ("unknown-knob", "knobs:\n  tp: [1, 2]\n  tensor_par: [2]\n", ["unknown knob", "tensor_par"]),
    ("unknown-knob-close", "knobs:\n  recompte: [none]\n", ["recompte", "did you mean", "recompute"]),
    ("unknown-constraint", "knobs:\n  tp: [1]\nconstraints:\n  max_dp: 4\n", ["unknown constraint", "max_dp"]),
    ("bad-recompute-choice", "knobs:\n  recompute: [sometimes]\n", ["recompute", "sometimes"]),
    ("bad-schedule-choice", "knobs:\n  pp_schedule: [1f1b, gpipe2]\n", ["pp_schedule", "gpipe2"]),
    ("tp-zero", "knobs:\n  tp: [0]\n", ["tp", "0"]),
    ("tp-negative", "knobs:\n  tp: [2, -4]\n", ["tp", "-4"]),
    ("tp-string", "knobs:\n  tp: [eight]\n", ["tp", "eight"]),
    ("tp-bool", "knobs:\n  tp: [true]\n", ["tp", "true"]),
    ("zero-5", "knobs:\n  zero: [1, 5]\n", ["zero", "5"]),
    ("empty-list", "knobs:\n  pp: []\n", ["pp", "non-empty"]),
    ("scalar-not-list", "knobs:\n  pp: 4\n", ["pp", "list"]),
    ("bool-knob-not-bool", "knobs:\n  tp_comm_overlap: [yes_please]\n", ["tp_comm_overlap", "true/false"]),
    ("tokens-negative", "knobs:\n  tokens_per_step: -5\n", ["tokens_per_step", "-5"]),
    ("constraint-wrong-type", "constraints:\n  tp_within_node: 3\n", ["tp_within_node", "true/false"]),
    ("constraint-negative", "constraints:\n  memory_headroom_gib: -1\n", ["memory_headroom_gib", "-1"]),
    ("unknown-top-key", "name: x\nknob:\n  tp: [1]\n", ["unknown key", "knob"]),
    ("knobs-not-mapping", "knobs: [tp, pp]\n", ["knobs", "mapping"]),
    ("malformed-yaml", "knobs:\n  tp: [1, 2\n  pp: : \n", ["not valid yaml", "line"]),
    ("top-level-list", "- tp\n- pp\n", ["top level", "mapping"]),
    ("top-level-scalar", "just a string\n", ["top level", "mapping"]),
]


@pytest.mark.parametrize("text,needles", [(t, n) for _, t, n in BAD], ids=[i for i, _, _ in BAD])
def test_bad_space_file_is_input_error(tmp_path, text, needles):
    path = _write(tmp_path, text)
    with pytest.raises(InputError) as ei:
        load_space(path)
    msg = str(ei.value)
    assert "\n" not in msg.strip(), f"message is not one line: {msg!r}"
    for needle in needles:
        assert needle.lower() in msg.lower(), f"{needle!r} not in {msg!r}"
    # it names the file it complains about
    assert "space.yaml" in msg


def test_missing_space_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_space(str(tmp_path / "nope.yaml"))


def test_unknown_space_name_lists_shipped_spaces():
    with pytest.raises(InputError) as ei:
        load_space("nosuch")
    msg = str(ei.value)
    assert "nosuch" in msg
    for name in SHIPPED:
        assert name in msg


@pytest.mark.parametrize(
    "typo,meant",
    [("defualt", "default"), ("mo", "moe"), ("long-contex", "long-context"), ("dense_large", "dense-large")],
)
def test_unknown_space_name_suggests_a_close_one(typo, meant):
    with pytest.raises(InputError) as ei:
        load_space(typo)
    assert f"did you mean '{meant}'" in str(ei.value)


def test_minimal_space_and_with_knobs():
    sp = space_from_dict({"knobs": {"tp": [8, 2]}}, "inline")
    assert sp.name == "inline" and sp.constraints == {}
    pinned = sp.with_knobs(tp=4, pp=None, recompute=["full"])
    assert pinned.knobs == {"tp": [4], "recompute": ["full"]}
    assert sp.knobs == {"tp": [8, 2]}  # the original is untouched
    assert space_from_dict({}, "empty").knobs == {}


def test_auto_allowed_only_where_documented(tmp_path):
    knobs = load_space(_write(tmp_path, "knobs:\n  ep: auto\n  sp: auto\n")).knobs
    assert (knobs["ep"], knobs["sp"]) == ("auto", "auto")
    with pytest.raises(InputError, match="'tp'"):
        load_space(_write(tmp_path, "knobs:\n  tp: auto\n"))
