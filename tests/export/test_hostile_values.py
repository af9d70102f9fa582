"""Hostile values in generated scripts: every export format and `autopar trial --emit-slurm` either
refuse a value in one line (exit 2), or write scripts that are then RUN (bash, with stub srun /
torchrun / python / scontrol first on PATH; Python files executed with stub trainer packages; TOML
and JSON parsed) without executing anything the value smuggled in: no marker file appears, and the
stubs receive the value intact as one argument where it is passed through (#SBATCH options as
sbatch reads them, srun's --container-image, the trial's --spec / --out paths).

The CLI runs in-process; a value costs well under a second (scripts included)."""

from __future__ import annotations

import json
import keyword
import tomllib
import unicodedata
from pathlib import Path

import pytest
from script_runner import Stubs, check_python_shape, fake_sbatch, run_python, run_scripts, sbatch_options

from autopar.cli import main

pytestmark = [pytest.mark.slow]  # each value runs the written scripts under stubs: about 12 s

MARK = "pwned"  # every injection below tries to create a file of this name

HOSTILE = [
    ("newline", f"a\ntouch {MARK}"),
    ("carriage-return", f"a\rtouch {MARK}"),
    ("tab", f"a\ttouch {MARK}"),
    ("nul", f"a\x00touch {MARK}"),
    ("line-separator", f"a\u2028touch {MARK}"),
    ("bidi-override", f"a\u202etouch {MARK}"),
    ("semicolon", f"x; touch {MARK}"),
    ("command-substitution", f"$(touch {MARK})"),
    ("backticks", f"`touch {MARK}`"),
    ("single-quotes", f"x' ; touch {MARK} ; echo 'y"),
    ("double-quotes", f'x" ; touch {MARK} ; echo "y'),
    ("backslash-end", "trailing\\"),
    ("backslash-quote", f"a\\'; touch {MARK}; #"),
    ("hash", f"# touch {MARK}"),
    ("redirect", f">{MARK}"),
    ("pipe-and", f"|touch {MARK}&&touch {MARK}"),
    ("ifs", f"${{IFS}}touch${{IFS}}{MARK}"),
    ("glob-home", "* ~root $HOME"),
    ("sbatch-option", f"gpu --wrap=touch {MARK}"),
    ("sbatch-comment", f"gpu # --wrap=touch {MARK}"),
    ("python-quote", f"'); open('{MARK}', 'w'); ('"),
    ("python-triple", f'"""; open("{MARK}", "w"); """'),
    ("toml-key", f'x"\nname = "{MARK}'),
    ("unicode", "训练-ジョブ-é-🚀"),
    ("lone-surrogate", "a\udc80b"),
    ("long", "L" * 5000),
    ("dash", "--help"),
]
IDS = [i for i, _ in HOSTILE]
VALUES = [v for _, v in HOSTILE]


