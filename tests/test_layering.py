"""Layering of the autopar package.

(a) Importing autopar and running the light commands never loads torch, optuna or plotly (checked
    in a fresh subprocess, since this test process may have imported them already).
(b) An AST walk over autopar/**/*.py enforces which layers and third-party packages each layer may
    import. Imports inside functions count the same as top-level ones (a lazy import is still a
    dependency), and so do `importlib.import_module("x")` / `__import__("x")` with a literal name.

To add a layer, add a row to LAYERS (and, for a heavy dependency, to HEAVY).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "autopar"

ANY = None  # "no restriction" in LAYERS

#: layer -> (autopar layers it may import, third-party top-level packages it may import).
#: A layer is a subpackage (autopar/spec/...) or a top-level module (autopar/errors.py); `__init__`
#: is the package root, which every layer may import. The standard library is always allowed.
#: Third-party ANY still obeys HEAVY.
LAYERS: dict[str, tuple[frozenset[str] | None, frozenset[str] | None]] = {
    "__init__": (frozenset(), frozenset()),
    "__main__": (frozenset({"cli"}), frozenset()),
    "errors": (frozenset(), frozenset()),
    "secrets": (frozenset(), frozenset()),  # mask_secrets: the one masking rule of passwords
    "json_out": (frozenset({"secrets"}), frozenset()),  # dumps: the one JSON writer (strict, masked)
    "atomic": (frozenset(), frozenset()),  # write_atomic: the one atomic file write
    "quoting": (frozenset({"errors"}), frozenset()),  # values in generated scripts
    "figures": (frozenset(), frozenset()),  # Figure: every output figure's name, unit and header, declared once
    "terminal": (frozenset(), frozenset()),  # printable: the one rule of text on the terminal
    "processes": (frozenset(), frozenset()),  # start_time: a process named across pid reuse
    "forked": (frozenset({"processes"}), frozenset()),  # forked_map: one command's independent jobs on the cores
    # spec checks the names it takes that exports paste into scripts (a recipe) with quoting's rule
    "spec": (frozenset({"errors", "figures", "quoting", "spec"}), frozenset({"numpy", "yaml"})),
    "cost": (frozenset({"errors", "figures", "spec", "cost"}), frozenset({"numpy", "scipy"})),
    # the published runs, the fit, the validation and the intervals: above the physics
    "calibration": (
        frozenset({"errors", "figures", "json_out", "atomic", "spec", "cost", "calibration"}),
        frozenset({"numpy", "scipy"}),
    ),
    "search": (
        frozenset(
            {
                "errors",
                "figures",
                "secrets",
                "json_out",
                "atomic",
                "processes",
                "forked",
                "spec",
                "cost",
                "calibration",
                "search",
            }
        ),
        ANY,
    ),
    # the measured stage: torch-free, between the search and the torch trials it launches; it runs
    # the user's own trainer through that trainer's export (autopar.measured.own_run)
    "measured": (
        frozenset(
            {
                "errors",
                "figures",
                "secrets",
                "json_out",
                "atomic",
                "quoting",
                "terminal",
                "processes",
                "spec",
                "cost",
                "calibration",
                "search",
                "export",
                "measured",
            }
        ),
        ANY,
    ),
    "trial": (
        frozenset(
            {"errors", "figures", "secrets", "json_out", "atomic", "quoting", "spec", "cost", "measured", "trial"}
        ),
        ANY,
    ),
    "export": (
        frozenset(
            {
                "errors",
                "figures",
                "secrets",
                "json_out",
                "atomic",
                "quoting",
                "spec",
                "cost",
                "calibration",
                "search",
                "export",
            }
        ),
        ANY,
    ),
    "report": (
        frozenset(
            {
                "errors",
                "figures",
                "secrets",
                "json_out",
                "atomic",
                "forked",
                "spec",
                "cost",
                "calibration",
                "search",
                "report",
            }
        ),
        ANY,
    ),
    "cli": (ANY, ANY),
}

#: heavy third-party packages -> the only layers that may import them (anywhere, lazily or not)
HEAVY = {"torch": {"trial"}, "optuna": {"search", "measured"}, "plotly": {"report"}}

STDLIB = frozenset(sys.stdlib_module_names)


# ---- (a) light commands stay light ---------------------------------------------------------------

PROBE = """
import json, sys
import autopar
import autopar.cli
code = 0
try:
    autopar.cli.main({argv!r})
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
sys.stdout.flush()
print("\\nPROBE " + json.dumps({{"code": code, "heavy": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""


def _probe(argv: list[str] | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if argv is None:  # import only
        code = (
            f"import json, sys, autopar\nprint('PROBE ' + json.dumps({{'code': 0, 'heavy': "
            f"sorted(m for m in {sorted(HEAVY)!r} if m in sys.modules)}}))"
        )
    else:
        code = PROBE.format(argv=argv, heavy=sorted(HEAVY))
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[-1].removeprefix("PROBE "))


@pytest.mark.parametrize(
    "argv",
    [
        None,
        ["estimate", "--help"],
        ["estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4"],
        ["estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--json"],
        ["models"],
        ["hardware"],
    ],
    ids=["import", "estimate-help", "estimate", "estimate-json", "models", "hardware"],
)
def test_light_commands_do_not_import_heavy_packages(argv: list[str] | None) -> None:
    out = _probe(argv)
    assert out["code"] == 0, out
    assert out["heavy"] == [], f"`autopar {' '.join(argv or ['(import)'])}` imported {out['heavy']}"


# ---- (b) the import graph ------------------------------------------------------------------------


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer_of_file(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _is_autopar_submodule(name: str) -> bool:
    """Whether autopar.<name> is a module or subpackage (for `from autopar import name`)."""
    return (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name).is_dir()


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the source, at any depth."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "autopar" or (node.level and not node.module):
                # `from autopar import cost` / `from . import x`: the names may be submodules
                for a in node.names:
                    sub = f"{mod}.{a.name}"
                    top = sub.split(".")[1] if sub.count(".") >= 1 else ""
                    out.append((node.lineno, sub if top and _is_autopar_submodule(top) else mod))
            else:
                out.append((node.lineno, mod))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def violations(path: Path) -> list[str]:
    layer = _layer_of_file(path)
    allowed_layers, allowed_third = LAYERS[layer]
    module = _module_name(path)
    rel = path.relative_to(REPO)
    bad = []
    for line, name in imports_of(path.read_text(), module, path.name == "__init__.py"):
        top = name.split(".")[0]
        where = f"{rel}:{line}: imports {name}"
        if top == "autopar":
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else "__init__"
            if target == "__init__" or allowed_layers is ANY:
                continue
            if target not in allowed_layers:
                bad.append(f"{where}: layer '{layer}' may import only {sorted(allowed_layers)} of autopar")
        elif top in STDLIB or not top:
            continue
        elif top in HEAVY:
            if layer not in HEAVY[top]:
                bad.append(f"{where}: {top} may be imported only under autopar/{'|'.join(sorted(HEAVY[top]))}/")
        elif allowed_third is not ANY and top not in allowed_third:
            bad.append(f"{where}: layer '{layer}' may import only the stdlib and {sorted(allowed_third)}")
    return bad


FILES = _files()


def test_trial_checks_and_emits_without_torch(tmp_path: Path) -> None:
    """`autopar trial` validates the plan (autopar.measured.features) and writes an sbatch script
    without loading torch: only the trial processes it launches need it."""
    out = _probe(["trial", "--model", "tiny", "--gpus", "2", "--tp", "2", "--emit-slurm", str(tmp_path / "t.sbatch")])
    assert out["code"] == 0, out
    assert "torch" not in out["heavy"]
    assert (tmp_path / "t.sbatch").exists()


def test_every_layer_is_declared() -> None:
    undeclared = sorted({_layer_of_file(p) for p in FILES} - set(LAYERS))
    assert not undeclared, f"add these to LAYERS in tests/test_layering.py: {undeclared}"


def test_layer_table_matches_the_design() -> None:
    assert LAYERS["spec"][1] == {"numpy", "yaml"}
    assert LAYERS["cost"][1] == {"numpy", "scipy"}
    assert not LAYERS["cost"][0] & {"search", "trial", "report", "export", "cli"}
    assert LAYERS["search"][0] >= {"spec", "cost"} and LAYERS["trial"][0] >= {"spec", "cost"}
    assert LAYERS["export"][0] >= {"spec", "cost", "search"}
    assert LAYERS["report"][0] >= {"spec", "cost", "search"}
    assert LAYERS["cli"] == (ANY, ANY)


def test_the_walk_sees_spec_and_cost() -> None:
    layers = {_layer_of_file(p) for p in FILES}
    assert {"spec", "cost", "cli", "errors"} <= layers


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(PACKAGE)) for p in FILES])
def test_imports_respect_layers(path: Path) -> None:
    if _layer_of_file(path) not in LAYERS:
        pytest.skip("undeclared layer (see test_every_layer_is_declared)")
    bad = violations(path)
    assert not bad, "\n".join(bad)


def test_heavy_packages_only_in_their_layer() -> None:
    """torch only under autopar/trial/, optuna only under autopar/search/, plotly only under
    autopar/report/."""
    bad = []
    for path in FILES:
        layer = _layer_of_file(path)
        for line, name in imports_of(path.read_text(), _module_name(path), path.name == "__init__.py"):
            top = name.split(".")[0]
            if top in HEAVY and layer not in HEAVY[top]:
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {name}")
    assert not bad, "\n".join(bad)


def _module_file(name: str) -> Path | None:
    """The file of module autopar.x.y (x/y.py or x/y/__init__.py), or None (a name, not a module)."""
    base = REPO.joinpath(*name.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


def _autopar_modules_imported(path: Path) -> set[str]:
    """The autopar modules a file imports (at any depth), with `from autopar.x import y` as
    autopar.x.y when y is a module, and the packages above each (importing a module runs them)."""
    names = {n for _, n in imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names |= {f"{node.module}.{a.name}" for a in node.names}
    out = set()
    for name in names:
        parts = name.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[0] == "autopar"}
    return {n for n in out if _module_file(n)}


def test_the_autopar_process_reaches_no_torch() -> None:
    """torch is an optional extra: no module the `autopar` command can import (following every
    autopar import from autopar/cli/, lazy ones too) imports torch. Only the trial processes do
    (autopar.trial.worker under torchrun, autopar.trial.probe), started by `python -m`, not imported."""
    start = [_module_name(p) for p in FILES if _layer_of_file(p) in ("cli", "__main__")]
    via: dict[str, str | None] = dict.fromkeys(start)
    todo = list(start)
    while todo:
        mod = todo.pop()
        for dep in sorted(_autopar_modules_imported(_module_file(mod))):
            if dep not in via:
                via[dep] = mod
                todo.append(dep)
    assert "autopar.measured.launcher" in via and "autopar.measured.measure" in via  # the walk follows lazy imports
    bad = []
    for mod in sorted(via):
        path = _module_file(mod)
        for line, name in imports_of(path.read_text(), mod, path.name == "__init__.py"):
            if name.split(".")[0] == "torch":
                chain, m = [], mod
                while m is not None:
                    chain.append(m)
                    m = via[m]
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {name} (reached by {' <- '.join(chain)})")
    assert not bad, "\n".join(bad)


# ---- the checker itself --------------------------------------------------------------------------


def test_checker_sees_lazy_relative_and_dynamic_imports() -> None:
    src = """
import numpy as np
from . import layout
from .model import ModelSpec
from .. import cost
from ..search.space import x
from autopar import errors
def f():
    import torch
    from optuna.samplers import TPESampler
    import importlib
    importlib.import_module("plotly.graph_objects")
    __import__("pandas")
class C:
    def g(self):
        from autopar.cli import app
"""
    found = {name for _, name in imports_of(src, "autopar.spec.rules", is_package=False)}
    assert {
        "numpy",
        "autopar.spec.layout",
        "autopar.spec.model",
        "autopar.cost",
        "autopar.search.space",
        "autopar.errors",
        "torch",
        "optuna.samplers",
        "importlib",
        "plotly.graph_objects",
        "pandas",
        "autopar.cli",
    } <= found, found


def test_checker_flags_a_cost_module_importing_cli(tmp_path: Path) -> None:
    src = "def f():\n    from autopar.cli import app\n    import torch\n    import pandas\n"
    found = {name for _, name in imports_of(src, "autopar.cost.x", is_package=False)}
    allowed, third = LAYERS["cost"]
    assert "autopar.cli" in found and "cli" not in allowed
    assert "torch" in found and "cost" not in HEAVY["torch"]
    assert "pandas" in found and "pandas" not in third
