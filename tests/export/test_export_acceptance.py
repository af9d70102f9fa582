"""Issue 13's acceptance, end to end through the command line (in-process): for each trainer T,
`autopar search --trainer T` then `autopar export --run DIR --rank N --to T` succeeds for ranks
1-3 and the files parse back to the ranked plan; without --trainer, exporting rank N to T
re-targets it and either exports or refuses with T's one-line capability sentence, exactly as the
capability table decides; a search that finds nothing for a trainer says so, and so does export.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.cli import main
from autopar.export import ExportBundle, ExportFile, get_exporter, plan_view
from autopar.export.capabilities import broken_rules
from autopar.export.source import load_run_plan
from autopar.spec.trainers import TRAINERS, get_trainer

SEARCHES = [("70b", 256, t) for t in TRAINERS] + [
    ("deepseek-v3", 1024, "megatron"),
    ("qwen3-30b-a3b", 64, "torchtitan"),
    ("405b", 2048, "nemo"),
]


def cli(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def search(run: Path, model: str, gpus: int, trainer: str | None, capsys) -> list[dict]:
    argv = ["search", "--model", model, "--gpus", str(gpus), "--space", "default", "--run-dir", str(run), "--json"]
    code, _, err = cli(argv + (["--trainer", trainer] if trainer else []), capsys)
    assert code == 0, err
    return json.loads((run / "top.json").read_text())["top"]


def read_bundle(d: Path, fmt: str) -> ExportBundle:
    return ExportBundle(format=fmt, files=tuple(ExportFile(p.name, p.read_text()) for p in sorted(d.iterdir())), run="")


@pytest.mark.parametrize("model,gpus,trainer", SEARCHES, ids=[f"{m}-{g}-{t}" for m, g, t in SEARCHES])
def test_search_for_a_trainer_then_export_ranks_1_to_3(model, gpus, trainer, tmp_path, capsys) -> None:
    top = search(tmp_path / "run", model, gpus, trainer, capsys)
    assert len(top) >= 3 and all(e["trainer"] == trainer for e in top)
    for rank in (1, 2, 3):
        out = tmp_path / f"export{rank}"
        code, stdout, err = cli(
            ["export", "--run", str(tmp_path / "run"), "--rank", str(rank), "--to", trainer, "--out", str(out)], capsys
        )
        assert code == 0, err
        entry = load_run_plan(tmp_path / "run", rank)
        assert entry.plan.trainer == trainer
        assert get_exporter(trainer).parse(read_bundle(out / trainer, trainer)) == plan_view(entry.plan, entry.model)
        text = "".join(p.read_text() for p in (out / trainer).iterdir())
        assert f"trainer:    {get_trainer(trainer).title} ({trainer})" in text
        assert f"step {top[rank - 1]['step_time_s']:.3f} s" in text  # the search's own prediction


@pytest.fixture(scope="module")
def all_trainers_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("all") / "run"
    main(["search", "--model", "70b", "--gpus", "256", "--space", "default", "--run-dir", str(run), "--json"])
    return run


@pytest.mark.parametrize("trainer", TRAINERS)
def test_without_trainer_export_re_targets_or_refuses_with_the_table(
    trainer, all_trainers_run, tmp_path, capsys
) -> None:
    exported = refused = 0
    for rank in (1, 2, 3):
        entry = load_run_plan(all_trainers_run, rank)
        target = entry.plan.with_(trainer=trainer)
        broken = broken_rules(target, entry.model, entry.cluster, num_gpus=entry.num_gpus, seq_len=entry.seq_len)
        assert not broken.other  # a ranked plan is valid; only the trainer's lines can stand in the way
        code, _, err = cli(
            [
                "export",
                "--run",
                str(all_trainers_run),
                "--rank",
                str(rank),
                "--to",
                trainer,
                "--out",
                str(tmp_path / str(rank)),
            ],
            capsys,
        )
        top = json.loads((all_trainers_run / "top.json").read_text())["top"][rank - 1]
        if broken.ok:
            assert code == 0, err
            got = get_exporter(trainer).parse(read_bundle(tmp_path / str(rank) / trainer, trainer))
            assert got == plan_view(target, entry.model)
            exported += 1
        else:
            assert code == 2 and trainer not in top["trainers"]
            sentences = [text for _, text in broken.capability]
            assert err.count("\n") == 1 and err.startswith(f"autopar: error: {trainer} cannot run this plan: ")
            assert err.removeprefix(f"autopar: error: {trainer} cannot run this plan: ").rstrip("\n") in sentences
            assert not (tmp_path / str(rank)).exists()
            refused += 1
    assert exported + refused == 3


def test_the_all_trainer_search_answers_per_trainer(all_trainers_run) -> None:
    top = json.loads((all_trainers_run / "top.json").read_text())
    assert set(top["per_trainer"]) == set(TRAINERS)
    for t, best in top["per_trainer"].items():
        assert best is not None and best["trainer"] == t


def test_a_search_that_finds_nothing_for_a_trainer(tmp_path, capsys) -> None:
    """DeepSpeed runs no MoE: nothing to rank, the search says why (exit 0), export says there is
    nothing to export and what to change (exit 2)."""
    run = tmp_path / "run"
    code, out, err = cli(
        [
            "search",
            "--model",
            "deepseek-v3",
            "--gpus",
            "64",
            "--space",
            "default",
            "--trainer",
            "deepspeed",
            "--run-dir",
            str(run),
        ],
        capsys,
    )
    # no valid plan is no answer: one line, exit 2, the run directory written for a look
    assert code == 2 and err.count("\n") == 1, err
    # the trainer that cannot run the model is named with its capability line's source and the fix
    assert "DeepSpeed cannot run deepseek-v3 (moe)" in err and "sharded_moe.py" in err and "--trainer megatron" in err
    top = json.loads((run / "top.json").read_text())
    assert top["top"] == [] and top["per_trainer"] == {"deepspeed": None}
    code, out, err = cli(["export", "--run", str(run), "--to", "deepspeed", "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "ranks no plan" in err and "on deepspeed" in err and "another --trainer" in err


@pytest.mark.parametrize(
    "argv,words",
    [
        (["search", "--model", "70b", "--gpus", "256", "--trainer", "dpeespeed"], ["did you mean 'deepspeed'"]),
        (
            ["estimate", "--model", "70b", "--gpus", "256", "--trainer", "dpeespeed"],
            ["--trainer", "did you mean 'deepspeed'"],
        ),
        (
            ["export", "--model", "70b", "--gpus", "256", "--to", "torchrun", "--trainer", "dpeespeed"],
            ["--trainer", "did you mean 'deepspeed'"],
        ),
        (
            ["estimate", "--model", "70b", "--gpus", "256", "--trainer", "deepspeed", "--cp", "2"],
            ["DeepSpeed cannot run context parallelism", "use --cp 1"],
        ),
        (
            ["export", "--model", "70b", "--gpus", "256", "--cp", "2", "--to", "deepspeed"],
            ["deepspeed cannot run this plan: DeepSpeed cannot run context parallelism", "use --cp 1"],
        ),
    ],
)
def test_trainer_bad_input_is_one_line_exit_2(argv, words, tmp_path, capsys) -> None:
    code, out, err = cli(argv + (["--out", str(tmp_path / "out")] if argv[0] == "export" else []), capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("autopar: error: "), err
    for w in words:
        assert w in err, err
