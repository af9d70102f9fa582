"""`autopar export` end to end: a real `autopar search` run directory -> export -> files that parse
back to the ranked plan; plan flags without a run; bad input is one line and exit code 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import autopar.cli.export  # noqa: F401  (registers the command while autopar.cli._register does not)
from autopar.cli import main
from autopar.errors import InputError
from autopar.export import EXPORTERS, ExportBundle, ExportFile, get_exporter, plan_view, register
from autopar.export.source import load_run_plan

REPO = Path(__file__).resolve().parents[2]


def cli(argv, capsys) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def read_bundle(d: Path, fmt: str) -> ExportBundle:
    files = tuple(ExportFile(p.name, p.read_text()) for p in sorted(d.iterdir()))
    return ExportBundle(format=fmt, files=files, run="")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real search (8B on 16 GPUs) over the default space restricted to the 1F1B schedule."""
    d = tmp_path_factory.mktemp("search")
    space = (REPO / "search_spaces" / "default.yaml").read_text()
    space = space.replace("pp_schedule: [1f1b, zero-bubble]", "pp_schedule: [1f1b]").replace(
        "name: default", "name: export-test"
    )
    # TP overlap off: rank 1 is re-targeted to torchtitan below, which runs it only under torch.compile
    space = re.sub(r"tp_comm_overlap: \[false, true\]", "tp_comm_overlap: [false]", space)
    assert "pp_schedule: [1f1b]" in space and "tp_comm_overlap: [false]" in space
    (d / "space.yaml").write_text(space)
    run = d / "run"
    main(
        [
            "search",
            "--model",
            "llama3-8b",
            "--gpus",
            "16",
            "--space",
            str(d / "space.yaml"),
            "--run-dir",
            str(run),
            "--json",
        ]
    )
    assert (run / "top.json").is_file() and (run / "search.json").is_file()
    return run


def test_search_then_export_rank_1_to_megatron(run_dir, tmp_path, capsys) -> None:
    capsys.readouterr()
    code, out, err = cli(
        ["export", "--run", str(run_dir), "--rank", "1", "--to", "megatron", "--out", str(tmp_path)], capsys
    )
    assert code == 0, err
    d = tmp_path / "megatron"
    assert {p.name for p in d.iterdir()} == {
        "megatron_args.sh",
        "launch_torchrun.sh",
        "launch_slurm.sbatch",
        "submit_slurm.sh",
    }
    assert str(d / "megatron_args.sh") in out and "run: cd " in out
    entry = load_run_plan(run_dir, 1)
    got = get_exporter("megatron").parse(read_bundle(d, "megatron"))
    assert got == plan_view(entry.plan, entry.model)
    header = (d / "megatron_args.sh").read_text()
    assert f"produced by: autopar export --to megatron --run {run_dir} --rank 1" in header
    assert f"rank 1 of {entry.of} in {run_dir}/top.json" in header
    top = json.loads((run_dir / "top.json").read_text())["top"][0]
    from autopar.calibration.estimate import estimate

    est = estimate(
        entry.plan.with_(trainer="megatron"), entry.model, entry.cluster, num_gpus=entry.num_gpus, seq_len=entry.seq_len
    )  # re-targeted to Megatron-LM (rank 1 may be another trainer's)
    assert f"step {est.step_time_s:.3f} s" in header and f"MFU {100 * est.mfu:.1f}%" in header
    if top["trainer"] == "megatron":
        assert f"step {top['step_time_s']:.3f} s" in header and f"MFU {100 * top['mfu']:.1f}%" in header


def test_plan_flags_change_a_ranked_plan_and_re_estimate(run_dir, tmp_path, capsys) -> None:
    code, out, err = cli(
        ["export", "--run", str(run_dir), "--rank", "1", "--to", "torchtitan", "--zero", "3", "--out", str(tmp_path)],
        capsys,
    )
    assert code == 0, err
    b = read_bundle(tmp_path / "torchtitan", "torchtitan")
    entry = load_run_plan(run_dir, 1)
    assert get_exporter("torchtitan").parse(b)["zero_stage"] == (3 if entry.plan.dp * entry.plan.cp > 1 else None)
    assert "changed by --zero and re-estimated" in b.text("autopar_torchtitan.py")


def test_export_all_writes_what_each_trainer_can_run(run_dir, tmp_path, capsys) -> None:
    code, out, err = cli(
        ["export", "--run", str(run_dir), "--rank", "1", "--to", "all", "--out", str(tmp_path)], capsys
    )
    assert code == 0, err
    written = {p.name for p in tmp_path.iterdir()}
    skipped = {line.split(":")[0] for line in err.splitlines() if ": skipped, " in line}
    assert written | skipped == set(EXPORTERS) and not written & skipped
    assert "megatron" in written


