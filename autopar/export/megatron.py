"""Megatron-LM `pretrain_gpt.py`: the flags of a plan, and launch scripts (torchrun, and srun with
one task per GPU).

Flag names are Megatron-LM's (Megatron-LM arguments.py; at HEAD they are generated from the
TransformerConfig / ModelParallelConfig / DistributedDataParallelConfig field names, `_` -> `-`).
The Megatron-Core mapping (autopar/export/megatron_core.py, shared with NeMo 2 and Megatron-Bridge):
- schedules: 1F1B, or interleaved 1F1B when vpp > 1;
- recompute: selective (core attention; with the plan's modules `--recompute-modules m1 m2 ...`,
  Megatron-Core transformer_config.py recompute_modules), full with `uniform` 1 (every layer), or full with
  `block` N (the first N layers of every model chunk, so N*vpp layers per pipeline rank);
- ZeRO: 0 = DDP, 1 = distributed optimizer, 2 / 3 = Megatron-FSDP with the `optim_grads` /
  `optim_grads_params` sharding strategy;
- MoE capacity dispatch: `--moe-expert-capacity-factor F --moe-token-drop-policy probs
  --moe-pad-expert-input-to-capacity` (every expert computes its full capacity, as autopar prices it);
- uneven pipeline layouts: see autopar/export/layouts.py.
What Megatron-Core cannot run (GPipe, zero-bubble, partial recompute off the vpp grid, TP overlap
without SP, MoE biases with etp > 1, ...) is refused from its capability table
(autopar/spec/data/trainers.toml [megatron]) before any exporter runs: autopar.export.capabilities.
The flags are read back (the plan they express) in autopar/export/megatron_parse.py.
"""

from __future__ import annotations

from autopar.cost.flops import VOCAB_DIVISOR
from autopar.export.base import Context, ExportBundle, Exporter, ExportFile
from autopar.export.bash import bash_array, number_word, read_bash_array
from autopar.export.header import comment_header, tp_overlap
from autopar.export.launch import Entry, launch_files, parse_world, run_hint
from autopar.export.layouts import megatron_layout
from autopar.export.megatron_core import (
    ZERO_FSDP_STRATEGY,
    activation_offload_settings,
    capacity_settings,
    dispatcher_settings,
    fp8_settings,
    mxfp8_param_settings,
    offload_settings,
    optimizer_instances,
    recompute_settings,
)
from autopar.export.megatron_parse import view_from_megatron_argv
from autopar.export.presubmit import Required
from autopar.export.production import checkpoint_interval, megatron_family_env, uses_megatron_fsdp
from autopar.export.short_run import short_run

__all__ = ["ZERO_FSDP_STRATEGY", "MegatronExporter", "recompute_settings", "view_from_megatron_argv"]


# ---- flags --------------------------------------------------------------------------------------


