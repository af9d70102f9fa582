"""A normal (wheel, not editable) install runs search, validate and export from another folder.

The wheel is built from a copy of the project files (the checkout gets no build/ folder), installed
with `pip install --target` into a fresh folder, and run with PYTHONPATH = that folder + the virtual
environment's site-packages (for the dependencies), with `python -S` so that the editable install's
.pth finder is not loaded: the only autopar on the path is the installed one, and the repository is
not on it. This is what catches data files (search spaces, profiles, calibration tables, presets)
that the package reads but the wheel does not ship."""

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


@pytest.fixture(scope="module")
def elsewhere(installed, tmp_path_factory):
    """Run `python -S -m autopar ...` in a folder outside the repository, on the installed package."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    paths = sysconfig.get_paths()
    deps = dict.fromkeys([paths["purelib"], paths["platlib"]])  # the venv's site-packages, once
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTOPAR"))}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), *deps])

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
