"""`search --recipe`: a recipe named for a trainer that starts from one (NeMo 2, Megatron-Bridge)
stands in for its preset -> recipe line, so a model without a preset runs on it; the run directory
records it and `export --run` starts from it. Bad --recipe values are one line, exit 2."""

from __future__ import annotations

import json

import pytest

from autopar.errors import InputError
from autopar.spec.trainers import TRAINERS, parse_recipes, trainers


def test_parse_recipes_pairs_and_the_bare_form() -> None:
    assert parse_recipes(None, TRAINERS) == ()
    assert parse_recipes("llama2_13b", ("megatron", "nemo")) == (("nemo", "llama2_13b"),)
    assert parse_recipes("nemo=a, bridge=b_pretrain_config", TRAINERS) == (
        ("nemo", "a"),
        ("bridge", "b_pretrain_config"),
    )
    # the trainers that start from a recipe are those with a recipe table (trainers.toml)
    assert {t for t in TRAINERS if trainers()[t].recipes is not None} == {"nemo", "bridge"}


@pytest.mark.parametrize(
    ("text", "searched", "words"),
    [
        ("llama2_13b", TRAINERS, ["names no trainer", "nemo=NAME,bridge=NAME"]),  # two could take it
        ("x", ("megatron",), ["none is searched", "--trainer nemo"]),
        ("megatron=x", TRAINERS, ["megatron is not a searched trainer that starts from a recipe"]),
        ("nemo=1x", TRAINERS, ["not a Python name"]),
        ("nemo=import", TRAINERS, ["not a Python name"]),
        ("nemo=a,nemo=b", TRAINERS, ["two recipes for nemo"]),
        ("nemo=a,", TRAINERS, ["empty item"]),
    ],
)
def test_bad_recipes_are_one_line(text, searched, words) -> None:
    with pytest.raises(InputError) as e:
        parse_recipes(text, searched)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)


def test_a_recipe_lets_a_model_without_a_preset_recipe_run_and_export(cli_run, one_line_error, tmp_path) -> None:
    """Llama 2 13B has no NeMo 2 recipe in the table (nemo/collections/llm/recipes/__init__.py):
    without --recipe the search is refused on that line; with it, NeMo's plans are priced, no plan is
    rejected by the recipe line, search.json records the recipe and the export imports it."""
    args = ["search", "--model", "llama2-13b", "--gpus", "64", "--trainer", "nemo", "--top-k", "1"]
    one_line_error(cli_run(*args, "--run-dir", tmp_path / "none"), ["NeMo 2 has no recipe for llama2-13b", "--recipe"])
    r = cli_run(*args, "--recipe", "llama2_13b", "--run-dir", tmp_path / "r", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["plans_fit"] > 0 and out["top"][0]["trainer"] == "nemo" and out["top"][0]["trainers"] == ["nemo"]
    assert out["trainers_ruled_out"] == {}
    assert json.loads((tmp_path / "r" / "search.json").read_text())["question"]["recipes"] == {"nemo": "llama2_13b"}
    r = cli_run("export", "--run", tmp_path / "r", "--to", "nemo", "--out", tmp_path / "x")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "x" / "nemo" / "nemo_pretrain.py").read_text()
    assert "from nemo.collections.llm.recipes import llama2_13b as recipe_module" in script


def test_search_refuses_a_bare_recipe_for_two_trainers(cli_run, one_line_error, tmp_path) -> None:
    r = cli_run(
        "search", "--model", "llama2-13b", "--gpus", "64", "--recipe", "llama2_13b", "--run-dir", tmp_path / "r"
    )
    one_line_error(r, ["--recipe 'llama2_13b' names no trainer", "nemo=NAME,bridge=NAME"])
    assert not (tmp_path / "r").exists()  # refused before any search