def _moe_layer_freq(mask: tuple[bool, ...]) -> str:
    runs: list[list[int]] = []
    for x in mask:
        v = int(x)
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def model_args(ctx: Context) -> list[str]:
    m, s = ctx.model, ctx.seq_len
    a = [
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
    if m.num_kv_heads != m.num_attention_heads and m.mla is None:
        a += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    a += ["--seq-length", str(s), "--max-position-embeddings", str(max(s, m.seq_len))]
    if m.gated_mlp:
        a += ["--swiglu"]
    a += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    a += ["--position-embedding-type", "learned_absolute" if m.learned_position_embeddings else "rope"]
    a += model_fact_args(ctx)
    if not m.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if not m.linear_bias:
        a += ["--disable-bias-linear"]
        if m.qkv_bias:
            a += ["--add-qkv-bias"]
    if m.qk_norm:
        a += ["--qk-layernorm"]
    if not m.dropout:
        a += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if m.mla is not None:
        ml = m.mla
        a += ["--multi-latent-attention"]
        if ml.q_lora_rank is not None:
            a += ["--q-lora-rank", str(ml.q_lora_rank)]
        a += [
            "--kv-lora-rank",
            str(ml.kv_lora_rank),
            "--qk-head-dim",
            str(ml.qk_nope_head_dim),
            "--qk-pos-emb-head-dim",
            str(ml.qk_rope_head_dim),
            "--v-head-dim",
            str(ml.v_head_dim),
        ]
    if m.moe is not None:
        a += moe_args(ctx)
    return a


def moe_args(ctx: Context) -> list[str]:
    """The MoE model's Megatron-LM flags: experts, routing, dispatcher and capacity."""
    m = ctx.model
    mo = m.moe
    assert mo is not None  # a MoE model
    a = [
        "--num-experts",
        str(mo.num_experts),
        "--moe-router-topk",
        str(mo.top_k),
        "--moe-ffn-hidden-size",
        str(mo.expert_ffn_hidden_size),
    ]
    if mo.shared_expert_ffn_hidden_size:
        a += ["--moe-shared-expert-intermediate-size", str(mo.shared_expert_ffn_hidden_size)]
    if mo.first_k_dense or mo.layer_freq != 1:
        a += ["--moe-layer-freq", _moe_layer_freq(m.moe_layer_mask)]
    if mo.router_bias:
        a += ["--moe-router-enable-expert-bias"]
    if 1 < mo.router_group_topk < mo.router_groups:  # group-limited (DeepSeek-V3: node-limited) routing
        a += ["--moe-router-num-groups", str(mo.router_groups), "--moe-router-group-topk", str(mo.router_group_topk)]
    disp = dispatcher_settings(ctx)
    a += ["--moe-token-dispatcher-type", disp["moe_token_dispatcher_type"]]
    if "moe_flex_dispatcher_backend" in disp:
        a += ["--moe-flex-dispatcher-backend", disp["moe_flex_dispatcher_backend"]]
    if disp.get("overlap_moe_expert_parallel_comm"):
        a += ["--overlap-moe-expert-parallel-comm"]
    a += ["--moe-grouped-gemm"]
    cap = capacity_settings(ctx)
    if cap:
        a += [
            "--moe-expert-capacity-factor",
            f"{cap['moe_expert_capacity_factor']:g}",
            "--moe-token-drop-policy",
            cap["moe_token_drop_policy"],
            "--moe-pad-expert-input-to-capacity",
        ]
    return a


def model_fact_args(ctx: Context) -> list[str]:
    """What Megatron-LM would otherwise take from its own defaults: the RoPE base (default 10000;
    `--rotary-base`, an int in Megatron-LM arguments.py), the norms' epsilon (`--norm-epsilon`,
    default 1e-5: TransformerConfig.layernorm_epsilon's argparse name in megatron-core 0.16.1
    transformer_config.py) and the vocabulary padding the cost model priced (autopar.cost.flops
    padded_vocab: a multiple of 128 x tp), all from the model spec and written even when they equal
    today's defaults, so a changed default cannot change the model."""
    m = ctx.model
    a = []
    if not m.learned_position_embeddings and m.rope_theta is not None:
        if not float(m.rope_theta).is_integer():
            raise ctx.refuse(
                f"Megatron-LM's --rotary-base is an integer and the model's rope_theta is {m.rope_theta:g}"
            )
        a += ["--rotary-base", str(int(m.rope_theta))]
    if m.norm_epsilon is not None:
        a += ["--norm-epsilon", number_word(m.norm_epsilon)]
    a += ["--make-vocab-size-divisible-by", str(VOCAB_DIVISOR)]
    return a


def parallel_args(ctx: Context) -> list[str]:
    p, m = ctx.plan, ctx.model
    a = ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp)]
    lay = megatron_layout(ctx.stages, p.pp, p.vpp)
    if lay.layers_per_virtual_stage is not None:
        a += ["--num-layers-per-virtual-pipeline-stage", str(lay.layers_per_virtual_stage)]
    if lay.virtual_stages_per_rank is not None:
        a += ["--num-virtual-stages-per-pipeline-rank", str(lay.virtual_stages_per_rank)]
    if lay.first is not None:
        a += ["--decoder-first-pipeline-num-layers", str(lay.first)]
    if lay.last is not None:
        a += ["--decoder-last-pipeline-num-layers", str(lay.last)]
    if lay.layout is not None:
        a += ["--pipeline-model-parallel-layout", lay.layout]
    a += ["--context-parallel-size", str(p.cp)]
    if m.moe is not None:
        a += ["--expert-model-parallel-size", str(p.ep), "--expert-tensor-parallel-size", str(p.etp)]
    if p.sequence_parallel:
        a += ["--sequence-parallel"]
    if p.zero_stage >= 1:
        a += ["--use-distributed-optimizer"]
    if (instances := optimizer_instances(p)) > 1:  # hybrid sharding: the optimizer sharded within dp_shard ranks
        a += ["--num-distributed-optimizer-instances", str(instances)]
    if p.zero_stage >= 2:
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", ZERO_FSDP_STRATEGY[p.zero_stage]]
        # Megatron-FSDP cannot fuse gradient accumulation into the wgrad GEMM (Megatron-Bridge 0.3.1
        # training/config.py turns gradient_accumulation_fusion off with use_megatron_fsdp; Megatron-LM
        # leaves it on unless told)
        a += ["--no-gradient-accumulation-fusion"]
    a += ["--overlap-grad-reduce"]
    if p.zero_stage >= 1:
        a += ["--overlap-param-gather"]
    if tp_overlap(p):
        a += ["--tp-comm-overlap"]
    for name, value in offload_settings(p).items():  # the optimizer shard's share in host memory
        flag = "--" + name.replace("_", "-")
        a += [flag] if value is True else [flag, str(value)]
    return a


