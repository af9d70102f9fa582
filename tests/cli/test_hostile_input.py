"""Hostile and clumsy input (issue 15): every case exits 2 with one line `autopar: error: ...` that
names the option or field and the value, before any work is done, and leaves nothing half-made.
Run in this process (tests/cli/conftest.py); the cases that need a real process are in
tests/search/test_interrupt.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 9)}]" for i in range(1, 10)]
)
TINY = (
    "num_layers: {layers}\nhidden_size: 64\nffn_hidden_size: 128\nnum_attention_heads: 4\nnum_kv_heads: 4\n"
    "head_dim: 16\nvocab_size: 100\nseq_len: 128\n"
)
FILES = {
    "afile": "not a directory\n",
    "lots.yaml": "gpu:\n  base: h100-sxm\n  hbm_gib: lots\n",
    "gpn0.yaml": "gpu: h100-sxm\ngpus_per_node: 0\n",
    "huge_layers.yaml": TINY.format(layers=10**23),
    "model_bomb.yaml": BOMB + "\nnum_layers: *j\n",
    "cluster_bomb.yaml": BOMB + "\ngpu: *j\n",
    "gpu_name_bomb.yaml": BOMB + "\ngpu:\n  base: h100-sxm\n  name: *j\n",
    "recursive.yaml": "gpu: &g [*g]\n",
    "name_newline.yaml": TINY.format(layers=4) + 'name: "evil\\ntouch X"\n',
}
S = ["search", "--model", "tiny", "--gpus", "8", "--run-dir", "{tmp}/run"]
T = ["trial", "--model", "tiny", "--gpus", "1", "--run-dir", "{tmp}/trials"]
X = ["export", "--to", "megatron", "--model", "tiny", "--gpus", "8", "--out", "{tmp}/export"]
E = ["estimate", "--model", "tiny", "--gpus", "8"]

# (id, argv, substrings the line must hold, substrings it must not hold)
CASES = [
    (
        "search-gpus-overflow",
        ["search", "--model", "tiny", "--gpus", "99999999999999999999"],
        ["--gpus", "99999999999999999999"],
        [],
    ),
    ("search-gpus-empty", ["search", "--model", "tiny", "--gpus", ""], ["--gpus", "empty"], []),
    ("search-gpu-trailing-comma", S + ["--gpu", "h100-sxm,"], ["--gpu", "'h100-sxm,'", "empty item"], []),
    ("search-gbs-list-not-numbers", S + ["--gbs", "512,x"], ["--gbs", "'x'"], []),
    ("search-trials-negative", S + ["--trials", "-1"], ["--trials -1"], []),
    ("search-seed-negative", S + ["--seed", "-1"], ["--seed -1"], []),
    ("search-top-k-zero", S + ["--top-k", "0"], ["--top-k 0"], ["--n-trials"]),
    ("search-n-trials-zero", S + ["--n-trials", "0"], ["--n-trials 0"], ["--top-k"]),
    ("search-max-exhaustive-negative", S + ["--max-exhaustive", "-5"], ["--max-exhaustive -5"], []),
    ("search-seq-len-zero", S + ["--seq-len", "0"], ["--seq-len 0"], ["--gpus"]),
    ("search-trial-timeout-nan", S + ["--trial-timeout", "nan"], ["--trial-timeout", "nan"], []),
    (
        "search-run-dir-is-a-file",
        ["search", "--model", "tiny", "--gpus", "8", "--run-dir", "{tmp}/afile"],
        ["afile", "not a directory"],
        [],
    ),
    (
        "search-run-dir-under-a-file",
        ["search", "--model", "tiny", "--gpus", "8", "--run-dir", "{tmp}/afile/sub"],
        ["afile"],  # the path is quoted up to a length: a long temporary folder cuts its end
        [],
    ),
    (
        # a --gbs the user gave is refused; the default adapts (tests/cli/test_answers_read_well.py)
        "search-405b-given-gbs",
        ["search", "--model", "405b", "--gpus", "24576", "--gbs", "512", "--run-dir", "{tmp}/run"],
        ["--gbs 512", "cannot be split", "576"],
        [],
    ),
    ("probe-ranks-negative", ["probe", "--ranks", "-2", "--out", "{tmp}/p.yaml"], ["--ranks -2"], []),
    (
        "probe-ranks-more-than-the-machine",
        ["probe", "--ranks", "4096", "--out", "{tmp}/p.yaml"],
        ["--ranks 4096", "cpu cores"],
        [],
    ),
    ("probe-out-under-a-file", ["probe", "--out", "{tmp}/afile/p.yaml"], ["--out", "afile"], []),
    ("export-master-port-0", X + ["--master-port", "0"], ["--master-port 0"], []),
    ("export-master-port-99999", X + ["--master-port", "99999"], ["--master-port 99999"], []),
    ("export-time-banana", X + ["--time", "banana"], ["--time", "banana"], []),
    ("export-out-under-a-file", X[:-1] + ["{tmp}/afile/x"], ["--out", "afile"], []),
    (
        "validate-write-profile-without-fit",
        ["validate", "--write-profile", "{tmp}/x.yaml"],
        ["--write-profile", "--fit"],
        ["--write-profiles"],
    ),
    (
        "validate-write-profile-unwritable",
        ["validate", "--fit", "--write-profile", "{tmp}/afile/x.yaml"],
        ["--write-profile", "afile"],
        [],
    ),
    ("validate-runs-binary", ["validate", "--runs", "{tmp}/binary.csv"], ["binary.csv"], []),
    ("trial-steps-zero", T + ["--steps", "0"], ["--steps 0"], []),
    ("trial-node-rank-too-large", T + ["--node-rank", "3"], ["--node-rank 3", "--nnodes"], []),
    ("trial-proxy-width-past-the-model", T + ["--proxy-width", "16384"], ["--proxy-width 16384", "at most 128"], []),
    (
        "model-not-a-regular-file",
        ["estimate", "--model", "/dev/null", "--gpus", "8"],
        ["/dev/null", "regular file"],
        [],
    ),
    ("trial-emit-slurm-unwritable", T + ["--emit-slurm", "{tmp}/afile/x.sbatch"], ["--emit-slurm", "afile"], []),
    ("trial-405b-on-2-ranks", ["trial", "--model", "405b", "--gpus", "2"], ["GiB per rank", "--proxy-layers"], []),
    (
        "trial-405b-gpu-prediction",
        ["trial", "--model", "405b", "--gpus", "2", "--gpu", "h100-sxm"],
        ["GiB per rank", "--proxy-layers"],
        [],
    ),
    ("cluster-hbm-lots", E + ["--cluster", "{tmp}/lots.yaml"], ["lots.yaml", "hbm_gib", "'lots'"], []),
    (
        "cluster-gpus-per-node-0",
        E + ["--cluster", "{tmp}/gpn0.yaml"],
        ["gpn0.yaml", "gpus_per_node", "0"],
        ["--gpus-per-node"],
    ),
    ("flag-gpus-per-node-0", E + ["--gpus-per-node", "0"], ["--gpus-per-node", "0"], []),
    (
        "model-layers-1e23",
        ["estimate", "--model", "{tmp}/huge_layers.yaml", "--gpus", "8"],
        ["num_layers", "100000000000000000000000"],
        [],
    ),
    ("model-alias-bomb", ["estimate", "--model", "{tmp}/model_bomb.yaml", "--gpus", "8"], ["alias"], ["lol"]),
    ("cluster-alias-bomb", E + ["--cluster", "{tmp}/cluster_bomb.yaml"], ["alias"], ["lol"]),
    ("gpu-name-alias-bomb", E + ["--cluster", "{tmp}/gpu_name_bomb.yaml"], ["alias"], ["lol"]),
    ("recursive-alias", E + ["--cluster", "{tmp}/recursive.yaml"], ["itself"], []),
    (
        "pp-first-100",
        ["estimate", "--model", "llama3-70b", "--gpus", "256", "--pp", "4", "--pp-first", "100"],
        ["--pp-first 100", "80 layers"],
        ["-20"],
    ),
    (
        "model-name-too-long",
        ["estimate", "--model", "x" * 5000, "--gpus", "8"],
        ["unknown model", "more characters"],
        [],
    ),
    # empty values and arguments: `--run-dir ''` would be the current directory
    ("run-dir-empty", ["search", "--model", "tiny", "--gpus", "8", "--run-dir", ""], ["--run-dir ''", "empty"], []),
    ("job-name-blank", X + ["--job-name", " "], ["--job-name", "empty"], []),
    ("option-equals-empty", E + ["--gpu="], ["--gpu ''", "empty"], []),
    ("report-empty-argument", ["report", ""], ["empty argument", "'report'"], []),
    # a password that a line break or a space would hide from the masking is refused without echo
    (
        "storage-newline",
        S + ["--storage", "postgresql://u:secret\n@127.0.0.1:1/db"],
        ["--storage", "line break"],
        ["secret"],
    ),
    ("storage-space", S + ["--storage", "postgresql://u:sec ret@127.0.0.1:1/db"], ["--storage", "space"], ["sec"]),
    ("study-name-newline", S + ["--study-name", "a\nb"], ["--study-name", "'a\\nb'", "one line"], []),
    ("trainer-empty-item", S + ["--trainer", "megatron,,nemo"], ["--trainer", "'megatron,,nemo'", "empty item"], []),
    ("export-to-empty-item", X + ["--to", "megatron,,"], ["--to", "'megatron,,'", "empty item"], []),
    (
        "export-torchtitan-base-when-skipped",
        [
            "export",
            "--to",
            "all",
            "--model",
            "tiny",
            "--gpus",
            "8",
            "--out",
            "{tmp}/export",
            "--torchtitan-base",
            "a:b;touch X",
        ],
        ["--torchtitan-base", "b;touch X"],
        [],
    ),
    ("export-job-name-too-long", X + ["--job-name", "j" * 5000], ["--job-name", "too long", "256"], []),
    (
        "export-torchtitan-version-quoted",
        X + ["--torchtitan-version", "v" * 500],
        ["--torchtitan-version", "more characters"],
        [],
    ),
    # measured-stage options that would be ignored
    ("rounds-without-trials", S + ["--rounds", "3"], ["--rounds", "--trials"], []),
    ("trial-budget-without-trials", S + ["--trial-budget", "3"], ["--trial-budget", "--trials"], []),
    ("no-proxy-without-trials", S + ["--no-proxy"], ["--no-proxy", "--trials"], []),
    (
        "sbatch-args-without-slurm",
        S + ["--trials", "1", "--sbatch-args", "--partition=gpu"],
        ["--sbatch-args", "--launcher slurm"],
        [],
    ),
    (
        "pp-layout-and-pp-first",
        E + ["--pp", "2", "--pp-layout", "2,2", "--pp-first", "1"],
        ["--pp-layout '2,2'", "--pp-first 1"],
        [],
    ),
    (
        "model-name-newline",
        ["estimate", "--model", "{tmp}/name_newline.yaml", "--gpus", "8"],
        ["'name'", "one line", "'evil\\ntouch X'"],
        [],
    ),
]


def _files(tmp: Path) -> None:
    for name, text in FILES.items():
        (tmp / name).write_text(text)
    (tmp / "binary.csv").write_bytes(bytes(range(256)) * 8)


@pytest.mark.parametrize("argv,needles,absent", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2(cli_run, one_line_error, tmp_path, argv, needles, absent):
    _files(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    line = one_line_error(cli_run(*args), needles, absent)
    assert len(line) < 500, line
    # refused before any work: nothing written
    for made in ("run", "p.yaml", "export", "trials", "x.yaml"):
        assert not (tmp_path / made).exists(), f"{made} was written before the refusal"


def test_a_huggingface_folder_is_a_model(cli_run, tmp_path):
    folder = tmp_path / "Llama-Mini"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 512,
            }
        )
    )
    r = cli_run("estimate", "--model", folder, "--gpus", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"] == "Llama-Mini"


def test_a_folder_without_config_json_is_one_line(cli_run, one_line_error, tmp_path):
    one_line_error(cli_run("estimate", "--model", tmp_path, "--gpus", "2"), ["config.json"])


def test_a_failed_storage_leaves_no_run_directory(cli_run, one_line_error, tmp_path):
    run = tmp_path / "deep" / "run"
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
        "--storage",
        "postgresql+psycopg2://nobody:secret@127.0.0.1:1/none",
        "--run-dir",
        run,
    )
    one_line_error(r, ["storage", "127.0.0.1:1"], ["secret"])
    assert not (tmp_path / "deep").exists()


@pytest.fixture
def read_only_dir(tmp_path) -> Path:
    """A directory no file can be created in: mode 555, or (root ignores modes) /sys."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    try:
        (Path("/sys") / "autopar-probe").mkdir()
    except OSError:
        yield Path("/sys")
        return
    pytest.skip("no read-only directory to test with")


