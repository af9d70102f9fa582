"""A short run of an export: K steps on the trainer's mock data, no checkpoints, every step logged
(`ExportOptions.short_run_steps`; `autopar export --short-run K`, and the measured stage's
`--measure-with TRAINER`, autopar.measured.own_trainer). One place per trainer says which settings
do that; each exporter writes them where its trainer reads them. Only the run changes: the plan's
layout, batch, precision and recompute are the export's own, so the short run measures them.

Sources (the trainers' own flags, read in the releases the exports target):
- Megatron-LM (and Megatron-DeepSpeed, which keeps its flags): `--mock-data` (MockGPTDataset,
  pretrain_gpt.py), `--tokenizer-type NullTokenizer --vocab-size V` (examples/llama/
  train_llama3_8b_h100_fp8.sh), `--train-iters`, `--log-interval 1 --log-throughput`,
  `--eval-iters 0` (no validation: `do_valid = full_validation or eval_iters > 0`, training.py
  core_v0.16.0), `--eval-interval K` (v0.16 computes train_iters // eval_interval); no `--save` /
  `--load` (save_checkpoint runs only `if args.save`).
- Megatron-Bridge 0.3: `train.train_iters`, `logger.log_interval`, `logger.log_throughput`,
  `train.eval_iters=0` (data/loaders.py `do_valid`), `checkpoint.save=null` (training/pretrain.py
  saves `if ckpt_config.save`); no data paths = mock data (recipes/utils/dataset_utils.py).
- NeMo 2: scripts/performance/helpers.py's short perf runs (max_steps, val_check_interval,
  limit_val_batches=0, log_every_n_steps=1, enable_checkpointing=False, log.ckpt=None), resume off
  (recipes/log/default.py resumes if a checkpoint exists), NEMO_LOG_MEMORY_USAGE=1 for the peak
  (megatron_strategy.py); the recipes' data default is MockDataModule.
- torchtitan >= 0.3: `--training.steps K --metrics.log_freq 1 --metrics.disable_color_printing
  --checkpoint.no-enable --validator.no-enable` (tyro flags of Trainer.Config, torchtitan/trainer.py
  and components/metrics.py 0.3.0; tests/export/test_short_run.py parses them with its
  ConfigManager).
- DeepSpeed: ds_config `steps_per_print: 1` (the default is None since 0.15.2: nothing printed)
  and `wall_clock_breakdown: true` (the fwd/bwd/step timer line).
"""

from __future__ import annotations

from dataclasses import dataclass

#: how the measured stage and `export --short-run` say it in the files' headers
NOTE = "short run: {steps} steps on mock data, no checkpoints, every step logged"


@dataclass(frozen=True)
class ShortRun:
    """The settings of a K-step run, per trainer."""

    steps: int

    def megatron_user_args(self, vocab_size: int) -> str:
        """USER_ARGS of Megatron-LM / Megatron-DeepSpeed: mock data, a null tokenizer, no checkpoints.
        NullTokenizer adds an end-of-document id to --vocab-size (megatron-core 0.16.1
        tokenizers/text/libraries/null_tokenizer.py L52: vocab_size + 1), so V - 1 gives the model's V."""
        k = self.steps
        return f"""# {NOTE.format(steps=k)} (autopar export --short-run).
USER_ARGS=(
  --mock-data --tokenizer-type NullTokenizer --vocab-size {vocab_size - 1}
  --train-iters {k} --log-interval 1 --log-throughput --eval-iters 0 --eval-interval {k}
  --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 0
  --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
)
"""

    def bridge_overrides(self) -> dict:
        return {
            "train.train_iters": self.steps,
            "train.eval_iters": 0,
            "logger.log_interval": 1,
            "logger.log_throughput": True,
            "checkpoint.save": None,
            "checkpoint.load": None,
        }

    def nemo_overrides(self) -> dict:
        return {
            "trainer.max_steps": self.steps,
            "trainer.val_check_interval": self.steps,
            "trainer.limit_val_batches": 0,
            "trainer.log_every_n_steps": 1,
            "trainer.enable_checkpointing": False,
            "log.ckpt": None,
            "resume": None,
        }

    #: the environment NeMo reads for the peak-memory fields of its step line
    NEMO_ENV = (("NEMO_LOG_MEMORY_USAGE", "1"),)

    def torchtitan_args(self, toml: bool = False) -> str:
        """tyro flags; checkpointing and validation off even where a base config turns them on (the
        validation section is `validator` in 0.3, `validation` in <= 0.2.2, job_config.py)."""
        validation = "validation" if toml else "validator"
        return (
            f"--training.steps {self.steps} --metrics.log_freq 1 --metrics.disable_color_printing "
            f"--checkpoint.no-enable --{validation}.no-enable"
        )

    def deepspeed_config(self) -> dict:
        return {"steps_per_print": 1, "wall_clock_breakdown": True}


def short_run(steps: int | None) -> ShortRun | None:
    return None if steps is None else ShortRun(steps)
