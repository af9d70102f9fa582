"""How each training program allocates memory: one `MemoryStack` per program, every switch with
the trainer file or measurement it comes from (autopar.cost.gpu_memory prices them).

The estimate picks the stack from the priced cluster (`stack_name`): its `training_stack`, which
the trainer's performance profile sets ("megatron": Megatron-Core; "torch": the built-in model's
accounting, as before; or any name of STACKS, e.g. "torchtitan"), and autopar's built-in model on
the `local` profile (autopar.cost.torch_stack,
checked against live tensor bytes). A run that names its own program (`MemoryFacts.stack`) is
priced with that program's stack: NeMo/Bridge, Megatron-DeepSpeed, nanotron, llm-foundry,
fms-fsdp, Meta's Llama 3 stack.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autopar.spec.hardware import LOCAL, ClusterSpec


@dataclass(frozen=True)
class MemoryFacts:
    bf16_optimizer_states: bool = False  # Adam m and v in bf16 (--use-precision-aware-optimizer)
    stack: str | None = None  # the program (memory_stacks.STACKS); None = the plan's trainer's
    era_2022: bool = False  # torch 1.x (eager CUDA module loading) and NCCL before lazy connection
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryStack:
    """What a program keeps for the backward and beside it (bytes per element where it says)."""

    name: str
    title: str
    #: "megatron": Megatron-Core's preallocated buffers and fused kernels (autopar.cost.memory_terms);
    #: "torch": parameters and gradients as PyTorch FSDP/DDP/torch pipelining allocate them
    family: str
    #: the linear layers save their sequence-parallel input shard and all-gather it again in the
    #: backward (Megatron-Core `ColumnParallelLinear`, TE `LayerNormLinear`, nanotron
    #: `_ColumnLinearAsyncCommunication`); False = DTensor's ColwiseParallel saves the gathered copy
    saves_sp_shard: bool = True
    #: norms fused (TE, Triton, Inductor): input + fp32 1/rms; False = eager Llama RMSNorm, which
    #: upcasts to fp32 (a 4-byte copy saved by the square) and saves the normalised bf16 output
    #: for the weight product (torchtitan models/norms.py `RMSNorm`, norm_type "rmsnorm")
    fused_norm: bool = True
    #: [tokens, ffn] tensors a gated MLP saves, in 16-bit: 3 = Megatron `bias_swiglu` (fc1 output
    #: of width 2F, fc2 input F), 4 = eager SwiGLU (w1 x, w3 x, silu, product), 2 = compiled
    #: (Inductor recomputes silu and the product from w1 x, w3 x). A plain MLP saves 2 (fc1
    #: output, activation output) eager or fused, 1 compiled.
    gated_mlp_tensors: float = 3.0
    plain_mlp_tensors: float = 2.0
    #: keys and values repeated to every query head before attention (torchtitan 2024 Llama
    #: `repeat_kv`, the built-in model); flash and TE kernels read the groups directly
    repeats_kv: bool = False
    #: the attention output is copied contiguous for the output projection, which saves the copy
    #: beside the one SDPA keeps (torchtitan Llama `output.transpose(1, 2).contiguous()`, fms-fsdp
    #: likewise); flash-attn's varlen output is already laid out for it (nanotron, llm-foundry)
    copies_attention_output: bool = False
    #: what `recompute = "selective"` means: "core_attn" (Megatron --recompute-granularity
    #: selective, default module core_attn: the attention core is recomputed) or "op_sac"
    #: (torchtitan selective_ac_option "op": every op recomputed but the saved list, matmul
    #: outputs except every second, SDPA and reduce-scatter outputs)
    selective: str = "core_attn"
    #: Transformer Engine under FP8 saves the linear layers' inputs cast to FP8, 1 byte
    #: (transformer_engine/pytorch/module/linear.py, layernorm_linear.py: the quantized input kept
    #: for the wgrad GEMM); torchao float8 keeps the bf16 inputs (matmul_with_hp_or_float8_args)
    fp8_saves_fp8_inputs: bool = True
    #: FP8 weights: "te_cache" = bf16 parameters plus TE's cached FP8 copy and transpose of every
    #: linear weight, kept across microbatches and steps (+2 bytes/param; TE module/base.py
    #: `get_weight_workspace`, Megatron TELinear passes is_first_microbatch); "fp8_params" = the
    #: parameters themselves in FP8 with their transpose (2 bytes, --fp8-param-gather);
    #: "bf16" = torchao float8 casts on the fly and keeps only the bf16 weights
    fp8_weights: str = "te_cache"
    #: bytes per (token x vocab/tp) the loss keeps for the backward: 4 = fp32 softmax / log-probs
    #: (Megatron vocab-parallel CE, nanotron sharded CE, torch F.cross_entropy on fp32 logits),
    #: 2 = logits only with the gradient written in place (flash-attn fused cross-entropy)
    loss_saved_bytes: float = 4.0
    #: bytes per (token x vocab/tp) alive only while the loss runs, on top of the saved ones:
    #: Megatron's vocab-parallel cross-entropy upcasts the bf16 logits inside its forward and
    #: softmaxes the fp32 copy in place (megatron/core/tensor_parallel/cross_entropy.py), so the
    #: bf16 logits (2) live beside it, and its bf16 gradient beside the fp32 one in the backward;
    #: nanotron: bf16 logits + their fp32 cast beside the fp32 softmax (2 + 4); torchtitan: bf16
    #: logits + the fp32 logits the model returns, then the fp32 gradients of the log-softmax (8)
    loss_transient_bytes: float = 2.0
    #: each routed copy's expert output kept for the router-probability weighting of the unpermute
    #: (Megatron-Core before 0.13); later Megatron-Core multiplies the probabilities in the expert
    #: activation (megatron/core/transformer/moe/experts.py `activation_func_with_probs`), so the
    #: output is not kept
    moe_keeps_expert_output: bool = False
    #: ZeRO-0/1 gradients: "buffer" = fp32 (or bf16) main gradients in one preallocated buffer
    #: (Megatron ParamAndGradBuffer); "fp32_accum" = nanotron's FP32GradientAccumulator: fp32
    #: gradient buffer of every parameter, fp32 master weights sharded with ZeRO-1, and each
    #: microbatch's bf16 gradients alive until its backward ends; "deepspeed" = 16-bit
    #: gradients beside the 16-bit weights, fp32 master, Adam and an fp32 gradient partition
    #: sharded (DeepSpeed stage_1_and_2.py)
    grads: str = "buffer"
    #: a torch DDP reducer wraps ZeRO-0 data parallelism: its flat bucket buffers are a second
    #: copy of the gradients in the parameter dtype (`gradient_as_bucket_view=False`)
    ddp_buckets: bool = False
    #: FSDP2 with pipeline parallelism keeps each stage's parameters unsharded between
    #: microbatches (torchtitan parallelize.py `apply_fsdp`, reshard_after_forward_policy
    #: "default": False when pp is enabled); autopar's torchtitan export writes "always" for
    #: ZeRO-3 and "never" for ZeRO-2 (autopar/export/torchtitan.py RESHARD)
    pp_keeps_params_gathered: bool = False
    #: bytes per element of the torch family's sharded parameters, their gradients and each Adam
    #: moment: 4 = FSDP mixed precision over fp32 parameters (torchtitan: fp32 shards, bf16
    #: gathered for compute); 2 = a model cast to bf16 before it is sharded, whose gradients and
    #: Adam moments (torch.optim.AdamW: zeros_like(param)) are then bf16 too, with no fp32 copy
    param_bytes: float = 4.0
    #: the program always runs compiled by torch.compile (fms-fsdp); otherwise a plan's `compile`
    #: compiles it (`compiled`: fused elementwise ops save less, see `gated_mlp_tensors`)
    compiled: bool = False
    #: FSDP all-gathers FP8 weights under FP8 training (torchtitan enable_fsdp_float8_all_gather);
    #: off by default in torchtitan's float8 config and in autopar's export
    fp8_all_gather: bool = False
    #: CUDA context and the kernels loaded into it, GiB: 0.47 with lazy module loading (torch >= 2,
    #: A100, `torch.ones(1).cuda()`), 0.92 eager (torch 2.1.1), 1.78 eager on torch 1.10.2
    #: (stas00/ml-engineering training/performance/README.md @744d01e)
    cuda_context_gib: float = 0.47
    #: NCCL per communicator a rank uses, GiB: the first one +1.45 GiB (ml-engineering measured the
    #: device memory of a 2-GPU NCCL group after its first barrier: NCCL's kernels and buffers);
    #: each further one its buffers, 16 channels x 2 connections (ring, tree) x 8 MiB: the 4 MiB
    #: Simple-protocol buffer (NCCL_BUFFSIZE default, NVIDIA/nccl docs env.rst) and about as much for
    #: LL and LL128 (assumed). NCCL >= 2.22 connects lazily (NCCL_RUNTIME_CONNECT=1), allocating only
    #: for what a communicator runs; runs of 2022 pay every communicator as the first
    #: (autopar.cost.memory_overheads ERA_2022_CONTEXT_GIB)
    nccl_first_gib: float = 1.45
    nccl_more_gib: float = 0.25
    #: the caching allocator's reserved memory beyond the allocated peak, as a share of the memory
    #: that churns within a step (activations, gathered units, temporaries). With PyTorch's default
    #: allocator (reserved - allocated) / reserved averaged 15 % over eight LLM trainings on
    #: A100-80GB, which GMLake removes (Guo et al. ASPLOS 2024, arXiv 2401.08156: 9.2 GB saved on
    #: average, up to 25 GB), up to 43 % with interleaved pipelines and recompute (arXiv
    #: 2507.16274): 0.18 of the allocated bytes, of which about 60 % churn in such trainings
    #: (assumed), i.e. 0.3 of the churning bytes. Expandable segments
    #: (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) remove most of it. It counts in what
    #: torch.cuda.max_memory_reserved and nvidia-smi show, not in what must fit
    fragmentation: float = 0.3
    #: Llama 3's pipeline schedule runs N microbatches per round, not pp (Llama 3 paper
    #: arXiv 2407.21783 sec. 3.3.2, Figure 6: "in this case N = 5"); 0 = the trainer's (pp)
    pp_round: int = 0


MEGATRON_CORE = MemoryStack(
    name="megatron-core",
    title="Megatron-Core with Transformer Engine (Megatron-LM, NeMo, Megatron-Bridge)",
    family="megatron",
)
#: NeMo and Megatron-Bridge FP8 recipes gather FP8 parameters (Megatron-Bridge
#: training/mixed_precision.py bf16_with_fp8_* recipes: fp8_param_gather=True)
NEMO_BRIDGE = replace(MEGATRON_CORE, name="nemo-bridge", fp8_weights="fp8_params")
MEGATRON_DEEPSPEED = MemoryStack(
    name="megatron-deepspeed",
    title="Megatron-DeepSpeed: Megatron's model code under DeepSpeed ZeRO and its pipeline engine",
    family="megatron",
    moe_keeps_expert_output=True,
    grads="deepspeed",
    fp8_weights="te_cache",
)
TORCHTITAN = MemoryStack(
    name="torchtitan",
    title="torchtitan: FSDP2, DTensor TP, torch.distributed.pipelining, eager by default",
    family="torch",
    saves_sp_shard=False,
    fused_norm=False,
    gated_mlp_tensors=4.0,
    repeats_kv=True,
    copies_attention_output=True,
    selective="op_sac",
    fp8_saves_fp8_inputs=False,
    fp8_weights="bf16",
    loss_saved_bytes=4.0,
    loss_transient_bytes=8.0,
    grads="fsdp",
    fragmentation=0.05,  # torchtitan's run_train.sh sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
)
#: a torchtitan run with its own defaults (a published run): reshard_after_forward_policy "default"
TORCHTITAN_DEFAULT = replace(TORCHTITAN, name="torchtitan-default", pp_keeps_params_gathered=True)
#: NVIDIA NeMo AutoModel's MoE models: FSDP2 over TE kernels and DeepEP, the model cast to bf16
#: before sharding (nemo_automodel 0.1.0-0.3.0 components/models/deepseek_v3/model.py and
#: qwen3_moe/model.py `initialize_weights(dtype=torch.bfloat16)`: `self.to(dtype)`, called without
#: a dtype by components/checkpoint/checkpointing.py), so parameters, gradients and Adam moments are
#: bf16 (8 bytes per parameter, against torchtitan's 16)
AUTOMODEL = replace(
    TORCHTITAN_DEFAULT,
    name="automodel",
    title="NeMo AutoModel: FSDP2 with TE kernels and DeepEP, bf16 parameters and optimizer states",
    param_bytes=2.0,
)
#: torchtitan's 2024 Llama configs with norm_type "fused_rmsnorm": the Triton RMSNorm of
#: torchtitan/models/norms.py, which keeps its input and 1/rms (torchtitan README 2024, features:
#: "optional fused RMSNorm"); the other choice, "rmsnorm", is the eager norm of TORCHTITAN
TORCHTITAN_FUSED_NORM = replace(
    TORCHTITAN_DEFAULT,
    name="torchtitan-fused-norm",
    title="torchtitan (2024) with norm_type fused_rmsnorm",
    fused_norm=True,
)
#: its selective recompute re-runs the attention core alone (autopar/trial/parallel/recompute.py
#: apply_ac), not torchtitan's op-level policy
BUILTIN = replace(
    TORCHTITAN,
    name="autopar-builtin",
    title="autopar's built-in model (autopar.cost.torch_stack)",
    selective="core_attn",
)
NANOTRON = MemoryStack(
    name="nanotron",
    title="nanotron: eager PyTorch with its own TP/PP, flash-attn, Triton RMSNorm, FP32 gradient accumulation",
    family="torch",
    saves_sp_shard=True,
    fused_norm=True,
    gated_mlp_tensors=4.0,
    fp8_saves_fp8_inputs=False,
    fp8_weights="bf16",
    loss_saved_bytes=4.0,
    loss_transient_bytes=6.0,
    grads="fp32_accum",
    ddp_buckets=True,
)
LLM_FOUNDRY = replace(
    TORCHTITAN,
    name="llm-foundry",
    title="llm-foundry / Composer: PyTorch FSDP1, triton flash attention, flash-attn fused cross-entropy",
    fused_norm=True,  # MPT's low-precision LayerNorm: F.layer_norm saves input, mean and 1/std
    repeats_kv=False,
    copies_attention_output=False,
    loss_saved_bytes=2.0,  # llm-foundry loss_fn fused_crossentropy: the logits, gradient in place
    loss_transient_bytes=0.0,
    fragmentation=0.3,
)
FMS_FSDP = replace(
    TORCHTITAN,
    name="fms-fsdp",
    title="IBM fms-fsdp: PyTorch FSDP1 with torch.compile of the model and SDPA flash attention",
    compiled=True,
    fused_norm=True,
    gated_mlp_tensors=2.0,
    plain_mlp_tensors=1.0,
    repeats_kv=False,
    copies_attention_output=False,  # Inductor recomputes the contiguous copy from SDPA's output
    loss_saved_bytes=4.0,  # nn.CrossEntropyLoss on the bf16 logits: the logits and their log-softmax
    loss_transient_bytes=4.0,
    fragmentation=0.3,
)
META_4D = replace(
    MEGATRON_CORE,
    name="meta-4d",
    title="Meta's Llama 3 stack (FSDP + TP + PP + CP in PyTorch): Megatron-style fused accounting",
    pp_round=5,
)

STACKS = {
    s.name: s
    for s in (
        MEGATRON_CORE,
        NEMO_BRIDGE,
        MEGATRON_DEEPSPEED,
        TORCHTITAN,
        TORCHTITAN_DEFAULT,
        AUTOMODEL,
        TORCHTITAN_FUSED_NORM,
        BUILTIN,
        NANOTRON,
        LLM_FOUNDRY,
        FMS_FSDP,
        META_4D,
    )
}
#: the cluster's `training_stack` -> the program priced on a GPU cluster. A performance profile names
#: it (autopar/cost/data/profiles.toml `memory_stack`), and the search prices the trainers that share
#: a profile once (autopar.calibration.estimate `estimate_per_trainer`), so the program follows the priced
#: cluster, never a plan's trainer column. "megatron" and "torch" are the names profiles use today
#: ("torch" keeps its meaning, the built-in model's accounting: autopar.spec.hardware ClusterSpec);
#: any name of STACKS selects that program directly (e.g. "torchtitan" for torchtitan on GPUs).
LEGACY = {"megatron": MEGATRON_CORE.name, "torch": BUILTIN.name}


def stack_name(cluster: ClusterSpec) -> str:
    """The program whose allocation prices the cluster's plans: the built-in model on the `local`
    profile (what CPU trials run), else the cluster's training stack (Megatron-Core by default)."""
    if cluster.gpu.key == LOCAL:
        return BUILTIN.name
    name = cluster.training_stack or "megatron"
    return name if name in STACKS else LEGACY[name]


def compiled(stack: MemoryStack) -> MemoryStack:
    """The stack's activations under torch.compile: Inductor fuses the elementwise ops, so a norm
    keeps its input and 1/rms, SwiGLU its two projections (silu and the product recomputed), a
    plain MLP its fc1 output, and the attention output is not copied again."""
    return replace(
        stack,
        compiled=True,
        fused_norm=True,
        gated_mlp_tensors=2.0,
        plain_mlp_tensors=1.0,
        copies_attention_output=False,
    )