def test_plan_flags_without_a_run(tmp_path, capsys) -> None:
    code, out, err = cli(
        [
            "export",
            "--model",
            "llama3-8b",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--zero",
            "1",
            "--gbs",
            "64",
            "--to",
            "deepspeed,megatron",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    cfg = json.loads((tmp_path / "deepspeed" / "ds_config.json").read_text())
    assert cfg["train_batch_size"] == 64 and cfg["train_micro_batch_size_per_gpu"] == 1
    assert cfg["gradient_accumulation_steps"] == 8 and cfg["zero_optimization"]["stage"] == 1
    assert cfg["_autopar"]["command"].startswith("autopar export --to deepspeed,megatron")


def test_help_documents_every_format_with_an_example(capsys) -> None:
    code, out, _ = cli(["export", "--help"], capsys)
    assert code == 0
    for name, e in EXPORTERS.items():
        assert f"{name}: " in out and e.example in out
    assert "autopar search --model 70b" in out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--run", "/nonexistent/run", "--to", "megatron"], "does not exist"),
        (["--run", "{run}", "--rank", "99", "--to", "megatron"], "out of range"),
        (["--run", "{run}", "--rank", "0", "--to", "megatron"], "out of range"),
        (["--run", "{run}", "--to", "megatorn"], "did you mean 'megatron'"),
        (["--run", "{run}", "--to", "megatron", "--model", "70b"], "come from the run directory"),
        (["--model", "llama3-8b", "--gpus", "16", "--rank", "2", "--to", "megatron"], "--rank needs --run"),
        (["--to", "megatron", "--tp", "2"], "--model and --gpus"),
        (["--run", "{empty}", "--to", "megatron"], "top.json' is missing"),
        (
            [
                "--model",
                "llama3-8b",
                "--gpus",
                "16",
                "--tp",
                "2",
                "--pp",
                "2",
                "--pp-schedule",
                "zero-bubble",
                "--to",
                "megatron",
            ],
            "zero-bubble",
        ),
        (["--model", "llama3-8b", "--gpus", "16", "--tp", "3", "--to", "megatron"], "do not divide"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, words, run_dir, tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    argv = [a.replace("{run}", str(run_dir)).replace("{empty}", str(tmp_path / "empty")) for a in argv]
    code, out, err = cli(["export", *argv, "--out", str(tmp_path / "out")], capsys)
    assert code == 2, (out, err)
    assert err.startswith("autopar: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_registry_refuses_duplicate_names() -> None:
    dup = type(EXPORTERS["megatron"])()
    with pytest.raises(ValueError, match="duplicate exporter name 'megatron'"):
        register(dup)
    with pytest.raises(InputError, match="unknown export format"):
        get_exporter("tensorflow")


def test_export_all_names_each_skipped_format(tmp_path, capsys) -> None:
    code, out, err = cli(
        [
            "export",
            "--model",
            "llama3-8b",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--pp",
            "2",
            "--zero",
            "3",
            "--pp-schedule",
            "zero-bubble",
            "--gbs",
            "32",
            "--to",
            "all",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    skipped = {line.split(":")[0] for line in err.splitlines() if ": skipped, " in line}
    assert skipped == {"megatron", "deepspeed", "nemo", "bridge", "torchrun", "slurm"}
    assert (
        "torchrun: skipped, megatron cannot run this plan: Megatron-LM cannot run the zero-bubble pipeline "
        "schedule (megatron/core/pipeline_parallel/schedules.py" in err
    )
    assert {p.name for p in tmp_path.iterdir()} == {"torchtitan"}


def test_the_does_not_fit_warning_is_about_memory_only(tmp_path, capsys) -> None:
    """A plan whose recipe line --recipe waives is not valid for the estimate (`fits` is False) but
    fits in memory: no warning. A plan over the GPU's memory is still warned about."""
    capsys.readouterr()
    code, _, err = cli(
        [
            "export",
            "--to",
            "nemo",
            "--model",
            "llama2-13b",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--pp",
            "2",
            "--recipe",
            "llama2_7b",
            "--out",
            str(tmp_path / "a"),
        ],
        capsys,
    )
    assert code == 0 and "predicted not to fit" not in err, err
    code, _, err = cli(
        [
            "export",
            "--to",
            "megatron",
            "--model",
            "llama3-70b",
            "--gpus",
            "8",
            "--zero",
            "0",
            "--out",
            str(tmp_path / "b"),
        ],
        capsys,
    )
    assert code == 0 and "megatron: this plan is predicted not to fit on megatron" in err, err
