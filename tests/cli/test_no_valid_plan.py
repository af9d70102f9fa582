"""A search whose space holds no valid plan at all has no answer: one line, exit 2. An Optuna
search that merely sampled no valid plan is a result (more --n-trials may find some): exit 0."""

from __future__ import annotations

import json


def test_exhaustive_search_with_no_valid_plan_is_one_line(cli_run, one_line_error, tmp_path) -> None:
    r = cli_run("search", "--model", "tiny", "--gpus", "1048576", "--seq-len", "512", "--run-dir", tmp_path / "run")
    one_line_error(r, ["no plan of the space is valid", "tiny on 1,048,576", "fewer GPUs"])
    assert (tmp_path / "run" / "search.json").is_file()  # the run directory stays, complete, for a look


def test_optuna_sampling_no_valid_plan_is_a_result(cli_run, tmp_path) -> None:
    r = cli_run(
        "search",
        "--model",
        "tiny",
        "--gpus",
        "8",
        "--max-exhaustive",
        "0",
        "--n-trials",
        "3",
        "--seed",
        "0",
        "--run-dir",
        tmp_path / "run",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["method"].startswith("optuna")  # whatever it sampled, a result


def test_a_trainer_without_a_recipe_is_named_not_the_gpus(cli_run, one_line_error, tmp_path) -> None:
    """Megatron-Bridge has no recipe of Mixtral 8x22B (megatron/bridge/recipes/__init__.py): the
    line says so, with the capability table's source and what to do, and never suggests fewer GPUs
    (every plan of every GPU count would be refused alike)."""
    r = cli_run(
        "search", "--model", "mixtral-8x22b", "--gpus", "64", "--trainer", "bridge", "--run-dir", tmp_path / "r"
    )
    one_line_error(
        r,
        ["Megatron-Bridge has no recipe for mixtral-8x22b", "recipes/__init__.py", "--trainer megatron"],
        absent=["fewer GPUs"],
    )


def test_a_trainer_without_moe_is_named(cli_run, one_line_error, tmp_path) -> None:
    r = cli_run(
        "search", "--model", "qwen3-30b-a3b", "--gpus", "16", "--trainer", "deepspeed", "--run-dir", tmp_path / "r"
    )
    one_line_error(r, ["DeepSpeed cannot run qwen3-30b-a3b (moe)", "sharded_moe.py"], absent=["fewer GPUs"])


def test_a_trainer_ruled_out_beside_one_that_runs_is_named_in_the_answer(cli_run, tmp_path) -> None:
    """DeepSpeed beside Megatron-Bridge on an MoE model: the search answers with Bridge, and the
    per-trainer table and --json say why DeepSpeed has no plan (its capability line, not memory)."""
    args = ["search", "--model", "qwen3-30b-a3b", "--gpus", "16", "--trainer", "deepspeed,bridge", "--top-k", "1"]
    r = cli_run(*args, "--run-dir", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    assert "cannot run it (below)" in r.stdout and "DeepSpeed cannot run qwen3-30b-a3b (moe)" in r.stdout
    r = cli_run(*args, "--run-dir", tmp_path / "j", "--json")
    out = json.loads(r.stdout)
    assert (
        list(out["trainers_ruled_out"]) == ["deepspeed"] and "sharded_moe.py" in out["trainers_ruled_out"]["deepspeed"]
    )
    assert out["per_trainer"]["deepspeed"] is None and out["per_trainer"]["bridge"] is not None
