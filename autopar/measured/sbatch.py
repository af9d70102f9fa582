"""The sbatch script of a trial on a SLURM cluster: one torchrun per node (c10d rendezvous on the first
node), or one standalone torchrun on a single node. `autopar trial --emit-slurm` writes it, and
autopar.measured.slurm.run_job submits it; imports no torch."""

from __future__ import annotations

import shlex
from pathlib import Path

from autopar.quoting import check_text, sbatch_directives

MULTI_NODE = """# autopar trial: srun starts one torchrun per node; c10d rendezvous on the first node.
set -euo pipefail
{env}head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
srun {python} -m torch.distributed.run --nnodes={nnodes} --nproc_per_node={nproc} \\
  --rdzv_backend=c10d --rdzv_endpoint="$head:29500" --rdzv_id="$SLURM_JOB_ID" \\
  -m autopar.trial.worker --spec {spec} --out {out}{worker_args}
"""
ONE_NODE = """# autopar trial: one node, one torchrun (--standalone: a free local port).
set -euo pipefail
{env}exec {python} -m torch.distributed.run --standalone --nproc_per_node={nproc} \\
  -m autopar.trial.worker --spec {spec} --out {out}{worker_args}
"""


def sbatch_script(
    *,
    nnodes: int,
    nproc: int,
    minutes: int,
    python: str,
    spec: Path | str,
    out: Path | str,
    worker_args: list[str] | None = None,
    job_name: str = "autopar-trial",
    pythonpath: str | None = None,
    gpus: bool = True,
) -> str:
    """The job script of a trial: `nnodes` nodes of `nproc` ranks (GPUs, or CPU processes with
    `gpus=False`), `minutes` of wall time. Its #SBATCH lines are the export's (autopar.quoting.
    sbatch_directives); a path or name with a line break is refused in one line."""
    for what, value in (
        ("the trial's python", python),
        ("the trial's run file", spec),
        ("the trial's result file", out),
        ("PYTHONPATH", pythonpath or ""),
        *(("a worker argument", a) for a in worker_args or []),
    ):
        check_text(str(value), what)
    args = "".join(f" {shlex.quote(a)}" for a in worker_args or [])
    env = "unset AUTOPAR_WATCH AUTOPAR_LAUNCH  # the submitting process is no launcher to watch here\n" + (
        f"export PYTHONPATH={shlex.quote(pythonpath)}${{PYTHONPATH:+:$PYTHONPATH}}\n" if pythonpath else ""
    )
    body = (MULTI_NODE if nnodes > 1 else ONE_NODE).format(
        nnodes=nnodes,
        nproc=nproc,
        python=shlex.quote(python),
        spec=shlex.quote(str(spec)),
        out=shlex.quote(str(out)),
        worker_args=args,
        env=env,
    )
    head = sbatch_directives(
        [
            ("job-name", job_name),
            ("nodes", nnodes),
            ("ntasks-per-node", 1),
            ("gpus-per-node" if gpus else "cpus-per-task", nproc),
            ("time", minutes),
        ]
    )
    return "#!/bin/bash\n" + head + body
