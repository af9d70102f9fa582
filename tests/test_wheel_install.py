"""A normal (wheel, not editable) install runs search, validate and export from another folder.

The wheel is built from a copy of the project files (the checkout gets no build/ folder), installed
with `pip install --target` into a fresh folder, and run with PYTHONPATH = that folder + the virtual
environment's site-packages (for the dependencies), with `python -S` so that the editable install's
.pth finder is not loaded: the only autopar on the path is the installed one, and the repository is
not on it. This is what catches data files (search spaces, profiles, calibration tables, presets)
that the package reads but the wheel does not ship.

torch is an optional extra (`autopar[trial]`): the same install, with `import torch` failing as it
does where torch is not installed (sys.modules["torch"] = None before autopar starts), runs the
analytic commands, and the commands that need torch say what to install in one line, exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
#: what a wheel is built from (pyproject.toml reads README.md; setup.py maps search_spaces/)
PROJECT_FILES = ("pyproject.toml", "setup.py", "README.md", "autopar", "search_spaces")


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The folder the wheel was installed into."""
    tmp = tmp_path_factory.mktemp("wheel")
    project = tmp / "project"  # not "src": pip mistakes a bare "src" argument for a project named src
    project.mkdir()
    for name in PROJECT_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, project / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", str(project), "--no-deps", "-w", str(tmp / "dist")], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("autopar-*.whl")
    target = tmp / "target"
    _run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], cwd=tmp)
    return target


def _env(installed: Path) -> dict[str, str]:
    """PYTHONPATH = the installed package + the venv's site-packages (for the dependencies)."""
    paths = sysconfig.get_paths()
    deps = dict.fromkeys([paths["purelib"], paths["platlib"]])  # the venv's site-packages, once
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTOPAR"))}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), *deps])
    return env


@pytest.fixture(scope="module")
def elsewhere(installed, tmp_path_factory):
    """Run `python -S -m autopar ...` in a folder outside the repository, on the installed package."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    env = _env(installed)

    def run(*args: str, timeout: float = 300) -> str:
        return _run([sys.executable, "-S", *args], cwd=cwd, env=env, timeout=timeout)

    return run, cwd


def test_the_installed_package_is_the_one_imported(installed, elsewhere):
    run, _ = elsewhere
    out = run(
        "-c",
        "import sys, autopar, autopar.spaces; print(autopar.__file__); print(autopar.spaces.__file__); "
        "print(*sys.path, sep='\\n')",
    )
    package, spaces, *path = out.splitlines()
    assert Path(package).parent == installed / "autopar"
    assert Path(spaces).parent == installed / "autopar" / "spaces"
    assert str(REPO) not in path


def test_search_validate_export_from_a_wheel(elsewhere):
    run, cwd = elsewhere
    run_dir, out = cwd / "run", cwd / "export"
    run("-m", "autopar", "search", "--model", "70b", "--gpus", "256", "--run-dir", str(run_dir))
    for name in ("top.json", "search.json", "plans.parquet", "report.html"):
        assert (run_dir / name).is_file(), name
    run("-m", "autopar", "validate")
    run("-m", "autopar", "export", "--run", str(run_dir), "--rank", "1", "--to", "megatron", "--out", str(out))
    assert (out / "megatron" / "megatron_args.sh").is_file()


def test_every_data_file_is_installed(installed):
    """The files next to the code (presets, profiles, calibration tables) and the search spaces."""

    def data(root: Path) -> set[str]:
        return {
            p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
        }

    shipped = data(REPO / "autopar") | {f"spaces/{p.name}" for p in (REPO / "search_spaces").glob("*.yaml")}
    assert shipped and shipped <= data(installed / "autopar")


#: the first statement of a process where `import torch` raises ModuleNotFoundError (an ImportError),
#: as it does where torch is not installed
BLOCK_TORCH = "import sys; sys.modules['torch'] = None"
#: `python -S -c NO_TORCH ARGS...` runs `autopar ARGS...` so
NO_TORCH = BLOCK_TORCH + "; import runpy; runpy.run_module('autopar', run_name='__main__', alter_sys=True)"


@pytest.fixture(scope="module")
def without_torch(installed, tmp_path_factory):
    """Run `autopar ARGS...` (the installed package, outside the repository) without torch; the
    completed process."""
    cwd = tmp_path_factory.mktemp("without-torch")
    env = _env(installed)

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-S", "-c", NO_TORCH, *args]
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)

    return run, cwd


def test_torch_is_an_extra() -> None:
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~;\[ ]", d)[0] for d in project["dependencies"]]
    assert "torch" not in names and "optuna" in names
    assert any(re.split(r"[<>=!~;\[ ]", d)[0] == "torch" for d in project["optional-dependencies"]["trial"])


def test_the_block_is_a_missing_torch() -> None:
    code = BLOCK_TORCH + "\ntry:\n    import torch\nexcept ImportError:\n    print('missing')"
    p = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "missing", p.stderr


def test_the_analytic_commands_run_without_torch(without_torch):
    run, cwd = without_torch
    run_dir = cwd / "run"
    commands = [
        ["search", "--model", "70b", "--gpus", "256", "--run-dir", str(run_dir)],
        ["estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4"],
        ["compare", "--model", "70b", "--gpus", "256", "--tp 8 --pp 4", "--tp 4 --pp 8"],
        ["export", "--run", str(run_dir), "--rank", "1", "--to", "megatron", "--out", str(cwd / "export")],
        ["report", str(run_dir)],
        ["validate"],
        ["trainers"],
        ["models"],
        ["hardware"],
        ["trial", "--model", "tiny", "--gpus", "2", "--tp", "2", "--emit-slurm", str(cwd / "t.sbatch")],
    ]
    for args in commands:
        p = run(*args)
        assert p.returncode == 0, (
            f"autopar {' '.join(args)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        )
        assert "Traceback" not in p.stderr, p.stderr
    assert (run_dir / "report.html").is_file() and (cwd / "export" / "megatron" / "megatron_args.sh").is_file()
    assert (cwd / "t.sbatch").is_file()


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["trial", "--model", "tiny", "--gpus", "2", "--tp", "2"], "autopar trial"),
        (["probe", "--ranks", "2"], "autopar probe"),
        (["search", "--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "2"], "autopar search --trials"),
        (["calibrate", "no-such-run", "--rounds", "1"], "autopar calibrate --rounds"),
    ],
    ids=["trial", "probe", "search-trials", "calibrate-rounds"],
)
def test_the_torch_commands_say_what_to_install(without_torch, args, what):
    run, cwd = without_torch
    p = run(*args)
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    assert lines[0].startswith(f"autopar: error: {what} needs PyTorch: ") and "autopar[trial]" in lines[0], lines
    assert not (cwd / "reports").exists()  # stopped before writing anything
