"""DeepSpeed: `ds_config.json` plus the Megatron-DeepSpeed `pretrain_gpt.py` flags.

Batch: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * DP world,
where DeepSpeed's world size is the data-parallel size when Megatron's mpu is passed
(deepspeed/runtime/config.py `_batch_assertion`). What DeepSpeed cannot run (ZeRO-2/3 with
pipeline parallelism, schedules other than its 1F1B, uneven stages, context parallelism, MoE, FP8,
TP overlap, partial recompute under the pipeline engine, MLA / QK-norm / QKV-only biases) is its
capability table (autopar/spec/data/trainers.toml [deepspeed], applied before rendering).

With pp > 1 and a single data-parallel rank, ZeRO-2/3 shard nothing (the plan is ZeRO-1's, as the
cost model prices it), and DeepSpeed's pipeline engine asserts on stages 2/3 whatever the dp size
(deepspeed/runtime/pipe/engine.py), so the export writes stage 1 there.
"""

from __future__ import annotations

import json

from autopar.cost.flops import VOCAB_DIVISOR
from autopar.export.base import Context, ExportBundle, Exporter, ExportFile
from autopar.export.bash import bash_array, number_word, read_bash_array
from autopar.export.header import comment_header, header_dict
from autopar.export.launch import Entry, launch_files, parse_world, run_hint
from autopar.export.megatron import USER_ARGS, USER_REQUIRES
from autopar.export.megatron_core import recompute_from
from autopar.export.presubmit import Required
from autopar.export.production import checkpoint_interval
from autopar.export.short_run import short_run
from autopar.export.view import normalize
from autopar.figures import NUM_MICROBATCHES
from autopar.json_out import dumps

CONFIG = "ds_config.json"
ARGS = "megatron_deepspeed_args.sh"


def zero_stage(ctx: Context) -> int:
    """The ZeRO stage written: the plan's, but 1 for ZeRO-2/3 with pp > 1 and one data-parallel rank
    (nothing to shard; the pipeline engine asserts on stages 2/3, deepspeed/runtime/pipe/engine.py)."""
    p = ctx.plan
    return 1 if p.pp > 1 and p.dp * p.cp == 1 and p.zero_stage >= 2 else p.zero_stage


def ds_config(ctx: Context) -> dict:
    p = ctx.plan
    stage = zero_stage(ctx)
    zero: dict = {"stage": stage}
    if stage >= 1:
        zero.update(
            overlap_comm=True,
            contiguous_gradients=True,
            reduce_scatter=True,
            reduce_bucket_size=500_000_000,
            allgather_bucket_size=500_000_000,
        )
    if stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=500_000_000,
            stage3_param_persistence_threshold=1_000_000,
            stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000,
        )
    if p.optimizer_offload:  # ZeRO-Offload (deepspeed/runtime/zero/offload_config.py, deepspeed 0.19.8)
        zero["offload_optimizer"] = offload_optimizer(p.optimizer_offload)
    cfg = {
        "_autopar": header_dict(ctx),
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.num_microbatches,
        "steps_per_print": 10,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "bf16": {"enabled": p.dtype == "bf16"},
        "data_types": {"grad_accum_dtype": "fp32" if p.main_grads_fp32 else "bf16"},
        "wall_clock_breakdown": False,
    }
    short = short_run(ctx.options.short_run_steps)
    return cfg | (short.deepspeed_config() if short else {})


def offload_optimizer(share: float) -> dict:
    """zero_optimization.offload_optimizer (DeepSpeedZeroOffloadOptimizerConfig): the fp32 partition
    and Adam states in pinned host memory, stepped by DeepSpeedCPUAdam; `ratio`, the share offloaded,
    only below 1 ('Only valid with ZeRO Stage 3', which the capability table enforces)."""
    out: dict = {"device": "cpu", "pin_memory": True}
    if share < 1:
        out["ratio"] = float(share)
    return out


def offload_share(zero: dict) -> float:
    """The plan's optimizer_offload back from zero_optimization (ratio defaults to 1.0)."""
    off = zero.get("offload_optimizer") or {}
    return float(off.get("ratio", 1.0)) if off.get("device") == "cpu" else 0.0


