"""Multi-node launch scripts with the rank order the cost model assumed, and the two launcher
exporters (`torchrun`, `slurm`) that wrap any trainer's export.

Rank order. autopar prices every group from `MESH_ORDER = ("pp", "dp", "cp", "tp")`: tp on
consecutive global ranks inside one node, then cp, then dp, with pp outermost, which is
Megatron-Core's default order (tp-cp-ep-dp-pp) and torchtitan's mesh order (pp, dp, cp, tp). The
scripts keep the only property the trainers need for that: every node runs `gpus_per_node`
consecutive global ranks (global rank = node index * gpus_per_node + local rank):
- torchrun with a static rendezvous (`--node_rank`) gives node k the ranks k*G .. k*G+G-1;
- srun + torchrun with a c10d rendezvous orders nodes arbitrarily but keeps each node's G local
  ranks consecutive (torchtitan multinode_trainer.slurm);
- one srun task per GPU with `--distribution=block` gives consecutive SLURM_PROCIDs per node
  (Megatron's SLURM examples), exported as RANK / LOCAL_RANK / WORLD_SIZE.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from autopar.export.base import Context, ExportBundle, Exporter, ExportFile, ExportRefused
from autopar.export.header import comment_header
from autopar.export.presubmit import Required, submit_script
from autopar.quoting import check_text, sbatch_directives


@dataclass(frozen=True)
class Entry:
    """What each process runs, as shell words (already quoted where needed)."""

    program: str  # e.g. '"$MEGATRON_LM/pretrain_gpt.py"' or '-m torchtitan.train'
    args: str  # e.g. '"${AUTOPAR_ARGS[@]}" "${USER_ARGS[@]}"'
    setup: tuple[str, ...] = ()  # shell lines run first (source args files, defaults)
    env: tuple[tuple[str, str], ...] = ()  # trainer-specific environment
    unset: tuple[str, ...] = ()  # variables the trainer needs unset (e.g. Megatron-FSDP's CUDA_DEVICE_MAX_CONNECTIONS)
    one_task_per_gpu: bool = False  # SLURM: srun one task per GPU (Megatron) instead of torchrun
    requires: tuple[Required, ...] = ()  # what the job reads from the environment (submit_slurm.sh checks it)


COMMON_ENV = (("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"), ("OMP_NUM_THREADS", "${OMP_NUM_THREADS:-8}"))
# one srun task per GPU: the torch.distributed variables from the task's Slurm ids
_RANK_FROM_SLURM = "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS"


def rank_order_lines(ctx: Context) -> list[str]:
    p = ctx.plan
    g = ctx.gpus_per_node
    per_stage = ctx.num_gpus // p.pp
    out = [f"ranks: {ctx.nodes} node(s) x {g} GPUs; node k runs global ranks k*{g} .. k*{g}+{g - 1}"]
    if p.tp > 1:
        out.append(
            f"  tp={p.tp}: ranks {{0..{p.tp - 1}}}, {{{p.tp}..{2 * p.tp - 1}}}, ... (consecutive, inside one node)"
        )
    if p.cp > 1:
        out.append(f"  cp={p.cp}: ranks {p.tp} apart")
    if p.dp > 1:
        out.append(f"  dp={p.dp}: ranks {p.tp * p.cp} apart")
    if p.ep > 1:
        out.append(f"  ep={p.ep}: ranks {p.etp} apart inside a pipeline stage (etp={p.etp} innermost)")
    if p.pp > 1:
        out.append(f"  pp={p.pp}: stage s on ranks s*{per_stage} .. s*{per_stage}+{per_stage - 1}")
    return out


def _env_block(entry: Entry) -> str:
    lines = [f"export {k}={v}" for k, v in COMMON_ENV + entry.env] + [f"unset {k}" for k in entry.unset]
    return "\n".join(lines) + "\n"


def torchrun_script(ctx: Context, entry: Entry) -> str:
    n, g = ctx.nodes, ctx.gpus_per_node
    port = ctx.options.master_port
    rank_lines = "\n".join(f"# {ln}" for ln in rank_order_lines(ctx))
    setup = "\n".join(entry.setup)
    return f"""#!/usr/bin/env bash
{comment_header(ctx)}#
# torchrun launch ({n} node(s) x {g} GPUs). Run this on every node with its index:
#   NODE_RANK=<0..{n - 1}> MASTER_ADDR=<address of node 0> bash launch_torchrun.sh
# A static rendezvous (--node_rank) keeps each node's ranks consecutive, so the groups below
# are where the cost model put them.
{rank_lines}
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NODE_RANK=${{NODE_RANK:-0}}
MASTER_ADDR=${{MASTER_ADDR:-localhost}}
MASTER_PORT=${{MASTER_PORT:-{port}}}
{_env_block(entry)}{setup}
torchrun --nnodes {n} --nproc_per_node {g} --node_rank "$NODE_RANK" \\
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\
  {entry.program} {entry.args} "$@"