def has_control(value: str) -> bool:
    """Characters no generated script can hold safely: controls, line separators, bidi marks."""
    return any(
        unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")
        or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f"
        for c in value
    )


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`autopar ARGV` in-process: (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_refusal(code: int, err: str) -> None:
    """Exit 2 and one short `autopar: error:` line, no traceback."""
    assert code == 2, err
    assert err.startswith("autopar: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and len(err) < 800, err[:800]


def assert_nothing_ran(root: Path) -> None:
    """No injected command ran: no marker file anywhere under `root`."""
    hits = [p for p in root.rglob("*") if p.name == MARK]
    assert not hits, f"a value was executed: {hits}"


def model_file(tmp: Path, name: str) -> Path:
    """A small Llama-shaped model file whose `name:` is the value (written as a YAML string)."""
    p = tmp / "model.yaml"
    try:
        quoted = json.dumps(name, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: written as a \u escape, which YAML decodes to it
        quoted = json.dumps(name).encode()
    p.write_bytes(b"name: " + quoted + b"\n" + MODEL_FIELDS)
    return p


MODEL_FIELDS = (
    b"num_layers: 4\nhidden_size: 128\nffn_hidden_size: 352\nnum_attention_heads: 4\nnum_kv_heads: 2\n"
    b"head_dim: 32\nvocab_size: 512\nseq_len: 128\n"
)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Stubs:
    """The recording launch commands, shared by the module's tests."""
    return Stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture(autouse=True)
def _fresh_log(stubs):
    """Each test sees only its own stub calls."""
    stubs.reset()


PLAN = ["--gpus", "16", "--tp", "2", "--zero", "2", "--gbs", "64"]
TITAN_03 = "torchtitan.models.llama3.config_registry:llama3_8b"


def run_exports(root: Path, stubs: Stubs) -> list[list[str]]:
    """Run every launch script under `root` (one export directory per format), execute its Python
    files, parse its TOML / JSON and check its override lines; the #SBATCH options sbatch would read."""
    scripts, python, sbatch_opts = [], [], []
    for f in sorted(root.glob("*/*")):
        if f.suffix == ".sbatch":
            sbatch_opts.append(sbatch_options(f.read_text(encoding="utf-8")))
            scripts.append(f)
        elif f.name.startswith("launch") and f.suffix == ".sh":
            scripts.append(f)
        elif f.suffix == ".py":
            check_python_shape(f)
            python.append(f)
        elif f.suffix == ".toml":
            tomllib.loads(f.read_text(encoding="utf-8"))
        elif f.suffix == ".json":
            json.loads(f.read_text(encoding="utf-8"))
        elif f.suffix == ".txt":
            body = [ln for ln in f.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
            assert all("=" in ln and MARK not in ln for ln in body), f
    r = run_scripts(scripts, stubs)
    assert r.returncode == 0, r.stderr[-2000:]
    if python:
        r = run_python(python, root)
        assert r.returncode == 0, r.stderr[-2000:]
    return sbatch_opts


def check_passed_through(value: str, sbatch_opts: list[list[str]], stubs: Stubs, flags: tuple[str, ...]) -> None:
    """Each #SBATCH option of `flags` and srun's container image arrive as one intact argument."""
    assert sbatch_opts
    for opts in sbatch_opts:
        for flag in flags:
            assert f"--{flag}={value}" in opts, (flag, opts)
    images = [a for call in stubs.calls("srun") for a in call if a.startswith("--container-image=")]
    assert images and all(a == f"--container-image={value}" for a in images), images
    assert stubs.calls("torchrun") or stubs.calls("python")  # the launches reached the trainer


@pytest.mark.parametrize("value", VALUES, ids=IDS)
def test_export_slurm_options_and_model_name(value: str, tmp_path, stubs, capsys) -> None:
    """Every format (`--to all`): the value as job name, partition, account, container image and
    the model file's name; then torchtitan <= 0.2.2 (TOML) under torchrun and SLURM with --time too."""
    name = value[:64]
    opts = ["--job-name", value, "--partition", value, "--account", value, "--container-image", value]
    common = ["export", "--model", model_file(tmp_path, name), *PLAN, *opts, "--recipe", "llama3_8b"]
    code, out, err = cli([*common, "--to", "all", "--torchtitan-base", TITAN_03, "--out", tmp_path / "all"], capsys)
    if has_control(value) or has_control(name) or len(value) > 256:  # SLURM names: 256 characters at most
        assert_one_line_refusal(code, err)
        assert not (tmp_path / "all").exists()
        return
    assert code == 0, err
    dirs = sorted(p for p in (tmp_path / "all").iterdir())
    assert {d.name for d in dirs} == {"megatron", "torchtitan", "deepspeed", "nemo", "bridge", "torchrun", "slurm"}
    sbatch_opts = run_exports(tmp_path / "all", stubs)
    check_passed_through(value, sbatch_opts, stubs, ("job-name", "partition", "account"))
    header = (tmp_path / "all" / "megatron" / "launch_torchrun.sh").read_text(encoding="utf-8")
    assert f"# model:      {name} (" in header
    stubs.reset()
    code, out, err = cli(
        [
            *common,
            "--time",
            value,
            "--trainer",
            "torchtitan",
            "--to",
            "torchtitan,torchrun,slurm",
            "--torchtitan-version",
            "0.2.2",
            "--torchtitan-base",
            "llama3:8B",
            "--out",
            tmp_path / "toml",
        ],
        capsys,
    )
    if code == 2 and "--time" in err:  # a time limit may be checked for its format
        assert_one_line_refusal(code, err)
    else:
        assert code == 0, err
        sbatch_opts = run_exports(tmp_path / "toml", stubs)
        check_passed_through(value, sbatch_opts, stubs, ("job-name", "partition", "account", "time"))
    assert_nothing_ran(tmp_path)


RECIPES = [
    f"llama3_70b; touch {MARK}",
    "llama3_70b\nimport os",
    "llama3-70b",
    "nemo.llama3_70b",
    "class",
    "",
    "llama3_70b as x; import os",
    "9lives",
    "ll\u0430ma",
]  # the last has a Cyrillic a


NOT_NAMES = [(i, v) for i, v in HOSTILE if not v.isidentifier()] + [(f"recipe-{i}", v) for i, v in enumerate(RECIPES)]


@pytest.mark.parametrize("value", [v for _, v in NOT_NAMES], ids=[i for i, _ in NOT_NAMES])
def test_recipe_and_module_names_must_be_identifiers(value: str, tmp_path, capsys) -> None:
    """--recipe (pasted into a Python import and a command) and --torchtitan-base module:function
    (a Python import) take Python names only; anything else is one line, and nothing is written."""
    base = ["export", "--model", "llama3-8b", *PLAN, "--out", tmp_path / "out"]
    code, _, err = cli([*base, "--to", "nemo,bridge", "--recipe", value], capsys)
    assert_one_line_refusal(code, err)
    module_ok = bool(value) and all(
        p.isidentifier() and p.isascii() and not keyword.iskeyword(p) for p in value.split(".")
    )
    for given in ([] if module_ok else [f"{value}:llama3_8b"]) + [f"torchtitan.models.llama3.config_registry:{value}"]:
        code, _, err = cli([*base, "--to", "torchtitan", "--torchtitan-base", given], capsys)
        assert_one_line_refusal(code, err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "value",
    [f"o\ntouch {MARK}", f"o\r{MARK}", f"o\u2028{MARK}", f"$(touch {MARK})"],
    ids=["newline", "carriage-return", "line-separator", "substitution"],
)
def test_a_hostile_out_path_stays_inside_its_comment(value: str, tmp_path, stubs, capsys) -> None:
    """The header's `produced by:` line echoes the command, --out included: a line break in it is
    escaped, so every script still runs clean and the header stays one comment line per field."""
    out = tmp_path / value
    code, _, err = cli(["export", "--model", "llama3-8b", *PLAN, "--to", "all", "--out", out], capsys)
    if code == 2:  # a path with a line break may be refused outright
        assert_one_line_refusal(code, err)
        return
    assert code == 0, err
    run_exports(out, stubs)
    for f in out.glob("*/*"):
        lines = [ln for ln in f.read_text(encoding="utf-8").splitlines() if MARK in ln]
        if f.suffix != ".json":  # the path shows in the header's comment lines only
            assert lines and all(ln.startswith("# ") for ln in lines), (f, lines)
    assert_nothing_ran(tmp_path)


@pytest.mark.parametrize("value", VALUES, ids=IDS)
def test_trial_emit_slurm(value: str, tmp_path, stubs, capsys) -> None:
    """`autopar trial --emit-slurm`: the model file's name, the run directory and the script's path
    carry the value; the job script (the export's #SBATCH renderer) hands the worker its run and
    result files intact, or the value is refused in one line and nothing is written."""
    part = value[:100]
    safe_path = "/" not in part and "\x00" not in part
    run_dir = tmp_path / "runs" / (part if safe_path else "r")
    script = tmp_path / "jobs" / ((part if safe_path else "j") + ".sbatch")
    script.parent.mkdir()
    code, out, err = cli(
        [
            "trial",
            "--model",
            model_file(tmp_path, value[:64]),
            "--gpus",
            "2",
            "--tp",
            "2",
            "--emit-slurm",
            script,
            "--run-dir",
            run_dir,
        ],
        capsys,
    )
    if (safe_path and has_control(part)) or (code == 2 and has_control(value)):
        # a path with a line break cannot go into the script; a control character in the model
        # name (written to JSON only) may be refused by the model file's checks
        assert_one_line_refusal(code, err)
        assert not list(script.parent.iterdir())
        return
    assert code == 0, err
    opts, r = fake_sbatch(script, stubs)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--job-name=autopar-trial" in opts and "--nodes=1" in opts
    [argv] = stubs.calls("python")
    spec, result = argv[argv.index("--spec") + 1], argv[argv.index("--out") + 1]
    assert spec == str(script.with_suffix(".run.json").resolve())
    assert Path(result).parent == (run_dir / "trials").resolve()
    assert json.loads(Path(spec).read_text())["trials"][0]["model"]["name"] == value[:64]
    assert_nothing_ran(tmp_path)
