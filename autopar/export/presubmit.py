"""The pre-submit check of a SLURM export (`submit_slurm.sh`): what the job needs from the user's
environment is checked on the login node, before `sbatch` queues a many-node job that would fail
in its first second after the wait (`${DATA_PATH:?...}` in the launch scripts only fires on the
compute nodes). sbatch hands the submitting shell's environment to the job (its default
`--export=ALL`), so what is checked here is what the job sees.

Each exporter lists its `Required` variables on its launch `Entry`; this module turns them into
shell checks, one clear line and exit 2 for the first that fails, then `exec sbatch`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

#: what a Required variable must hold
KINDS = ("dataset", "name_or_path", "checkout")


@dataclass(frozen=True)
class Required:
    """A variable the job reads from the environment.

    - "dataset": a Megatron indexed dataset prefix, PREFIX.bin and PREFIX.idx beside each other
      (megatron/core/datasets/indexed_dataset.py); one path, as the launch scripts pass it;
    - "name_or_path": set; a path (starting with /, ./ or ../) exists (a HuggingFace tokenizer is a
      hub name such as meta-llama/Llama-3.1-8B, or a local directory);
    - "checkout": a directory holding `file` (the trainer's entry point), `default` where unset;
      not checked when the job runs in a container image (the checkout lives in the image).
    """

    var: str
    kind: str
    what: str  # words for the failing line: "a Megatron indexed dataset prefix"
    file: str = ""
    default: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown requirement kind {self.kind!r}")


def _check_lines(r: Required, container: bool) -> list[str]:
    v = r.var
    if r.kind == "checkout":
        if container:
            return []
        return [
            f'{v}="${{{v}:-{r.default}}}"',
            f'[ -f "${v}/{r.file}" ] || fail "{v}=${v} has no {r.file}: set {v} to {r.what}"',
        ]
    lines = [f'[ -n "${{{v}:-}}" ] || fail "{v} is not set: set it to {r.what}"']
    if r.kind == "dataset":  # one prefix: the launch scripts pass "${DATA_PATH}" as one word
        lines.append(
            f'[ -f "${v}.bin" ] && [ -f "${v}.idx" ] || fail "{v}: ${v}.bin or ${v}.idx not found: set {v} to {r.what}"'
        )
    else:
        lines.append(
            f'case "${v}" in /*|./*|../*) [ -e "${v}" ] || fail "{v}=${v} does not exist: set it to {r.what}";; esac'
        )
    return lines


def submit_script(requires: tuple[Required, ...], container: bool, header: str) -> str:
    """`submit_slurm.sh`: the export's `header` comment, the checks, then `sbatch [flags]
    launch_slurm.sbatch` from its directory (extra arguments pass through to sbatch, e.g.
    --dependency=afterok:JOB)."""
    checks = [line for r in requires for line in _check_lines(r, container)]
    body = "\n".join(checks) if checks else "# this trainer reads nothing from the environment"
    return f"""#!/bin/bash
{header}#
# Checks what the job reads from the environment on this node, then submits launch_slurm.sbatch
# (sbatch hands this environment to the job). Extra arguments go to sbatch.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
fail() {{ echo "autopar submit: $*" >&2; exit 2; }}
{body}
command -v sbatch >/dev/null || fail "sbatch not found: submit from a SLURM login node"
cd "$HERE"
exec sbatch "$@" {shlex.quote("launch_slurm.sbatch")}
"""