def mds_args(ctx: Context) -> list[tuple[str, list[str]]]:
    p, m, s = ctx.plan, ctx.model, ctx.seq_len
    model = [
        "--num-layers",
        str(m.num_layers),
        "--hidden-size",
        str(m.hidden_size),
        "--ffn-hidden-size",
        str(m.ffn_hidden_size),
        "--num-attention-heads",
        str(m.num_attention_heads),
        "--kv-channels",
        str(m.head_dim),
    ]
    if m.num_kv_heads != m.num_attention_heads:
        model += ["--num-key-value-heads", str(m.num_kv_heads)]
    model += ["--seq-length", str(s), "--max-position-embeddings", str(max(s, m.seq_len))]
    if m.gated_mlp:
        model += ["--swiglu"]
    model += ["--normalization", "rmsnorm" if m.norm == "rmsnorm" else "layernorm"]
    if not m.learned_position_embeddings:
        model += ["--use-rotary-position-embeddings"]
        if m.rope_theta is not None:  # Megatron-DeepSpeed arguments.py --rope-theta (float, default 10000)
            model += ["--rope-theta", number_word(m.rope_theta)]
    if m.norm_epsilon is not None:  # Megatron-DeepSpeed keeps Megatron-LM's old name (default 1e-5)
        model += ["--layernorm-epsilon", number_word(m.norm_epsilon)]
    # the vocabulary padding the cost model priced (autopar.cost.flops.padded_vocab: 128 x tp)
    model += ["--make-vocab-size-divisible-by", str(VOCAB_DIVISOR)]
    # FlashAttention-2, which the cost model prices; without it Megatron-DeepSpeed materialises the
    # s x s score matrix (megatron/model/transformer.py FlashSelfAttention, --use-flash-attn-v2;
    # the kernel takes fp16/bf16 only, so an fp32 plan keeps the unfused attention)
    if p.dtype != "fp32":
        model += ["--use-flash-attn-v2"]
    if not m.tied_embeddings:
        model += ["--untie-embeddings-and-output-weights"]
    if not m.linear_bias:
        model += ["--disable-bias-linear"]
    if not m.dropout:
        model += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    par = ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp)]
    if p.pp == 1:
        par += ["--no-pipeline-parallel"]
    if p.sequence_parallel:
        par += ["--sequence-parallel"]
    batch = ["--micro-batch-size", str(p.micro_batch_size), "--global-batch-size", str(p.global_batch_size)]
    rec = []
    if p.recompute == "selective":
        rec = ["--recompute-granularity", "selective"]
    elif p.recompute == "full":
        if p.recompute_layers is None:
            rec = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        else:
            rec = [
                "--recompute-granularity",
                "full",
                "--recompute-method",
                "block",
                "--recompute-num-layers",
                str(p.recompute_layers),
            ]
        rec += ["--deepspeed-activation-checkpointing"]
    prec = ["--bf16"] if p.dtype == "bf16" else []
    # ZeRO-Offload steps the partition with DeepSpeedCPUAdam (stage_1_and_2.py `_enforce_cpu_offload`),
    # which Megatron-DeepSpeed builds with --cpu-optimizer (megatron/optimizer/__init__.py) [UNCERTAIN:
    # Megatron-DeepSpeed is not installed here]
    opt = ["--cpu-optimizer"] if p.optimizer_offload else []
    steps = checkpoint_interval(ctx).steps  # the goodput model's Young/Daly interval
    ckpt = ["--save-interval", str(steps)] if steps is not None else []
    return [
        ("model shape", model),
        ("parallelism", par),
        ("batch", batch),
        ("recompute", rec),
        ("precision", prec),
        ("optimizer", opt),
        ("checkpoints", ckpt),
    ]


