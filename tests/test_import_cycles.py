"""No import cycle anywhere under autopar/: the graph of every module's imports (module level, inside
functions and under `if TYPE_CHECKING:` alike) has no cycle, across packages as well as inside
them. A cycle held together by an import inside a function is two halves of one module; one held
together by a type-checking import is a type that belongs in the lower layer."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "autopar"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the autopar modules it imports. `from package import name` depends on the
    submodule `package.name` where there is one (Python runs the package's __init__ first, as for
    any submodule, but that is no dependency of the importer's on the __init__'s own imports),
    else on the package."""
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    found: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_checker_finds_a_cycle():
    graph = {"p.a": {"p.b"}, "p.b": {"q.c"}, "q.c": {"p.a"}, "p.d": {"p.a"}, "q.x": {"p.a"}}
    assert cycles(graph) == [["p.a", "p.b", "q.c"]]


def test_the_checker_reads_type_checking_and_function_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "autopar" / "p"
    pkg.mkdir(parents=True)
    (tmp_path / "autopar" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from autopar.p.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from autopar.p import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / "autopar")
    assert cycles(import_graph()) == [["autopar.p.a", "autopar.p.b"]]


def test_no_import_cycle_anywhere():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
