"""No import cycle inside autopar.spec: no module imports (at module level or inside a function) a
module of autopar.spec that imports it back, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

SPEC = Path(__file__).resolve().parents[2] / "autopar" / "spec"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The autopar.spec modules a file imports, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = ("autopar.spec." + node.module) if node.level else node.module
            if mod == "autopar.spec":
                out |= {a.name for a in node.names if a.name in modules}
            elif mod.startswith("autopar.spec."):
                out.add(mod.split(".")[2])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[2] for a in node.names if a.name.startswith("autopar.spec.")}
    return out - {path.stem}


def test_no_module_of_spec_is_imported_back():
    modules = {p.stem for p in SPEC.glob("*.py")}
    assert {"plan", "table", "rules", "hardware"} <= modules
    edges = {m: _imports(SPEC / f"{m}.py", modules) for m in modules}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for b in edges[todo.pop()]:
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a in edges for b in edges[a] if a in reach(b))
    assert not cycles, "import cycles in autopar/spec:\n" + "\n".join(cycles)