class DeepSpeedExporter(Exporter):
    name = "deepspeed"
    title = "DeepSpeed ds_config.json + Megatron-DeepSpeed pretrain_gpt.py flags (refuses what DeepSpeed cannot run)"
    example = "autopar export --model 70b --gpus 64 --tp 8 --pp 4 --zero 1 --to deepspeed --out launch/"
    description = (
        "ds_config.json (train batch = micro x grad-accum x DP, ZeRO stage and its keys, bf16), "
        "megatron_deepspeed_args.sh (AUTOPAR_ARGS, DS_ARGS with --deepspeed_config and --zero-stage, "
        "USER_ARGS), launch_torchrun.sh and launch_slurm.sbatch. Set MEGATRON_DEEPSPEED to your checkout."
    )

    def _render(self, ctx: Context) -> ExportBundle:
        short = short_run(ctx.options.short_run_steps)
        cfg = dumps(ds_config(ctx), indent=2) + "\n"
        args = (
            comment_header(ctx)
            + "# Megatron-DeepSpeed flags for pretrain_gpt.py; sourced by the launch scripts.\n"
            + bash_array("AUTOPAR_ARGS", mds_args(ctx))
            + f'DS_ARGS=(\n  --deepspeed\n  --deepspeed_config "$HERE/{CONFIG}"\n'
            f"  --zero-stage {zero_stage(ctx)}\n)\n"
            + (short.megatron_user_args(ctx.model.vocab_size) if short else USER_ARGS)
        )
        checkout = Required(
            "MEGATRON_DEEPSPEED",
            "checkout",
            "your Megatron-DeepSpeed checkout",
            "pretrain_gpt.py",
            "/opt/Megatron-DeepSpeed",
        )
        entry = Entry(
            # a short run takes any script that reads these flags and --deepspeed_config (DEEPSPEED_SCRIPT)
            program='"$DEEPSPEED_SCRIPT"' if short else '"$MEGATRON_DEEPSPEED/pretrain_gpt.py"',
            args='"${AUTOPAR_ARGS[@]}" "${DS_ARGS[@]}" "${USER_ARGS[@]}"',
            setup=(
                "MEGATRON_DEEPSPEED=${MEGATRON_DEEPSPEED:-/opt/Megatron-DeepSpeed}",
                *(["DEEPSPEED_SCRIPT=${DEEPSPEED_SCRIPT:-$MEGATRON_DEEPSPEED/pretrain_gpt.py}"] if short else []),
                f'source "$HERE/{ARGS}"',
            ),
            env=(("CUDA_DEVICE_MAX_CONNECTIONS", "1"),),
            requires=() if short else USER_REQUIRES + (checkout,),
        )
        return ExportBundle(
            format=self.name,
            files=(ExportFile(CONFIG, cfg), ExportFile(ARGS, args), *launch_files(ctx, entry)),
            run=run_hint(ctx),
            notes=("set MEGATRON_DEEPSPEED, DATA_PATH and TOKENIZER before launching",)
            if not short
            else ("set DEEPSPEED_SCRIPT (or MEGATRON_DEEPSPEED) before launching",),
        )

    def parse(self, bundle: ExportBundle) -> dict:
        cfg = json.loads(bundle.text(CONFIG))
        text = bundle.text(ARGS)
        argv = read_bash_array(text, "AUTOPAR_ARGS")
        ds = read_bash_array(text, "DS_ARGS")
        return view_from_deepspeed(cfg, argv, ds, parse_world(bundle))


def _flag(argv: list[str], name: str, default=None):
    if name in argv:
        i = argv.index(name)
        return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
    return default


def view_from_deepspeed(cfg: dict, argv: list[str], ds_argv: list[str], num_gpus: int) -> dict:
    tp = int(_flag(argv, "--tensor-model-parallel-size", 1))
    pp = int(_flag(argv, "--pipeline-model-parallel-size", 1))
    if _flag(argv, "--no-pipeline-parallel") and pp != 1:
        raise ValueError("--no-pipeline-parallel with pp > 1")
    dp = num_gpus // (tp * pp)
    stage = cfg["zero_optimization"]["stage"]
    if int(_flag(ds_argv, "--zero-stage")) != stage:
        raise ValueError("--zero-stage and ds_config.json zero_optimization.stage disagree")
    mbs, gbs, gas = cfg["train_micro_batch_size_per_gpu"], cfg["train_batch_size"], cfg["gradient_accumulation_steps"]
    if int(_flag(argv, "--micro-batch-size")) != mbs or int(_flag(argv, "--global-batch-size")) != gbs:
        raise ValueError("Megatron-DeepSpeed batch flags and ds_config.json disagree")
    if gbs != mbs * gas * dp:
        raise ValueError(f"train_batch_size {gbs} != {mbs} * {gas} * dp {dp}")
    n = int(_flag(argv, "--num-layers"))
    recompute, rl, _ = recompute_from(  # Megatron-DeepSpeed has no --recompute-modules
        _flag(argv, "--recompute-granularity"),
        _flag(argv, "--recompute-method"),
        int(_flag(argv, "--recompute-num-layers", 0)) or None,
        1,
    )
    offload = offload_share(cfg["zero_optimization"])
    if bool(_flag(argv, "--cpu-optimizer", False)) != (offload > 0):
        raise ValueError("--cpu-optimizer and ds_config.json zero_optimization.offload_optimizer disagree")
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    if bool(_flag(argv, "--bf16", False)) != bf16:
        raise ValueError("--bf16 and ds_config.json bf16.enabled disagree")
    return normalize(
        {
            "num_gpus": num_gpus,
            "tp": tp,
            "pp": pp,
            "vpp": 1,
            "cp": 1,
            "dp": dp,
            "ep": 1,
            "etp": tp,
            "sequence_parallel": bool(_flag(argv, "--sequence-parallel", False)),
            "zero_stage": stage,
            "micro_batch_size": mbs,
            "global_batch_size": gbs,
            NUM_MICROBATCHES: gas,
            "pp_schedule": "1f1b",
            "layout": (n // pp,) * pp,
            "recompute": recompute,
            "recompute_layers": rl,
            "dtype": "bf16" if bf16 else "fp32",
            "main_grads_fp32": cfg.get("data_types", {}).get("grad_accum_dtype", "fp32") == "fp32",
            "optimizer_offload": offload,
            # no TP overlap and no MoE: those fields read back as the plan's defaults (normalize)
        }
    )
