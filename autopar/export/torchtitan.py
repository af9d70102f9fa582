"""torchtitan: a Python config function (releases >= 0.3, `--module/--config`) or a TOML job file
(releases <= 0.2.2, `--job.config_file`), chosen by `--torchtitan-version`.

Field names are the released packages' (torchtitan 0.3.0 `torchtitan/config/configs.py` and
`trainer.py`; torchtitan 0.2.2 `torchtitan/config/job_config.py`), checked by
tests/export/test_export_trainers.py against the installed packages. What torchtitan 0.3 cannot run
is its capability table (autopar/spec/data/trainers.toml [torchtitan], applied before rendering);
autopar/export/torchtitan_checks.py keeps only what depends on the export options: the <= 0.2.2
TOML format's own limits and choices, and the base config a model needs (--torchtitan-base).
The settings of a plan are in autopar/export/torchtitan_values.py, the two file formats in
autopar/export/torchtitan_files.py. Mapping:
- dp: ZeRO-0 -> data_parallel_replicate_degree = dp (DDP); ZeRO-2 -> data_parallel_shard_degree = dp
  with fsdp_reshard_after_forward "never"; ZeRO-3 -> the same with "always". torchtitan has no
  ZeRO-1 (FSDP2 shards gradients too), and it always applies FSDP over the CP ranks, so ZeRO-0
  with cp > 1 cannot be expressed either.
- pp: pipeline_parallel_degree, the schedule by name (1F1B, Interleaved1F1B, GPipe, and
  InterleavedZeroBubble with one stage per rank for zero-bubble, PyTorch's ZB1P), and the exact
  layout as module_fqns_per_model_part; a step's microbatches all run in one pipeline step
  (local_batch_size = mbs * microbatches, pipeline_parallel_microbatch_size = mbs).
- no pp: local_batch_size = mbs and global_batch_size makes the gradient accumulation.
- ep / etp: <= 0.2.2 has expert_tensor_parallel_degree in {1, tp}; >= 0.3 dropped it: experts
  are TP-sharded only without EP (etp = tp), and EP borrows the TP ranks (etp = 1).
- recompute: none / selective (per-op SAC) / full (every block); no partial full recompute.
- tp-comm-overlap: async TP, which needs torch.compile of the model.
- fp8: the float8 model converter (needs torchao).
"""

from __future__ import annotations

from autopar.export.base import Context, ExportBundle, Exporter, ExportFile
from autopar.export.launch import Entry, launch_files, parse_world, run_hint
from autopar.export.torchtitan_checks import TOML_WAIVED, check_toml, toml_era
from autopar.export.torchtitan_files import parse_torchtitan_py, parse_torchtitan_toml, render_py, render_toml
from autopar.export.torchtitan_values import view_from_torchtitan

PY_FILE = "autopar_torchtitan.py"
TOML_FILE = "torchtitan.toml"


class TorchtitanExporter(Exporter):
    name = "torchtitan"
    title = "torchtitan: Python config (>= 0.3, default) or TOML (<= 0.2.2, --torchtitan-version 0.2.2)"
    example = (
        "autopar export --run reports/run --rank 1 --to torchtitan --zero 3 --torchtitan-version 0.2.2 --out launch/"
    )
    description = (
        "autopar_torchtitan.py (a config function: --module autopar_torchtitan --config autopar_plan) or "
        "torchtitan.toml (--job.config_file), with [parallelism] degrees, schedule and exact layer split, "
        "batch and activation checkpointing; plus launch_torchrun.sh and launch_slurm.sbatch."
    )

    def waived(self, options) -> frozenset[str]:
        """The TOML export checks expert TP itself (check_toml)."""
        return TOML_WAIVED if toml_era(options.torchtitan_version) else frozenset()

    def _render(self, ctx: Context) -> ExportBundle:
        toml = toml_era(ctx.options.torchtitan_version)
        if toml:
            check_toml(ctx)
        notes = ["set the tokenizer / HF assets path and dataset of the base config before launching"]
        if ctx.plan.dtype == "fp8":
            notes.append("FP8 uses the float8 converter: install torchao")
        if ctx.plan.recompute == "selective":
            notes.append(
                "torchtitan's selective AC is per-op (it saves matmul outputs); autopar priced Megatron's "
                "selective (core-attention) recompute"
            )
        if toml:
            cfg = ExportFile(TOML_FILE, render_toml(ctx))
            entry = Entry(program="-m torchtitan.train", args='--job.config_file "$HERE/torchtitan.toml"')
        else:
            cfg = ExportFile(PY_FILE, render_py(ctx))
            entry = Entry(
                program="-m torchtitan.train",
                args="--module autopar_torchtitan --config autopar_plan",
                setup=('export PYTHONPATH="$HERE:${PYTHONPATH:-}"',),
            )
        return ExportBundle(
            format=self.name,
            files=(cfg, *launch_files(ctx, entry)),
            run=run_hint(ctx),
            notes=tuple(notes),
            meta={"toml": toml},
        )

    def parse(self, bundle: ExportBundle) -> dict:
        names = {f.name for f in bundle.files}
        cfg = (
            parse_torchtitan_toml(bundle.text(TOML_FILE))
            if TOML_FILE in names
            else parse_torchtitan_py(bundle.text(PY_FILE))
        )
        return view_from_torchtitan(cfg, parse_world(bundle))
