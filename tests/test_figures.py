"""Every output figure is declared once (autopar/figures.py), and nothing else in autopar spells its
name: the columns, JSON keys, tables and report take the figure from the declaration."""

from __future__ import annotations

import ast
import copy
import importlib.util
import io
import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd

from autopar import figures
from autopar.figures import FIGURES, INTERVAL_FIGURES

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "autopar"
DECLARATION = PACKAGE / "figures.py"
#: the family prefixes and interval suffixes a name may be built from in an f-string
PREFIXES = ("time_", "mem_", "comm_bytes_", "stage_comm_bytes_")
SUFFIXES = ("_low", "_high", "_interval")

#: (file, text) -> why a string equal to a figure's name is not that figure there
NOT_A_FIGURE: dict[tuple[str, str], str] = {
    ("autopar/report/format.py", "days"): "a number-format kind (a run that never finishes reads 'never')",
    ("autopar/report/page.py", "support"): "a table cell kind: the support word with its reason as a tooltip",
    ("autopar/report/page.py", "f'{c}_low'"): "an interval cell's bounds, of any column (the trial table's too)",
    ("autopar/report/page.py", "f'{c}_high'"): "an interval cell's bounds, of any column (the trial table's too)",
    # the published runs' CSV columns (autopar/calibration/data/calibration_runs*.csv): a run's
    # published step time, and its MFU and HFU in percent, not the estimate's ratios
    **{
        (f"autopar/calibration/{f}", name): "a column of the published runs' CSV"
        for f, names in (
            ("memory_facts.py", ("mfu", "hfu")),
            ("run_cases.py", ("step_time_s", "mfu")),
            ("run_checks.py", ("step_time_s", "mfu", "hfu")),
        )
        for name in names
    },
    **{
        (
            f"autopar/{f}",
            "time_s",
        ): "a step's time in a trial's progress record (progress.jsonl), not the per-term times"
        for f in ("measured/measure.py", "measured/own_run.py", "trial/worker.py")
    },
    ("autopar/trial/probe.py", "memory_bytes"): "the probed GPU's memory in the probe document",
    ("autopar/export/header.py", "fits"): "a word of the export header's prose line",
    **{
        (f"autopar/{f}", "valid"): "a search's counts of plans evaluated, valid and fitting, not a plan's flag"
        for f in ("search/run.py", "search/scenarios.py", "cli/render_search.py")
    },
}


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, nodes)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def spelled_names(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string in `path` that spells a figure's name, or builds one in an
    f-string from a family prefix or an interval suffix."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in FIGURES:
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            head = parts[0].value if parts and isinstance(parts[0], ast.Constant) else ""
            tail = parts[-1].value if parts and isinstance(parts[-1], ast.Constant) else ""
            if len(parts) > 1 and (
                (isinstance(head, str) and head in PREFIXES) or (isinstance(tail, str) and tail in SUFFIXES)
            ):
                found.append((node.lineno, ast.unparse(node)))
    return found


def spelled_outside(root: Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path == DECLARATION:
            continue
        rel = str(path.relative_to(REPO))
        out += [f"{rel}:{line}: {text}" for line, text in spelled_names(path) if (rel, text) not in NOT_A_FIGURE]
    return out


def test_no_figure_name_is_spelled_outside_its_declaration():
    found = spelled_outside()
    assert not found, "use the declared figure (autopar.figures) instead of its name:\n" + "\n".join(found)


def test_the_scan_finds_a_spelled_name_and_a_built_one(tmp_path):
    """The scan above can fail: a key spelled as text and a family name built in an f-string are
    both found, a docstring that names a figure is not."""
    f = tmp_path / "m.py"
    f.write_text('"""step_time_s in words."""\nx = {"step_time_s": 1}\ny = f"time_{t}"\nz = f"{f}_low"\nw = "steps"\n')
    assert sorted(line for line, _ in spelled_names(f)) == [2, 3, 4]


def test_each_figure_is_declared_once_under_its_own_name():
    tree = ast.parse(DECLARATION.read_text())
    made = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Figure" and n.args
    ]
    literal = [n.args[0].value for n in made if isinstance(n.args[0], ast.Constant)]
    assert len(literal) == len(set(literal)), "a figure is declared twice"
    for name in literal:  # a module-level name for each, spelled as the figure
        assert getattr(figures, name.upper()) == name
    families = [*figures.TIME.values(), *figures.MEM.values(), *figures.COMM_BYTES.values()]
    families += list(figures.STAGE_COMM_BYTES.values())
    bounds = [b[f] for f in INTERVAL_FIGURES for b in (figures.LOW, figures.HIGH, figures.INTERVAL)]
    assert len(FIGURES) == len(literal) + len(families) + len(bounds)
    assert {f"time_{t}" for t in figures.TIME_TERMS} | {f"mem_{t}" for t in figures.MEMORY_TERMS} <= set(FIGURES)
    assert figures.HIGH[figures.STEP_TIME_S] == "step_time_s_high"
    assert figures.INTERVAL[figures.STEP_TIME_S] == "step_time_s_interval"
    for f in FIGURES.values():
        assert f.header and f.meaning, f"{f}: a header and a meaning"
        assert importlib.util.find_spec(f.source) is not None, f"{f}: its source {f.source} is a module"


def test_a_figure_is_its_name_in_every_format(tmp_path):
    f = figures.STEP_TIME_S
    assert f == "step_time_s" and hash(f) == hash("step_time_s") and {"step_time_s": 1}[f] == 1
    assert type(pickle.loads(pickle.dumps(f))) is str and type(copy.deepcopy(f)) is str
    assert json.dumps({f: f}) == json.dumps({"step_time_s": "step_time_s"})
    assert f"{f}" == "step_time_s" and type(str(f)) is str
    df = pd.DataFrame({f: np.arange(3.0), figures.FITS: [True, False, True]})
    df.to_parquet(tmp_path / "t.parquet")
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert list(back.columns) == ["step_time_s", "fits"] and back[f].tolist() == [0.0, 1.0, 2.0]
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    assert buf.getvalue().splitlines()[0] == "step_time_s,fits"


def test_the_estimate_columns_are_declared_figures():
    """Every figure column the estimate prices is declared: price a plan and read its columns."""
    from autopar.calibration.estimate import estimate_table
    from autopar.spec.hardware import default_cluster
    from autopar.spec.plan import ParallelPlan
    from autopar.spec.presets import resolve_model
    from autopar.spec.table import PlanTable

    plans = [ParallelPlan(tp=2, pp=2, dp=2, micro_batch_size=1, global_batch_size=64, optimizer_offload=0.5)]
    cols = estimate_table(
        PlanTable.from_plans(plans), resolve_model("8b"), default_cluster("h100-sxm"), seq_len=4096, every_rank=True
    )
    undeclared = set(cols) - set(FIGURES)
    assert not undeclared, sorted(undeclared)
