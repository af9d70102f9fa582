"""The shape the codebase keeps (so the next engineer can carry it): no module of autopar/ over 600
lines, no function over 80 (counted on the ruff-formatted source, from `def` to its last line),
and nothing in autopar/ or the README pointing at files outside the repository. The module limit is
generous on purpose: a module is split where a concept ends, not where a line count does (the
halves of one module held together by an import inside a function are what tests/test_import_cycles.py
refuses)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "autopar").rglob("*.py"))
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def test_modules_and_functions_are_short() -> None:
    assert len(SOURCES) > 50  # the walk found the package
    too_long = []
    for path in SOURCES:
        text = path.read_text()
        name = path.relative_to(ROOT)
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {n} lines")
    assert not too_long, "over the size limits:\n" + "\n".join(too_long)


def test_nothing_points_outside_the_repository() -> None:
    outside = re.compile(
        r"\.\./shared|shared/(seeds|reference)|design-lessons|cpu-distributed\.md|calibration_runs[^ ]*\.md"
    )
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in [*SOURCES, *(ROOT / "autopar").rglob("*.toml"), ROOT / "README.md"]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)


def test_one_atomic_write() -> None:
    """A file is renamed into place in one module only (autopar/atomic.py): nothing else renames a
    temporary file over its target, and no other module names a temporary file."""
    renames = re.compile(r"os\.replace\(|os\.rename\(|\.replace\(\s*(self\.)?(path|out|dest|target)\b")
    temp_names = re.compile(r"""\.tmp["')]""")
    found = []
    for path in SOURCES:
        if path.name == "atomic.py" and path.parent.name == "autopar":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if renames.search(line) or temp_names.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "use autopar.atomic (write_atomic, write_with, temp_path):\n" + "\n".join(found)


def test_the_readme_stays_short() -> None:
    """The README is the front page: at most 12 KB, depth goes to docs/."""
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024


def test_the_product_cites_no_issue_of_its_own_tracker() -> None:
    """Code and data speak of the product itself, not of the tracker it was built from ("issue 26");
    an upstream project's issue is cited with its repository and '#' (DeepGEMM issue #120)."""
    own = re.compile(r"\b[Ii]ssues? \d+\b")
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in [*SOURCES, *(ROOT / "autopar").rglob("*.toml")]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if own.search(line)
    ]
    assert not hits, "issue numbers in the product:\n" + "\n".join(hits)