def test_a_read_only_run_dir_is_one_line(cli_run, one_line_error, read_only_dir):
    one_line_error(
        cli_run("search", "--model", "tiny", "--gpus", "8", "--run-dir", read_only_dir / "run"),
        ["cannot write the run directory"],
    )
    one_line_error(
        cli_run("search", "--model", "tiny", "--gpus", "8", "--run-dir", read_only_dir),
        ["cannot write the run directory"],
    )
    one_line_error(cli_run(*X[:-1], read_only_dir / "x"), ["--out", "cannot be written"])


@pytest.fixture(scope="module")
def tiny_run(cli_run, tmp_path_factory) -> Path:
    """A finished exhaustive search of the tiny model (no trials)."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    r = cli_run("search", "--model", "tiny", "--gpus", "8", "--run-dir", run, "--json")
    assert r.returncode == 0, r.stderr
    return run


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "{run}", "--out", "{tmp}/afile/r.html"],
        ["compare", "{run}", "--tp 1", "--out", "{tmp}/afile/c.html"],
        ["export", "--to", "megatron", "--run", "{run}", "--out", "{tmp}/afile/x"],
    ],
    ids=["report", "compare", "export"],
)
def test_an_unwritable_out_is_one_line(cli_run, one_line_error, tiny_run, tmp_path, argv):
    (tmp_path / "afile").write_text("a file\n")
    args = [a.replace("{run}", str(tiny_run)).replace("{tmp}", str(tmp_path)) for a in argv]
    one_line_error(cli_run(*args), ["--out", "afile"])


def test_compare_rank_0_is_out_of_range(cli_run, one_line_error, tiny_run):
    one_line_error(cli_run("compare", f"{tiny_run}#0", tiny_run), ["'#0' is out of range", "#1"])


def test_a_run_of_another_schema_is_refused_by_export_and_compare(cli_run, one_line_error, tiny_run, tmp_path):
    import shutil

    run = tmp_path / "future"
    shutil.copytree(tiny_run, run)
    search = json.loads((run / "search.json").read_text())
    (run / "search.json").write_text(json.dumps(search | {"schema_version": 999}))
    one_line_error(
        cli_run("export", "--to", "megatron", "--run", run, "--out", tmp_path / "x"), ["another autopar", "999"]
    )
    one_line_error(cli_run("compare", run, tiny_run), ["another autopar", "999"])
    assert not (tmp_path / "x").exists()


def test_json_nested_past_the_stack_is_one_line(cli_run, one_line_error, tiny_run, tmp_path):
    import shutil

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "plan.json").write_text(deep)
    one_line_error(cli_run("compare", tmp_path / "plan.json", tiny_run), ["plan.json", "corrupt", "plan JSON"])
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "top.json").write_text(deep)
    one_line_error(
        cli_run("export", "--to", "megatron", "--run", run, "--out", tmp_path / "x"),
        ["top.json", "corrupt", "rerun `autopar search`"],
    )
    one_line_error(cli_run("report", run, "--out", tmp_path / "r.html"), ["top.json", "corrupt"])


def test_trial_files_nested_past_the_stack_are_skipped(cli_run, one_line_error, tiny_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "trials").mkdir()
    (run / "trials" / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (run / "trials" / "number.json").write_text("5")
    one_line_error(cli_run("calibrate", run), ["fewer than 2", "trials"])
    r = cli_run("report", run, "--out", tmp_path / "r.html")  # the bad files are listed, not fatal
    assert r.returncode == 0, r.stderr


def test_calibrate_without_trials_rewrites_nothing(cli_run, one_line_error, tiny_run):
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tiny_run.iterdir() if p.is_file()}
    one_line_error(cli_run("calibrate", tiny_run), ["fewer than 2", "trials"])
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tiny_run.iterdir() if p.is_file()}
    assert after == before


def test_a_run_directory_of_another_model_is_refused(cli_run, one_line_error, tmp_path):
    run = tmp_path / "run"
    opts = ["--gpus", "8", "--max-exhaustive", "0", "--n-trials", "4", "--run-dir", run]
    assert cli_run("search", "--model", "tiny", *opts).returncode == 0
    one_line_error(cli_run("search", "--model", "llama3-8b", *opts), ["another question", "tiny", "--run-dir"])
    r = cli_run("search", "--model", "tiny", *opts)  # the same question resumes its study
    assert r.returncode == 0, r.stderr


def _autopar(*args, **kw):
    """`python -m autopar ARGS` in a fresh process (stdout and stderr captured unless given)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""), **kw.pop("env", {}))
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    return subprocess.run(
        [sys.executable, "-m", "autopar", *map(str, args)], env=env, text=True, timeout=120, check=False, **kw
    )


def test_output_the_terminal_cannot_encode_is_escaped(tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text(TINY.format(layers=4) + 'name: "модель-🚀"\n', encoding="utf-8")
    r = _autopar("estimate", "--model", model, "--gpus", "2", env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "\\u043c" in r.stdout


def test_a_closed_stdout_is_no_traceback():
    import subprocess

    r = _autopar("models", stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
