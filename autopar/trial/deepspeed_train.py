"""A tiny DeepSpeed training script: autopar's transformer under `deepspeed.initialize`, K steps.

Why: DeepSpeed has no trainer of its own. Its path is an exported `ds_config.json` loaded by a
training script, normally the user's Megatron-DeepSpeed `pretrain_gpt.py`; to measure a plan with
DeepSpeed itself without that checkout, autopar ships this script, which takes the same flags
(autopar.export.deepspeed `mds_args`, then `--deepspeed --deepspeed_config PATH --zero-stage Z`,
then the short-run flags of autopar.export.short_run) and ignores those it does not use:

    torchrun --standalone --nproc_per_node N autopar/trial/deepspeed_train.py <flags>

It runs data parallelism with ZeRO only (tp = pp = 1, no sequence parallelism; anything else exits
2 with one line pointing at Megatron-DeepSpeed), and only the model autopar builds (RMSNorm, SwiGLU,
RoPE, no biases: other shapes exit 2 likewise). Every step trains on a deterministic random batch
(autopar.trial.batch.synthetic_batch, the built-in trials' data). It prints nothing per step of its
own: DeepSpeed's logger is raised to INFO, so its ThroughputTimer line (`... RunningAvgSamplesPerSec=
..., CurrSamplesPerSec=..., MemAllocated=...GB, MaxMemAllocated=...GB`, rank 0) and, with
`wall_clock_breakdown`, its `time (ms) | fwd: .. | bwd: .. | step: ..` lines are what autopar
reads; one summary line ends the run. An out-of-memory error propagates as it is.

Sources (DeepSpeed 0.19.8): deepspeed/__init__.py `initialize`; runtime/engine.py `forward`,
`backward`, `step` (gradient accumulation over `gradient_accumulation_steps` micro-batches);
utils/logging.py `set_log_level_from_string`; Megatron-LM's `OptimizerParamScheduler` (the
warm-up and linear / cosine decay) and `get_param_groups` (no weight decay on 1-D parameters).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from autopar.errors import InputError
from autopar.spec.model import ModelSpec
from autopar.trial.batch import synthetic_batch
from autopar.trial.loss import cross_entropy
from autopar.trial.model import ModelConfig, Transformer, build_model
from autopar.trial.parallel.recompute import apply_ac

NAME = "autopar/trial/deepspeed_train.py"


def parser() -> argparse.ArgumentParser:
    """The pretrain_gpt.py flags this script reads (Megatron-DeepSpeed megatron/arguments.py names
    and defaults; `--deepspeed_config` is deepspeed.add_config_arguments')."""
    p = argparse.ArgumentParser(prog=NAME, description="autopar's model under DeepSpeed, K steps", allow_abbrev=False)
    add = p.add_argument
    add("--num-layers", type=int, required=True)
    add("--hidden-size", type=int, required=True)
    add("--ffn-hidden-size", type=int, default=None, help="default 4 x hidden size")
    add("--num-attention-heads", type=int, required=True)
    add("--kv-channels", type=int, default=None, help="default hidden size / heads")
    add("--num-key-value-heads", type=int, default=None, help="default: the attention heads (MHA)")
    add("--seq-length", type=int, required=True)
    add("--max-position-embeddings", type=int, default=None)
    add("--swiglu", action="store_true")
    add("--normalization", default="layernorm")
    add("--use-rotary-position-embeddings", action="store_true")
    add("--rope-theta", type=float, default=10000.0)
    add("--layernorm-epsilon", type=float, default=1e-5)
    add("--make-vocab-size-divisible-by", type=int, default=128)
    add("--untie-embeddings-and-output-weights", action="store_true")
    add("--disable-bias-linear", action="store_true")
    add("--tensor-model-parallel-size", type=int, default=1)
    add("--pipeline-model-parallel-size", type=int, default=1)
    add("--sequence-parallel", action="store_true")
    add("--micro-batch-size", type=int, required=True)
    add("--global-batch-size", type=int, default=None)
    add("--recompute-granularity", choices=("full", "selective"), default=None)
    add("--recompute-method", choices=("uniform", "block"), default=None)
    add("--recompute-num-layers", type=int, default=1)
    add("--bf16", action="store_true")
    add("--deepspeed_config", "--deepspeed-config", dest="deepspeed_config", required=True)
    add("--zero-stage", type=int, default=None)
    add("--vocab-size", type=int, required=True)
    add("--train-iters", type=int, required=True)
    add("--seed", type=int, default=1234)
    add("--lr", type=float, default=3.0e-4)
    add("--min-lr", type=float, default=0.0)
    add("--lr-decay-style", choices=("constant", "linear", "cosine"), default="linear")
    add("--lr-decay-iters", type=int, default=None, help="default: --train-iters")
    add("--lr-warmup-iters", type=int, default=0)
    add("--weight-decay", type=float, default=0.01)
    add("--adam-beta1", type=float, default=0.9)
    add("--adam-beta2", type=float, default=0.999)
    add("--adam-eps", type=float, default=1e-8)
    return p


def refusal(args: argparse.Namespace) -> str | None:
    """The one line a plan this script cannot run gets (checked before torch.distributed starts)."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if tp > 1 or pp > 1 or args.sequence_parallel:
        sp = ", sequence parallel" if args.sequence_parallel else ""
        return (
            f"{NAME}: this script runs data parallel with ZeRO only (tp = pp = 1, no sequence parallelism), "
            f"got tp = {tp}, pp = {pp}{sp}: run this plan with your own Megatron-DeepSpeed pretrain_gpt.py "
            f"(set MEGATRON_DEEPSPEED to its checkout)"
        )
    return None


def model_config(args: argparse.Namespace) -> ModelConfig:
    """autopar's model of the flags' shape; raises InputError / ValueError for a shape it cannot build.
    Vocabulary: --vocab-size padded to --make-vocab-size-divisible-by (Megatron
    `_vocab_size_with_padding` at tp = 1), the rows autopar's cost model prices. Megatron's
    NullTokenizer adds one EOD id before padding (vocab_size + 1, megatron/core/tokenizers/text/
    libraries/null_tokenizer.py in megatron-core 0.16.1); this script does not."""
    h, heads = args.hidden_size, args.num_attention_heads
    spec = ModelSpec(
        name="deepspeed-train",
        num_layers=args.num_layers,
        hidden_size=h,
        ffn_hidden_size=args.ffn_hidden_size or 4 * h,
        num_attention_heads=heads,
        num_kv_heads=args.num_key_value_heads or heads,
        head_dim=args.kv_channels or h // heads,
        vocab_size=args.vocab_size,
        seq_len=max(args.seq_length, args.max_position_embeddings or 0),
        gated_mlp=args.swiglu,
        tied_embeddings=not args.untie_embeddings_and_output_weights,
        norm="rmsnorm" if args.normalization == "rmsnorm" else "layernorm",
        linear_bias=not args.disable_bias_linear,
        learned_position_embeddings=not args.use_rotary_position_embeddings,
    )
    unit = args.make_vocab_size_divisible_by
    return ModelConfig(
        spec=spec,
        vocab_rows=-(-args.vocab_size // unit) * unit,
        max_seq_len=args.seq_length,
        rope_theta=args.rope_theta,
        norm_eps=args.layernorm_epsilon,
    )


def read_ds_config(args: argparse.Namespace) -> dict:
    """The ds_config without autopar's own keys: DeepSpeed reads the top-level keys it knows and
    ignores the rest, but a key starting with "_" is a comment by convention (the "_autopar"
    header), so none is handed on. Batch keys missing from the file come from the flags, as
    Megatron-DeepSpeed fills them; raises ValueError where the file and the flags disagree."""
    with open(args.deepspeed_config, encoding="utf-8") as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    cfg.setdefault("train_micro_batch_size_per_gpu", args.micro_batch_size)
    if args.global_batch_size is not None:
        cfg.setdefault("train_batch_size", args.global_batch_size)
    checks = [
        (
            "train_micro_batch_size_per_gpu",
            cfg["train_micro_batch_size_per_gpu"],
            "--micro-batch-size",
            args.micro_batch_size,
        ),
        ("bf16.enabled", bool(cfg.get("bf16", {}).get("enabled", False)), "--bf16", args.bf16),
    ]
    if args.global_batch_size is not None:
        checks.append(("train_batch_size", cfg["train_batch_size"], "--global-batch-size", args.global_batch_size))
    if args.zero_stage is not None:
        stage = cfg.get("zero_optimization", {}).get("stage", 0)
        checks.append(("zero_optimization.stage", stage, "--zero-stage", args.zero_stage))
    for key, value, flag, flag_value in checks:
        if value != flag_value:
            raise ValueError(f"{args.deepspeed_config}: {key} is {value} but {flag} says {flag_value}")
    return cfg


def lr_factor(args: argparse.Namespace) -> Callable[[int], float]:
    """Step -> learning rate / --lr: Megatron's OptimizerParamScheduler.get_lr (linear warm-up,
    then constant, linear or cosine decay to --min-lr over --lr-decay-iters, --min-lr after)."""
    top, low, warm = args.lr, args.min_lr, args.lr_warmup_iters
    decay = args.lr_decay_iters or args.train_iters

    def factor(step: int) -> float:
        if warm > 0 and step <= warm:
            return step / warm
        if args.lr_decay_style == "constant":
            return 1.0
        if step > decay:
            return low / top
        ratio = (step - warm) / max(decay - warm, 1)
        coeff = 1.0 - ratio if args.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return (low + coeff * (top - low)) / top

    return factor


def optimizer(model: torch.nn.Module, args: argparse.Namespace, cfg: dict) -> torch.optim.Optimizer | None:
    """AdamW with Megatron's weight-decay groups (none on 1-D parameters: norms, biases); None when
    the ds_config names its own optimizer (DeepSpeed builds it). Under ZeRO-Offload DeepSpeed's
    DeepSpeedCPUAdam, as Megatron-DeepSpeed's --cpu-optimizer builds it (engine.py raises on another
    client optimizer while `zero_force_ds_cpu_optimizer` is on, its default); on a GPU torch's fused
    AdamW, the counterpart of Megatron's apex FusedAdam."""
    if "optimizer" in cfg:
        return None
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
    ]
    kwargs = {"lr": args.lr, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_eps}
    offload = cfg.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    if offload in ("cpu", "nvme"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # type: ignore[import-untyped]

        return DeepSpeedCPUAdam(groups, adamw_mode=True, **kwargs)
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(groups, fused=fused or None, **kwargs)


def recompute(model: Transformer, args: argparse.Namespace) -> None:
    """Megatron's recompute flags on autopar's model (autopar.trial.parallel.recompute): selective
    checkpoints the attention core; full every block (--recompute-method uniform: each group of
    --recompute-num-layers blocks is recomputed, so all are) or the first N (block)."""
    if args.recompute_granularity == "selective":
        apply_ac(model, "selective")
    elif args.recompute_granularity == "full":
        block = args.recompute_method == "block"
        apply_ac(model, "full", range(args.recompute_num_layers) if block else None)


def skip_shared_memory_op() -> None:
    """On the CPU accelerator DeepSpeed's TorchBackend JIT-builds its shared-memory op
    (deepspeed/comm/torch.py `build_shm_op`, csrc/cpu/comm/shm.cpp) before init_process_group. The op
    serves only `inference_all_reduce`; training's collectives are torch.distributed's (gloo here).
    The build takes 30 s or more, and a build that is killed leaves torch's FileBaton `lock` in the
    extensions directory, on which every later run waits for ever. On a GPU the CUDA accelerator has
    no such op, so skipping it here keeps the CPU run like the GPU one."""
    # by module name: the attribute `deepspeed.comm.torch` is torch itself (comm/__init__.py's star import)
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    if hasattr(ds_torch, "build_shm_op"):
        setattr(ds_torch, "build_shm_op", lambda: None)  # noqa: B010 - a module, typed as ModuleType


def train(args: argparse.Namespace, config: ModelConfig, cfg: dict) -> tuple[float, int]:
    """K optimizer steps under DeepSpeed on every rank: (the last step's loss, averaged over the
    ranks; DeepSpeed's train_batch_size)."""
    # no type information (no py.typed); imported here, so the module loads without deepspeed
    import deepspeed  # type: ignore[import-untyped]
    from deepspeed.accelerator import get_accelerator  # type: ignore[import-untyped]
    from deepspeed.utils import set_log_level_from_string  # type: ignore[import-untyped]

    set_log_level_from_string("info")  # the ThroughputTimer line is a logger.info (utils/timer.py)
    accel = get_accelerator()  # CPU under DS_ACCELERATOR=cpu or without CUDA (accelerator/real_accelerator.py)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(accel.device_name(local_rank))  # "cpu" or "cuda:<local rank>"
    if device.type != "cpu":
        accel.set_device(local_rank)
    else:
        skip_shared_memory_op()
    deepspeed.init_distributed(dist_backend=accel.communication_backend_name())
    # fp32 here; with bf16 on, initialize casts the parameters and keeps the buffers (the RoPE
    # tables) in fp32 (engine.py `_cast_module_mixed_precision`)
    model = build_model(config, args.seed, device)
    recompute(model, args)
    opt = optimizer(model, args, cfg)
    schedule = None if "scheduler" in cfg else (lambda o: torch.optim.lr_scheduler.LambdaLR(o, lr_factor(args)))
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), optimizer=opt, lr_scheduler=schedule, config=cfg
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    mbs, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    share = mbs * accum  # this rank's rows of the global batch (tp = pp = 1: every rank is a dp rank)
    last = torch.zeros((), device=device)
    for step in range(args.train_iters):
        tokens, targets = synthetic_batch(args.seed, step, share * world, args.seq_length, config.spec.vocab_size)
        rows = slice(rank * share, (rank + 1) * share)
        last = torch.zeros((), device=device)
        for x, y in zip(tokens[rows].to(device).split(mbs), targets[rows].to(device).split(mbs)):
            loss = cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            last = last + loss.detach().float() / accum
    dist.all_reduce(last)
    return float(last.item()) / world, engine.train_batch_size()


def prepare(args: argparse.Namespace) -> tuple[ModelConfig, dict]:
    """The model config and the ds_config of the flags; raises ValueError with the one line to print
    for a plan or a shape this script cannot run."""
    problem = refusal(args)
    if problem is not None:
        raise ValueError(problem)
    try:
        return model_config(args), read_ds_config(args)
    except (InputError, ValueError, OSError) as e:
        raise ValueError(f"{NAME}: {e}") from e


def main(argv: list[str] | None = None) -> int:
    args, _ = parser().parse_known_args(argv)
    try:
        config, cfg = prepare(args)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    loss, batch = train(args, config, cfg)
    if dist.get_rank() == 0:
        print(
            f"{NAME}: {args.train_iters} steps done, world {dist.get_world_size()}, "
            f"train_batch_size {batch}, last loss {loss:.4f}",
            flush=True,
        )
    # without it the process aborts after the last step (the gloo / NCCL group torn down at exit)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