def batch_args(ctx: Context) -> list[str]:
    p = ctx.plan
    return ["--micro-batch-size", str(p.micro_batch_size), "--global-batch-size", str(p.global_batch_size)]


def recompute_args(ctx: Context) -> list[str]:
    r = recompute_settings(ctx)
    a = []
    if "recompute_granularity" in r:
        a += ["--recompute-granularity", r["recompute_granularity"]]
    if ctx.plan.recompute_modules is not None:  # Megatron-LM arguments.py: a list, --recompute-modules m1 m2
        a += ["--recompute-modules", *r["recompute_modules"]]
    if "recompute_method" in r:
        a += ["--recompute-method", r["recompute_method"], "--recompute-num-layers", str(r["recompute_num_layers"])]
    offload = activation_offload_settings(ctx.plan)
    if offload["fine_grained_activation_offloading"]:  # Megatron-LM arguments.py: a list, --offload-modules m1 m2
        a += ["--fine-grained-activation-offloading", "--offload-modules", *offload["offload_modules"]]
    return a


def precision_args(ctx: Context) -> list[str]:
    p = ctx.plan
    a = []
    if p.dtype in ("bf16", "fp8"):
        a += ["--bf16"]
    if p.dtype == "fp8":
        a += ["--fp8-format", "hybrid"]
        for name, value in fp8_settings(ctx).items():
            a += ["--" + name.replace("_", "-"), str(value)]
        if p.fp8_param_gather_used:  # parameters kept and all-gathered in FP8
            a += ["--fp8-param-gather"]
        a += ["--" + name.replace("_", "-") for name in mxfp8_param_settings(ctx)]
    if not p.main_grads_fp32 and p.dtype != "fp32":
        a += ["--grad-reduce-in-bf16"]
    return a


#: what USER_ARGS reads from the environment (checked before sbatch: autopar.export.presubmit)
USER_REQUIRES = (
    Required("DATA_PATH", "dataset", "a Megatron indexed dataset prefix (PREFIX.bin and PREFIX.idx)"),
    Required("TOKENIZER", "name_or_path", "a HuggingFace tokenizer name or path"),
)

USER_ARGS = """# Fill in: data, tokenizer, schedule and checkpoints (not part of the plan).
USER_ARGS=(
  --data-path "${DATA_PATH:?set DATA_PATH to a Megatron indexed dataset prefix}"
  --split 99,1,0
  --tokenizer-type HuggingFaceTokenizer
  --tokenizer-model "${TOKENIZER:?set TOKENIZER to a HuggingFace tokenizer name or path}"
  --train-iters "${TRAIN_ITERS:-1000}"
  --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 100
  --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
  --log-interval 1 --eval-interval 1000 --eval-iters 10
  --save "${CHECKPOINT_DIR:-$HERE/checkpoints}" --load "${CHECKPOINT_DIR:-$HERE/checkpoints}"
)
"""


