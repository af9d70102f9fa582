"""Spaces beyond exhaustive search: Optuna on a space too large for --max-exhaustive finds a plan
faster than the exhaustive optimum of a sub-space of it, and near the whole space's optimum; a
space too wide to walk, and a global-batch knob, are refused in one line; --gbs takes a what-if
list instead."""

from __future__ import annotations

import json

import pytest

from autopar.search.enumerate import Enumerator
from autopar.search.run import SearchOptions, run_search
from autopar.search.space import space_from_dict
from autopar.spec.hardware import default_cluster
from autopar.spec.presets import get_preset
from autopar.spec.question import Question

pytestmark = [pytest.mark.slow]  # searches of spaces too large to walk: about 12 s

#: a wide space of Llama 3 70B on 1,024 H100 (about 1.6M plans over every trainer)
WIDE = {
    "tp": [1, 2, 4, 8],
    "pp": [1, 2, 4, 8, 16, 32],
    "vpp": [1, 2, 4, 8],
    "cp": [1, 2, 4, 8],
    "zero": [0, 1, 2, 3],
    "mbs": [1, 2, 4, 8],
    "pp_schedule": ["gpipe", "1f1b", "zero-bubble"],
    "recompute": ["none", "selective", "full"],
    "dtype": ["bf16", "fp8"],
    "tp_comm_overlap": [False, True],
    "pp_layout": ["auto", "balanced"],
}
#: a sub-space of it: the layouts Megatron's recipes use for 70B (tp 4-8, pp 4-8), 1F1B family
NARROW = WIDE | {"tp": [4, 8], "pp": [4, 8], "cp": [1, 2], "pp_schedule": ["1f1b"], "dtype": ["bf16"]}
#: measured (TPE, 60 structures): seeds 0 and 2 find the wide space's exhaustive optimum (2.506 s,
#: 17 % faster than the sub-space's 3.024 s), seed 1 a plan 4.6 % faster than the sub-space's; the
#: bound on seed 0's distance to the optimum leaves room for the sampler's luck, not for a broken search
GAP = 0.05


def _question(space) -> Question:
    m = get_preset("llama3-70b")
    return Question(m, 1024, default_cluster("h100-sxm"), 8192, 512)


def test_optuna_on_a_space_too_large_beats_a_subspace_optimum(tmp_path):
    wide = space_from_dict({"name": "wide", "knobs": WIDE, "constraints": {"memory_headroom_gib": 2.0}}, "test")
    narrow = space_from_dict({"name": "narrow", "knobs": NARROW, "constraints": {"memory_headroom_gib": 2.0}}, "test")
    q = _question(wide)
    limit = 200_000
    assert Enumerator(narrow, q).total <= limit < Enumerator(wide, q).total
    sub = run_search(q, SearchOptions(space=narrow, max_exhaustive=limit, run_dir=tmp_path / "narrow"))
    big = run_search(q, SearchOptions(space=wide, max_exhaustive=limit, n_trials=60, seed=0, run_dir=tmp_path / "wide"))
    assert sub.method == "exhaustive" and big.method == "optuna-tpe"
    best_sub, best_big = float(sub.winner["step_time_s"]), float(big.winner["step_time_s"])
    assert best_big < best_sub, (best_big, best_sub)  # the wide space holds faster plans, and Optuna finds one
    # and it is near the wide space's own optimum (here the streamed search can still afford it)
    optimum = float(
        run_search(q, SearchOptions(space=wide, max_exhaustive=10**9, run_dir=tmp_path / "all")).winner["step_time_s"]
    )
    assert optimum <= best_big <= optimum * (1 + GAP), (best_big, optimum)
    # Optuna's answer is a real plan of the wide space, priced as the exhaustive search prices it
    assert big.winner["fits"] and json.loads((tmp_path / "wide" / "search.json").read_text())["method"] == "optuna-tpe"


def test_a_space_too_wide_to_walk_is_refused_in_one_line(tmp_path, run_cli):
    space = tmp_path / "huge.yaml"
    space.write_text(
        "name: huge\nknobs:\n"
        f"  tp: {list(range(1, 65))}\n  pp: {list(range(1, 129))}\n  cp: {list(range(1, 65))}\n"
        f"  vpp: {list(range(1, 17))}\n  pp_schedule: [gpipe, 1f1b, zero-bubble]\n"
        "  tp_comm_overlap: [false, true]\n  pp_layout: [auto, balanced, embedding+loss]\n"
        # its own constraints: the default space's (TP in a node, pp <= 16), inherited, would prune it
        "constraints:\n  tp_within_node: false\n  max_pp: 128\n"
    )
    r = run_cli("search", "--model", "70b", "--gpus", "1024", "--space", space)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "too wide to walk" in line and "shorten the longest knob lists" in line


def test_a_global_batch_knob_is_refused_and_gbs_takes_a_list(tmp_path, run_cli):
    space = tmp_path / "gbs.yaml"
    space.write_text("name: gbs\nknobs:\n  tp: [8]\n  gbs: [256, 512, 1024]\n")
    r = run_cli("search", "--model", "70b", "--gpus", "256", "--space", space)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "'gbs' cannot be searched" in line and "--gbs 256,512" in line
    r = run_cli("search", "--model", "70b", "--gpus", "256", "--gbs", "256,512", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [s["global_batch_size"] for s in out] == [256, 512]
    for s in out:
        assert s["top"] and s["top"][0]["plan"]["global_batch_size"] == s["global_batch_size"]


@pytest.mark.parametrize("bad", ["0,256", "256,x"])
def test_bad_gbs_lists(run_cli, bad):
    r = run_cli("search", "--model", "70b", "--gpus", "256", "--gbs", bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--gbs" in r.stderr
