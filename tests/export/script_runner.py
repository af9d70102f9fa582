"""Run generated scripts for real, with stand-ins for the cluster commands (tests only).

`Stubs(dir)` writes `torchrun`, `srun`, `python`, `sbatch`, `scontrol` and `hostname` executables that
record their argv (NUL-separated, one file per call) and do nothing else; `srun` then runs the
command it was given (so a wrapped `bash -c ... python` or `torchrun` is reached, and the stubs see
the argv a real launch would). `fake_sbatch` reads a script's #SBATCH lines the way Slurm's sbatch
does (sbatch/opt.c `_get_argument`) and runs it with bash; `run_python` executes Python files
module-level with stub `nemo`, `nemo_run` and `torchtitan` packages. Shared by
test_hostile_values.py (pytest puts this directory on sys.path).
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from pathlib import Path

RECORD = '#!/bin/bash\nprintf \'%s\\0\' "$@" > "$STUB_LOG/{name}.$$.$RANDOM$RANDOM"\n'
SRUN = (
    RECORD.format(name="srun")
    + """while [ $# -gt 0 ]; do
  case "$1" in -w|--nodelist|-N|-n) shift 2;; -*) shift;; *) break;; esac
done
exec "$@"
"""
)
STUBS = {
    "torchrun": RECORD.format(name="torchrun"),
    "python": RECORD.format(name="python"),
    "sbatch": RECORD.format(name="sbatch"),
    "srun": SRUN,
    "scontrol": RECORD.format(name="scontrol") + "echo localhost\n",
    "hostname": RECORD.format(name="hostname") + "echo 127.0.0.1\n",
}

PY_RUNNER = '''
import importlib.abc, importlib.machinery, runpy, sys, types

class Anything:
    """Stands for any object of the stub packages: attributes, calls and items give Anything."""
    def __getattr__(self, name): return Anything()
    def __call__(self, *a, **k): return Anything()
    def __getitem__(self, k): return Anything()

class StubModule(types.ModuleType):
    __path__ = []
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything()

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("nemo", "nemo_run", "torchtitan"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec): return StubModule(spec.name)
    def exec_module(self, module): pass

sys.meta_path.insert(0, Finder())
for path in sys.argv[1:]:
    runpy.run_path(path, run_name="autopar_hostile_check")
'''


class Stubs:
    """Recording stand-ins for the launch commands in `root`/bin; calls land in `root`/log."""

    def __init__(self, root: Path):
        """Write the stubs under `root`."""
        self.bin, self.log = root / "bin", root / "log"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.log.mkdir(exist_ok=True)
        for name, text in STUBS.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)

    def env(self, **extra: str) -> dict:
        """The environment a launch sees: the stubs first on PATH, the trainer paths set."""
        return dict(
            os.environ,
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            STUB_LOG=str(self.log),
            DATA_PATH="/data/prefix",
            TOKENIZER="tok",
            NODE_RANK="0",
            MASTER_ADDR="localhost",
            **extra,
        )

    def calls(self, name: str) -> list[list[str]]:
        """argv of every recorded call of one stub."""
        out = []
        for p in sorted(self.log.glob(f"{name}.*")):
            words = p.read_bytes().split(b"\0")
            out.append([w.decode() for w in words[:-1]])
        return out

    def reset(self) -> None:
        """Forget the recorded calls."""
        for p in self.log.iterdir():
            p.unlink()


def _sbatch_words(text: str) -> list[str]:
    """The arguments on one #SBATCH line, read as sbatch reads them: a backslash escapes the next
    character anywhere (inside quotes too), quotes group, an unquoted # ends the line."""
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return words
        word, quote, escape, comment = [], "", False, False
        while i < n and (quote or not text[i].isspace()):
            c = text[i]
            i += 1
            if escape:
                escape = False
            elif c == "\\":
                escape = True
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    continue
            elif c in "'\"":
                quote = c
                continue
            elif c == "#":
                comment = True
                break
            word.append(c)
        words.append("".join(word))
        if comment:
            return words


def sbatch_options(script: str) -> list[str]:
    """The options sbatch takes from a script: #SBATCH lines before the first command; checked to
    read the same as a POSIX shell would read them."""
    out: list[str] = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            words = _sbatch_words(line[len("#SBATCH") :])
            assert words == shlex.split(line[len("#SBATCH") :], comments=True), line
            out += words
    return out


SLURM_ENV = {
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_NODELIST": "localhost",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "1",
}


def fake_sbatch(script: Path, stubs: Stubs) -> tuple[list[str], subprocess.CompletedProcess]:
    """`sbatch script` on a one-node stand-in cluster: (the #SBATCH options, the script's run)."""
    opts = sbatch_options(script.read_text(encoding="utf-8"))
    return opts, run_scripts([script], stubs)


def run_scripts(scripts: list[Path], stubs: Stubs) -> subprocess.CompletedProcess:
    """Run each script with bash from its own directory, in one driver process (fast): *.sbatch as
    a SLURM job on one node (SLURM_* set, as sbatch would), the others as on a node of a torchrun
    launch. Stops at the first failure and names it on stderr."""
    lines = ["set -u"]
    for f in scripts:
        env = (
            " ".join(f"{k}={v}" for k, v in SLURM_ENV.items()) + f" SLURM_SUBMIT_DIR={shlex.quote(str(f.parent))}"
            if f.suffix == ".sbatch"
            else ""
        )
        lines.append(
            f"( cd {shlex.quote(str(f.parent))} && {env} bash -- {shlex.quote(f.name)} ) "
            f"|| {{ echo {shlex.quote(f'FAILED: {f}')} >&2; exit 1; }}"
        )
    return subprocess.run(
        ["bash", "-c", "\n".join(lines)], env=stubs.env(), capture_output=True, text=True, timeout=120
    )


def check_python_shape(path: Path) -> None:
    """A generated Python file holds only imports, assignments, functions, a docstring and the
    `if __name__ == "__main__":` guard at module level: nothing a value could have injected."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        ok = (
            isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.FunctionDef))
            or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is tree.body[0])
            or (isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'")
        )
        assert ok, f"{path.name}:{node.lineno}: unexpected {ast.unparse(node)[:80]!r}"


def run_python(paths: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    """Execute Python files (module level, not their __main__ block) with stub trainer packages."""
    return subprocess.run(
        [sys.executable, "-c", PY_RUNNER, *map(str, paths)], cwd=cwd, capture_output=True, text=True, timeout=60
    )