"""


def _sbatch_lines(ctx: Context, tasks_per_node: int) -> str:
    """The #SBATCH directives (autopar.quoting.sbatch_directives, shared with `autopar trial
    --emit-slurm`): every value escaped so sbatch reads it back as one word."""
    s = ctx.options.slurm
    return sbatch_directives(
        [
            ("job-name", s.job_name),
            ("nodes", ctx.nodes),
            ("ntasks-per-node", tasks_per_node),
            ("gpus-per-node", ctx.gpus_per_node),
            ("exclusive", True),
            ("partition", s.partition or None),
            ("account", s.account or None),
            ("time", s.time or None),
        ]
    )


def _container(ctx: Context) -> str:
    """srun's pyxis container flags (the image one quoted word), or nothing."""
    img = ctx.options.slurm.container_image
    if not img:
        return ""
    check_text(img, "--container-image")
    return f'--container-image={shlex.quote(img)} --container-mounts="$HERE:$HERE" '


def slurm_script(ctx: Context, entry: Entry) -> str:
    n, g = ctx.nodes, ctx.gpus_per_node
    port = ctx.options.master_port
    rank_lines = "\n".join(f"# {ln}" for ln in rank_order_lines(ctx))
    setup = "\n".join(entry.setup)
    head = f"""#!/bin/bash
{_sbatch_lines(ctx, g if entry.one_task_per_gpu else 1)}{comment_header(ctx)}#
# Submit with: bash submit_slurm.sh (it checks what the job reads from the environment first)
{rank_lines}
set -euo pipefail
HERE="${{SLURM_SUBMIT_DIR:-$(pwd)}}"
{_env_block(entry)}{setup}
"""
    if entry.one_task_per_gpu:
        return (
            head
            + f"""# one task per GPU, block distribution: SLURM_PROCID is consecutive on each node
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT={port}
srun --kill-on-bad-exit=1 --distribution=block:block --ntasks={n * g} {_container(ctx)}\\
  bash -c '{_RANK_FROM_SLURM}; exec python "$@"' autopar-rank \\
  {entry.program} {entry.args}
"""
        )
    return (
        head
        + f"""# one task per node running torchrun; c10d rendezvous on the first node
nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "${{nodes[0]}}" hostname --ip-address | awk '{{print $1}}')
srun --kill-on-bad-exit=1 --ntasks={n} --ntasks-per-node=1 {_container(ctx)}\\
  torchrun --nnodes {n} --nproc_per_node {g} --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d \\
  --rdzv_endpoint "$head_node_ip:{port}" \\
  {entry.program} {entry.args}
"""
    )


def run_hint(ctx: Context, which: str = "both") -> str:
    """The command a user runs from the export directory."""
    torchrun = (
        "bash launch_torchrun.sh"
        if ctx.nodes == 1
        else f"NODE_RANK=<0..{ctx.nodes - 1}> MASTER_ADDR=<node 0> bash launch_torchrun.sh   # on every node"
    )
    if which == "torchrun":
        return torchrun
    if which == "slurm":
        return "bash submit_slurm.sh"
    return f"bash submit_slurm.sh   # or: {torchrun}"


def launch_files(ctx: Context, entry: Entry) -> tuple[ExportFile, ExportFile, ExportFile]:
    container = bool(ctx.options.slurm.container_image)
    return (
        ExportFile("launch_torchrun.sh", torchrun_script(ctx, entry), executable=True),
        ExportFile("launch_slurm.sbatch", slurm_script(ctx, entry), executable=True),
        ExportFile("submit_slurm.sh", submit_script(entry.requires, container, comment_header(ctx)), executable=True),
    )


def _find(pattern: str, script: str, name: str) -> re.Match[str]:
    """The first match of `pattern` in the launch script `name`; ValueError when it has none."""
    m = re.search(pattern, script)
    if m is None:
        raise ValueError(f"{name} has no line matching {pattern!r}")
    return m


def parse_world(bundle: ExportBundle) -> int:
    """GPUs the launch scripts start (nodes x processes per node); the scripts must agree."""
    sizes = []
    names = {f.name for f in bundle.files}
    if "launch_torchrun.sh" in names:
        t = bundle.text("launch_torchrun.sh")
        m = _find(r"torchrun --nnodes (\d+) --nproc_per_node (\d+)", t, "launch_torchrun.sh")
        sizes.append(int(m.group(1)) * int(m.group(2)))
    if "launch_slurm.sbatch" in names:
        t = bundle.text("launch_slurm.sbatch")
        nodes = int(_find(r"#SBATCH --nodes=(\d+)", t, "launch_slurm.sbatch").group(1))
        tasks = int(_find(r"#SBATCH --ntasks-per-node=(\d+)", t, "launch_slurm.sbatch").group(1))
        gpus = int(_find(r"#SBATCH --gpus-per-node=(\d+)", t, "launch_slurm.sbatch").group(1))
        if tasks == 1:
            m = _find(r"torchrun --nnodes (\d+) --nproc_per_node (\d+)", t, "launch_slurm.sbatch")
            if int(m.group(1)) != nodes or int(m.group(2)) != gpus:
                raise ValueError("the sbatch header and its torchrun line disagree on the world size")
            sizes.append(nodes * gpus)
        else:
            if tasks != gpus:
                raise ValueError("one task per GPU needs --ntasks-per-node = --gpus-per-node")
            sizes.append(nodes * tasks)
    if not sizes or len(set(sizes)) != 1:
        raise ValueError(f"launch scripts disagree on (or lack) the world size: {sizes}")
    return sizes[0]


#: a file only that trainer's export has -> the trainer
TRAINER_FILES = {
    "megatron_args.sh": "megatron",
    "autopar_torchtitan.py": "torchtitan",
    "torchtitan.toml": "torchtitan",
    "ds_config.json": "deepspeed",
    "nemo_pretrain.py": "nemo",
    "bridge_overrides.txt": "bridge",
}


def trainer_of(bundle: ExportBundle) -> str:
    found = {TRAINER_FILES[f.name] for f in bundle.files if f.name in TRAINER_FILES}
    if len(found) != 1:
        raise ValueError(f"cannot tell which trainer these files are for: {[f.name for f in bundle.files]}")
    return found.pop()


# ---- the launcher exporters ---------------------------------------------------------------------


class _LauncherExporter(Exporter):
    keep: tuple[str, ...] = ()  # the launch files this launcher keeps

    def runs_on(self, plan, options) -> str:
        """The trainer launched: --trainer, else the plan's own."""
        from autopar.spec.trainers import get_trainer

        return get_trainer(options.trainer or plan.trainer).key

    def waived_for(self, trainer: str, options) -> frozenset[str]:
        """The wrapped trainer's waivers; a trainer without an exporter (autopar's built-in model) is refused."""
        from autopar.export.registry import EXPORTERS
        from autopar.spec.trainers import TRAINERS, get_trainer

        if trainer not in EXPORTERS:
            raise ExportRefused(
                self.name,
                f"it runs on {get_trainer(trainer).title}, which has no launch config "
                f"(`autopar trial` runs it); pass --trainer with one of {', '.join(TRAINERS)}",
            )
        return EXPORTERS[trainer].waived(options)

    def _render(self, ctx: Context) -> ExportBundle:
        from autopar.export.registry import get_exporter

        trainer = ctx.plan.trainer  # Context.make re-targeted the plan to runs_on()
        bundle = get_exporter(trainer).render(ctx.plan, ctx.model, ctx.cluster, ctx.options)
        drop = {"launch_torchrun.sh", "launch_slurm.sbatch", "submit_slurm.sh"} - set(self.keep)
        files = tuple(f for f in bundle.files if f.name not in drop)
        run = run_hint(ctx, "torchrun" if "launch_torchrun.sh" in self.keep else "slurm")
        return ExportBundle(
            format=self.name, files=files, run=run, notes=bundle.notes, meta=dict(bundle.meta, trainer=trainer)
        )

    def parse(self, bundle: ExportBundle) -> dict:
        from autopar.export.registry import get_exporter

        return get_exporter(trainer_of(bundle)).parse(bundle)


class TorchrunExporter(_LauncherExporter):
    name = "torchrun"
    title = "torchrun launch script (static rendezvous, one per node) for --trainer (default: the plan's trainer)"
    example = "autopar export --run reports/run --rank 1 --to torchrun --trainer torchtitan --out launch/"
    description = (
        "launch_torchrun.sh + the trainer's config: run it on every node with NODE_RANK and MASTER_ADDR "
        "set; each node gets consecutive global ranks, so TP groups stay inside a node."
    )
    keep = ("launch_torchrun.sh",)


class SlurmExporter(_LauncherExporter):
    name = "slurm"
    title = "SLURM sbatch script for --trainer (srun one task per GPU for Megatron-family, else srun+torchrun c10d)"
    example = "autopar export --run reports/run --rank 1 --to slurm --partition gpu --time 04:00:00 --out launch/"
    description = (
        "launch_slurm.sbatch + the trainer's config: `bash submit_slurm.sh` checks what the job reads from "
        "the environment (DATA_PATH, TOKENIZER, the checkout) on the login node, then submits it. Megatron-LM and "
        "Megatron-DeepSpeed run one srun task per GPU (block distribution); torchtitan, NeMo and "
        "Megatron-Bridge run srun + torchrun with a c10d rendezvous."
    )
    keep = ("launch_slurm.sbatch", "submit_slurm.sh")