def checkpoint_args(ctx: Context) -> list[str]:
    """Save every Young/Daly interval of the goodput model (autopar.export.production); Megatron-FSDP
    saves and loads only the fsdp_dtensor format (Megatron-Bridge 0.3.1 training/config.py asserts
    ckpt_format == "fsdp_dtensor" with use_megatron_fsdp). Paths: USER_ARGS."""
    steps = checkpoint_interval(ctx).steps
    a = ["--save-interval", str(steps)] if steps is not None else []
    if uses_megatron_fsdp(ctx):
        a += ["--ckpt-format", "fsdp_dtensor"]
    return a


def megatron_argv(ctx: Context) -> list[tuple[str, list[str]]]:
    return [
        ("model shape", model_args(ctx)),
        ("parallelism", parallel_args(ctx)),
        ("batch", batch_args(ctx)),
        ("recompute", recompute_args(ctx)),
        ("precision", precision_args(ctx)),
        ("checkpoints", checkpoint_args(ctx)),
    ]


class MegatronExporter(Exporter):
    name = "megatron"
    title = "Megatron-LM pretrain_gpt.py: flags + torchrun and srun (one task per GPU) launch scripts"
    example = "autopar export --run reports/run --rank 1 --to megatron --out launch/"
    description = (
        "megatron_args.sh (AUTOPAR_ARGS: model shape and facts (RoPE base, norm epsilon, vocab padding), "
        "every parallel, batch, recompute, precision and overlap flag, and the checkpoint interval; USER_ARGS: "
        "data and tokenizer to fill in, checkpoints under CHECKPOINT_DIR), launch_torchrun.sh (per node) and "
        "launch_slurm.sbatch (srun, one task per GPU). Set MEGATRON_LM to your Megatron-LM checkout."
    )

    def _render(self, ctx: Context) -> ExportBundle:
        short = short_run(ctx.options.short_run_steps)
        args = (
            comment_header(ctx)
            + "# Megatron-LM flags for pretrain_gpt.py; sourced by the launch scripts.\n"
            + bash_array("AUTOPAR_ARGS", megatron_argv(ctx))
            + (short.megatron_user_args(ctx.model.vocab_size) if short else USER_ARGS)
        )
        env = megatron_family_env(ctx)
        entry = Entry(
            program='"$MEGATRON_LM/pretrain_gpt.py"',
            args='"${AUTOPAR_ARGS[@]}" "${USER_ARGS[@]}"',
            setup=("MEGATRON_LM=${MEGATRON_LM:-/opt/Megatron-LM}", 'source "$HERE/megatron_args.sh"'),
            env=env.set,
            unset=env.unset,
            one_task_per_gpu=True,
            requires=(() if short else USER_REQUIRES)
            + (
                Required("MEGATRON_LM", "checkout", "your Megatron-LM checkout", "pretrain_gpt.py", "/opt/Megatron-LM"),
            ),
        )
        notes = ["set MEGATRON_LM, DATA_PATH and TOKENIZER (and review USER_ARGS) before launching"]
        if ctx.plan.zero_stage >= 2:
            notes.append("ZeRO-2/3 map to Megatron-FSDP (--use-megatron-fsdp); it needs a Megatron-LM from 2025 on")
        if ctx.model.moe is not None and ctx.plan.moe_dispatcher == "deepep":
            notes.append(
                "the deepep dispatcher (--moe-token-dispatcher-type flex) needs DeepEP built in the "
                "environment (github.com/deepseek-ai/DeepEP)"
            )
        if ctx.plan.dtype == "fp8" or tp_overlap(ctx.plan):
            notes.append("FP8 and --tp-comm-overlap need Transformer Engine (--transformer-impl transformer_engine)")
        return ExportBundle(
            format=self.name,
            files=(ExportFile("megatron_args.sh", args), *launch_files(ctx, entry)),
            run=run_hint(ctx),
            notes=tuple(notes),
        )

    def parse(self, bundle: ExportBundle) -> dict:
        argv = read_bash_array(bundle.text("megatron_args.sh"), "AUTOPAR_ARGS")
        return view_from_megatron_argv(argv, parse_world(bundle))
