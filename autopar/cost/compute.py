"""Compute time of one GPU per microbatch, in two steps (vectorised):

1. `raw_compute`: seconds at the GPU's published kernel rates (autopar.cost.kernels) with no trainer
   constant: GEMMs at the achievable rate and shape fall-off, attention at its kernels' rates,
   memory-bound kernels at the achieved HBM bandwidth, and how many layer passes a microbatch makes.
2. `assemble_compute`: the trainer profile's constants applied: each efficiency a fraction of the
   rate in step 1, the elementwise traffic factor, the fixed time per layer pass.

Step 1 runs once per plan; step 2 is a few array operations, so a fit of the constants re-runs it
alone (autopar.calibration.profile_fit). FLOPs follow Megatron's convention (autopar.cost.flops): backward
= 2 x forward for GEMMs; attention backward = 2.5 x forward (it recomputes QK^T:
Dao-AILab/flash-attention#1525).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from autopar.cost.flops import (
    attention_core_flops_per_token,
    attention_linear_flops_per_token,
    head_flops_per_token,
    mlp_flops_per_token,
)
from autopar.cost.gpu_memory import plan_shape
from autopar.cost.kernels import attention_seconds, gemm_rate, hbm_rate
from autopar.cost.memory_stacks import STACKS, compiled, stack_name
from autopar.cost.plan_arrays import PlanArrays
from autopar.cost.stack_activations import stack_layers
from autopar.spec.fp8_recipes import cast_bytes, expert_quantize_kernels, recipe_codes, wgrad_bf16
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.recompute_modules import MODULE_BITS
from autopar.spec.table import DISPATCH, DTYPE


class RawCompute(NamedTuple):
    """Seconds per microbatch of each costed rank ((C, n) arrays) at the published kernel rates."""

    gemm_bf16: np.ndarray  # BF16 / TF32 dense GEMMs (every one of a bf16 plan; the LM head of an FP8 one)
    gemm_fp8: np.ndarray  # FP8 dense GEMMs (the layers' GEMMs of an FP8 plan)
    expert_bf16: np.ndarray  # grouped expert GEMMs, at the dense rate of their shape
    expert_fp8: np.ndarray
    attention: np.ndarray  # the attention core
    elementwise: np.ndarray  # the stored activations' traffic at achieved HBM bandwidth
    traffic: np.ndarray  # fixed memory traffic: MoE permutation and router, FP8 casts
    layer_passes: np.ndarray  # layer forwards + backwards, a recomputed forward counting half
    moe_layer_passes: np.ndarray
    expert_passes: np.ndarray  # MoE layer passes x local experts
    #: kernels per local expert per MoE layer pass that quantize its FP8 GEMM inputs where the trainer
    #: quantizes expert by expert (autopar.spec.fp8_recipes.expert_quantize_kernels); 0 in BF16
    expert_quantize: np.ndarray
    recompute_flops: np.ndarray  # recomputed forward FLOPs (hardware FLOPs, not model FLOPs)


class ComputeTerms(NamedTuple):
    """Seconds per microbatch of each costed rank, with the profile's constants."""

    gemm: np.ndarray
    attention: np.ndarray
    elementwise: np.ndarray  # memory-bound non-GEMM kernels
    launch: np.ndarray  # fixed per-layer overhead on the GPU
    host: np.ndarray  # the host's time to issue the microbatch's kernels
    recompute_flops: np.ndarray

    def total(self) -> np.ndarray:
        """The GPU's time, or the host's where it issues the kernels slower than the GPU runs them
        (the host runs ahead of the GPU otherwise: CUDA's launches are asynchronous)."""
        return np.maximum(self.gemm + self.attention + self.elementwise + self.launch, self.host)


def raw_compute(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, rank_layers_act: np.ndarray) -> RawCompute:
    """3 x forward FLOPs (Megatron's convention) plus the recomputed forward, each GEMM class at its
    shape's rate; the attention core at its kernels' rates; the memory-bound kernels from the
    activation bytes they touch."""
    tf, tokens, share = x.tp_float, x.tokens, x.recompute_share
    fp8 = x.table.dtype == DTYPE["fp8"]
    lin_layer = x.dense_layers * (
        attention_linear_flops_per_token(model) + mlp_flops_per_token(model, False)
    ) + x.moe_layers * attention_linear_flops_per_token(model)
    expert_layer = x.moe_layers * mlp_flops_per_token(model, True) if model.moe else 0.0 * x.moe_layers
    head = tokens * x.has_head * head_flops_per_token(model, x.tp) / tf
    token_passes = tokens * (3 + share) / tf  # tokens x GEMM passes (forward, 2 backward, recomputed)
    recipe = recipe_codes(x.table)
    bf16 = np.where(fp8, DTYPE["bf16"], x.table.dtype)  # the LM head stays in BF16 under FP8
    # the weight-gradient GEMMs (1 of the 3 + share GEMM passes) a recipe runs in BF16
    hp = np.where(wgrad_bf16(recipe), 1.0 / (3 + share), 0.0)
    own_s = layer_gemm_seconds_per_flop(x, model, cluster, x.table.dtype)
    hp_s = layer_gemm_seconds_per_flop(x, model, cluster, bf16)
    dense_s, dense_hp_s = token_passes * (1 - hp) * own_s, token_passes * hp * hp_s
    head_s = 3 * head / gemm_rate(cluster, bf16, np.minimum(x.tokens, float(model.hidden_size)))
    expert_s = expert_hp_s = 0.0 * dense_s
    if model.moe:
        expert = tokens * expert_layer * (3 + share) / tf * expert_load(x)
        edim = expert_gemm_dim(x, model)
        expert_s = expert * (1 - hp) / gemm_rate(cluster, x.table.dtype, edim)
        expert_hp_s = expert * hp / gemm_rate(cluster, bf16, edim)
    fwd_core = tokens * (x.layers * attention_core_flops_per_token(model, x.seq_len)) / tf
    op_sac = STACKS[stack_name(cluster)].selective == "op_sac"
    op_sac_s, op_sac_flops = op_sac_recompute(x, model, cluster) if op_sac else (0.0, 0.0)
    # op-level SAC saves the attention's output: the core is recomputed only under full recompute
    recompute_core = np.where(x.selective & ~op_sac | x.full, np.where(x.full, share, 1.0), 0.0) * fwd_core
    dense_s = dense_s + op_sac_s
    attention = _attention_seconds(x, model, cluster, fwd_core, recompute_core)
    hbm = hbm_rate(cluster)
    fused = compiled_traffic_share(x, model, cluster)
    # op-level SAC saves no elementwise op's output: they all run again, as under full recompute
    ew_forwards = 1 + share + np.where(op_sac & x.selective & ~x.full, 1.0, 0.0)
    elementwise = (rank_layers_act * ew_forwards * fused + score_matrix_bytes(x, model, cluster)) / hbm
    traffic = (moe_traffic_bytes(x, model) + fp8_cast_elements(x, model) * cast_bytes(recipe)) / hbm
    passes = 1 + share / 2
    return RawCompute(
        gemm_bf16=np.where(fp8, head_s + dense_hp_s, dense_s + head_s),
        gemm_fp8=np.where(fp8, dense_s, 0.0),
        expert_bf16=np.where(fp8, expert_hp_s, expert_s),
        expert_fp8=np.where(fp8, expert_s, 0.0),
        attention=attention,
        elementwise=elementwise,
        traffic=traffic,
        layer_passes=x.layers * passes,
        moe_layer_passes=x.moe_layers * passes,
        expert_passes=x.moe_layers * passes * (model.moe.num_experts / x.ep if model.moe else 0.0),
        expert_quantize=expert_quantize_kernels(recipe) + 0.0 * x.moe_layers,
        recompute_flops=tokens * (lin_layer + expert_layer) * share / tf + recompute_core + op_sac_flops,
    )


def op_sac_recompute(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) per microbatch of the matmuls torchtitan's op-level selective AC runs again
    in the backward, on the plans with selective (not full) recompute. Its policy saves the outputs
    of the ops in its save list (mm, the SDPA kernels, reduce-scatter, max) "except every second mm"
    (torchtitan distributed/activation_checkpoint.py `_custom_policy`, counting a block's mms in
    forward order; models/llama3/infra/parallelize.py `_op_sac_save_list`): of wq wk wv wo, wk and wo
    are recomputed, and of the MLP's w1 w3 w2 the second, w3 (a plain MLP's w1 w2: w2). An MoE
    block's experts are priced as kept, as its memory is (autopar.cost.stack_activations)."""
    h = float(model.hidden_size)
    per_layer = x.dense_layers + x.moe_layers
    second_mlp = 2.0 * h * model.ffn_hidden_size  # w3 of a gated MLP, w2 of a plain one: h x ffn
    classes = (
        (per_layer * 2.0 * h * model.k_size, tp_gemm_dim(x, model, model.k_size)),
        (per_layer * 2.0 * h * model.attn_out_size, tp_gemm_dim(x, model, model.attn_out_size)),
        (x.dense_layers * second_mlp, tp_gemm_dim(x, model, model.ffn_hidden_size)),
    )
    on = x.selective & ~x.full
    tokens = np.where(on, x.tokens / x.tp_float, 0.0)
    seconds = flops = 0.0 * tokens
    for f, d in classes:
        seconds = seconds + tokens * f / gemm_rate(cluster, x.table.dtype, d)
        flops = flops + tokens * f
    return seconds, flops


def compiled_traffic_share(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec) -> np.ndarray | float:
    """The share of the eager elementwise traffic left under torch.compile, per plan (1 eager).

    Eager PyTorch runs every elementwise op as its own kernel, which reads its inputs from HBM and
    writes its output there; Inductor fuses a chain of them into one kernel that keeps the
    intermediates in registers, and its min-cut partitioner saves for the backward only what is
    cheaper to keep than to recompute (Ansel et al., "PyTorch 2", ASPLOS 2024, TorchInductor and
    AOTAutograd; torch/_functorch/partitioners.py `min_cut_rematerialization_partition`). So the
    tensors a layer materialises are those the memory stacks count (autopar.cost.stack_activations:
    eager RMSNorm's fp32 copy and normalised output, SwiGLU's four hidden tensors and the attention
    output's copy, against the norm input, the two projections and one output compiled), and the
    elementwise traffic is taken to scale with them: the bytes of one layer rebuilt in full (every
    tensor its forward keeps) on the compiled stack over the eager one, for the program that prices
    the cluster (its profile's `elementwise_traffic_factor` is fitted on eager runs of it and on
    compiled ones priced with this share). [UNCERTAIN] proportionality of traffic to saved tensors:
    a fused kernel still reads its inputs and writes what it saves, which this counts, but not the
    recomputed intermediates Inductor rebuilds in the backward (registers, no HBM traffic)."""
    stack = STACKS[stack_name(cluster)]
    on = np.asarray(x.table.compile, dtype=bool)
    if stack.compiled or not on.any():
        return 1.0
    shape = plan_shape(x, model, cluster)
    eager = stack_layers(stack, model, shape).working
    fused = stack_layers(compiled(stack), model, shape).working
    share = np.where(eager > 0, fused / np.where(eager > 0, eager, 1.0), 1.0)
    return np.where(on, share, 1.0)


def _attention_seconds(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, fwd_core, recompute_core):
    """Flash attention at its kernels' rates over the K/V length of one CP chunk; an attention that
    materialises its score matrix (attention_flash 0: Megatron before FlashAttention) computes all s^2
    scores (then masks) as batched GEMMs at the BF16 GEMM rate."""
    k = cluster.constants
    forwards = 1.0 + np.where(fwd_core > 0, recompute_core / np.maximum(fwd_core, 1e-30), 0.0)
    kv = x.seq_len / x.cp
    flash = attention_seconds(
        cluster,
        fwd_core,
        kv,
        model.qk_head_dim,
        forwards,
        k.attention_mma_sync,
        x.cp,
        k.attention_fa1,
        k.triton_attention_rate,
    )
    if k.attention_flash >= 1:
        return flash
    bmm = 2.0 * (3 * fwd_core + recompute_core) / gemm_rate(cluster, DTYPE["bf16"], model.qk_head_dim)
    return k.attention_flash * flash + (1 - k.attention_flash) * bmm


#: kernels one layer pass (forward + backward) launches: about 80 for a dense layer with fused kernels,
#: 240 for a DeepSeek-V3 MoE layer (963 kernels over 4 forward + 4 backward layers in
#: deepseek-ai/profile-data train.json @4496024, communication included), and 9 GEMMs per local
#: expert where the expert GEMMs are launched one by one (Transformer Engine's GroupedLinear runs one
#: cuBLAS GEMM per expert: 3 forward, 6 backward)
KERNELS_PER_PASS = {"layer": 80.0, "moe_layer": 160.0, "expert": 9.0}


def assemble_compute(raw: RawCompute, k) -> ComputeTerms:
    """The profile's constants on the raw seconds: efficiencies are fractions of the published rates."""
    expert = (raw.expert_bf16 / k.gemm_efficiency + raw.expert_fp8 / k.fp8_gemm_efficiency) / k.expert_gemm_efficiency
    gemm = raw.gemm_bf16 / k.gemm_efficiency + raw.gemm_fp8 / k.fp8_gemm_efficiency + expert
    # the sets of expert GEMMs launched: one per local expert per MoE layer pass where the trainer
    # launches per expert, one per MoE layer pass where one grouped kernel covers them (per_expert_gemms);
    # a trainer that launches per expert also quantizes each expert's FP8 inputs on its own, kernels
    # counted as part of its set at the same cost per kernel
    per_expert = 1.0 + raw.expert_quantize / KERNELS_PER_PASS["expert"]
    expert_sets = (
        k.per_expert_gemms * raw.expert_passes * per_expert + (1.0 - k.per_expert_gemms) * raw.moe_layer_passes
    )
    launch = (
        raw.layer_passes * k.layer_overhead_us
        + raw.moe_layer_passes * k.moe_layer_overhead_us
        + expert_sets * k.expert_launch_us
    ) * 1e-6
    # kernels the host issues through the framework's Python dispatch, and those a trainer that
    # launches expert by expert issues from a C++ loop (expert_host_launch_us: the bare launch)
    looped = k.per_expert_gemms * expert_sets * KERNELS_PER_PASS["expert"]
    kernels = (
        raw.layer_passes * KERNELS_PER_PASS["layer"]
        + raw.moe_layer_passes * KERNELS_PER_PASS["moe_layer"]
        + expert_sets * KERNELS_PER_PASS["expert"]
        - looped
    )
    return ComputeTerms(
        gemm=gemm,
        attention=raw.attention / k.attention_efficiency,
        elementwise=raw.elementwise * k.elementwise_traffic_factor + raw.traffic,
        launch=launch,
        host=(kernels * k.host_launch_us + looped * k.expert_host_launch_us) * 1e-6,
        recompute_flops=raw.recompute_flops,
    )


def module_recompute(
    x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, raw: RawCompute, modules: np.ndarray
) -> RawCompute:
    """The raw seconds with Megatron-Core's --recompute-modules of GEMMs added: each listed module's
    forward runs once more in the backward (megatron/core/transformer/transformer_config.py
    `recompute_modules`):
    - "mlp": the dense MLP of the dense layers (transformer_layer.py checkpoints `self.mlp` when it is
      not a MoELayer);
    - "shared_experts": the MoE layers' shared experts;
    - "mla_up_proj": MLA's query and key/value up-projections (and the RoPE applied after them);
    - "moe": the whole MoE layer, router, dispatch, routed and shared experts, combine
      (moe/moe_layer.py MoELayer.forward wraps them in one tensor_parallel.checkpoint): its expert
      GEMMs, permutation traffic and fixed per-layer time once more (its all-to-alls:
      autopar.cost.comm.ep_calls with `recompute_share`).
    "core_attn" is priced with the attention (`raw_compute`: x.selective); "layernorm" and "moe_act"
    re-run memory-bound kernels only (`elementwise_recompute_bytes`, no GEMM FLOPs). `modules`: (n,)
    bitmasks of autopar.spec.recompute_modules MODULE_BITS (PlanArrays.recompute_modules); a plan's
    recompute share already counts its own recomputed forwards."""

    def has(name):
        return (np.asarray(modules) & MODULE_BITS[name]) > 0

    tf, tokens, share = x.tp_float, x.tokens, x.recompute_share
    fp8 = x.table.dtype == DTYPE["fp8"]
    *_, (mlp_flops, mlp_dim) = dense_gemm_shapes(x, model)
    dense_mlp = np.where(has("mlp"), mlp_flops, 0.0)
    up = np.where(has("mla_up_proj"), x.layers * 2.0 * model.mla_up_projection_params, 0.0)
    q_dim = tp_gemm_dim(x, model, model.q_size)
    dtype = x.table.dtype
    gemm = tokens * (dense_mlp / gemm_rate(cluster, dtype, mlp_dim) + up / gemm_rate(cluster, dtype, q_dim)) / tf
    expert_fwd_bf16 = raw.expert_bf16 / (3 + share)
    expert_fwd_fp8 = raw.expert_fp8 / (3 + share)
    shared_share, moe_on = 0.0, has("moe")
    if model.moe:
        m = model.moe
        shared_share = m.shared_expert_ffn_hidden_size / (
            m.expert_ffn_hidden_size * m.top_k + m.shared_expert_ffn_hidden_size
        )
    experts = np.where(moe_on, 1.0, np.where(has("shared_experts"), shared_share, 0.0))
    traffic = (
        np.where(moe_on, moe_traffic_bytes(x, model) / (2.0 + share), 0.0)
        + elementwise_recompute_bytes(x, model, has("layernorm"), has("moe_act") & ~moe_on)
    ) / hbm_rate(cluster)
    moe_passes = np.where(moe_on, x.moe_layers * 0.5, 0.0)  # a recomputed forward counts half a pass
    recomputed = tokens * (dense_mlp + up) / tf
    if model.moe:
        expert_flops = x.moe_layers * mlp_flops_per_token(model, True)
        recomputed = recomputed + tokens * expert_flops * experts / tf
    return raw._replace(
        gemm_bf16=raw.gemm_bf16 + np.where(fp8, 0.0, gemm),
        gemm_fp8=raw.gemm_fp8 + np.where(fp8, gemm, 0.0),
        expert_bf16=raw.expert_bf16 + experts * expert_fwd_bf16,
        expert_fp8=raw.expert_fp8 + experts * expert_fwd_fp8,
        traffic=raw.traffic + traffic,
        moe_layer_passes=raw.moe_layer_passes + moe_passes,
        expert_passes=raw.expert_passes + moe_passes * (model.moe.num_experts / x.ep if model.moe else 0.0),
        recompute_flops=raw.recompute_flops + recomputed,
    )


def elementwise_recompute_bytes(x: PlanArrays, model: ModelSpec, norms, act) -> np.ndarray:
    """HBM bytes per microbatch of the output-discarding recomputes (Megatron-Core
    `recompute_modules` "layernorm", "moe_act": transformer_layer.py / experts.py rebuild the
    discarded output in the backward from the kept input): each rebuilt output is written once and
    its input read once. Per layer the two norms read and write h per token (on the 1/tp sequence
    shard under SP); per MoE layer each of the k routed copies' activation reads the fc1 output (2F
    gated, F else) and writes F, on the busiest expert rank's share (`expert_load`)."""
    local = x.tokens / np.where(x.sequence_parallel, x.tp_float, 1.0)
    norm_bytes = np.where(norms, x.layers * local * 2 * 2 * model.hidden_size * x.act_bytes, 0.0)
    if model.moe is None:
        return norm_bytes
    m = model.moe
    f = m.expert_ffn_hidden_size / x.etp.astype(float)
    per_copy = ((3 if model.gated_mlp else 2) * f) * x.act_bytes
    act_bytes = x.moe_layers * x.tokens * m.top_k * x.etp / x.tp_float * per_copy * expert_load(x)
    return norm_bytes + np.where(act, act_bytes, 0.0)


def score_matrix_bytes(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec) -> np.ndarray:
    """HBM bytes of the attention score matrices per microbatch when they are materialised
    (attention_flash 0): per layer the stored 5as^2 bytes of Korthikanti et al. 2022 Table 2 (QK^T
    and softmax outputs 2as^2 each, the dropout mask as^2) per sequence, over the tp ranks; written in
    the forward, read in the backward and rebuilt by a recompute of the attention core."""
    k = cluster.constants
    passes = 2.0 + np.where(x.full, x.recompute_share, np.where(x.selective, 1.0, 0.0))
    per_layer = 5.0 * model.num_attention_heads * x.seq_len**2 * x.micro_batch / x.tp_float
    return (1 - k.attention_flash) * x.layers * per_layer * passes


def expert_load(x: PlanArrays) -> np.ndarray:
    """The busiest expert rank's tokens over the mean: dropless dispatch computes whatever the router
    sends (the routing imbalance, an input: 1 when forced-balanced; the busiest of ep ranks holds
    at most ep times the mean, so 1 without expert parallelism), capacity dispatch pads every
    expert to its capacity (x capacity factor: Megatron --moe-pad-expert-input-to-capacity)."""
    dropless = np.minimum(np.full(len(x.table), x.routing_imbalance), x.ep)
    return np.where(x.table.moe_dispatch == DISPATCH["capacity"], x.table.capacity_factor, dropless)


def moe_traffic_bytes(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """HBM bytes of the MoE token shuffling per microbatch: permute (read T x h, write k T x h) and
    unpermute (read k T x h, write T x h) in the forward and again in the backward, plus the router's
    fp32 logits, softmax and top-k over E experts (Megatron-Core moe_utils permute / unpermute,
    router.py); a recomputed layer repeats its forward."""
    if not model.moe:
        return 0.0 * x.moe_layers
    m = model.moe
    local = x.tokens / np.where(x.sequence_parallel, x.tp_float, 1.0)
    per_pass = local * (2.0 * (m.top_k + 1) * model.hidden_size * x.act_bytes + 3 * 4.0 * m.num_experts)
    return x.moe_layers * per_pass * (2.0 + x.recompute_share)


def fp8_cast_elements(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """Elements of the FP8 GEMMs' inputs that Transformer Engine / torchao quantize per microbatch,
    each moving its recipe's bytes (autopar.spec.fp8_recipes `cast_bytes`: 4 for TE's fused
    cast-transpose): in the forward the activations, in the backward the output gradients
    (TransformerEngine fp8 recipe docs; the weights are cast once per step, not counted). Per token
    on one GPU: the QKV and FC1 inputs are whole under TP, the row-parallel inputs a 1/tp slice;
    routed experts see k copies of the tp-local tokens, gathered over etp."""
    h, tf = model.hidden_size, x.tp_float
    g = 3 if model.gated_mlp else 2

    def mlp(ffn, copies=1.0):
        return copies * (h + ffn / tf), copies * ((g - 1) * ffn / tf + h)

    attn_in, attn_grad = h + model.q_size / tf, (model.q_size + model.k_size + model.v_size) / tf + h
    dense_in, dense_grad = mlp(model.ffn_hidden_size)
    moe_in = moe_grad = 0.0
    if model.moe:
        m = model.moe
        etp = x.etp.astype(float)
        moe_in, moe_grad = mlp(m.expert_ffn_hidden_size / etp * tf, m.top_k * etp / tf)
        shared_in, shared_grad = mlp(m.shared_expert_ffn_hidden_size) if m.shared_expert_ffn_hidden_size else (0, 0)
        moe_in, moe_grad = moe_in + shared_in, moe_grad + shared_grad
    inputs = x.layers * attn_in + x.dense_layers * dense_in + x.moe_layers * moe_in
    grads = x.layers * attn_grad + x.dense_layers * dense_grad + x.moe_layers * moe_grad
    return x.tokens * (inputs * (1.0 + x.recompute_share) + grads)


def dense_gemm_shapes(x: PlanArrays, model: ModelSpec) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(forward FLOPs per token of the plan's layers, smallest per-GPU dimension) of each class of a
    layer's dense GEMMs; each GEMM runs at its own shape's rate (its forward, data-gradient and
    weight-gradient GEMMs share its three dimensions, permuted). Per GPU under TP (Megatron's
    column- and row-parallel linears, Shoeybi et al. 2019 sec. 3):
    - QKV: tokens x h -> (q + k + v) / tp; the output projection: tokens x attn_out / tp -> h, so
      only it pays the fall-off of the heads' slice (the MLA projections, whose low-rank down
      projections are not TP-split, count as one class at q / tp);
    - MLP: tokens x h -> g ffn / tp and tokens x ffn / tp -> h, smallest ffn / tp."""
    h = float(model.hidden_size)
    attn = attention_linear_flops_per_token(model)
    per_layer = x.dense_layers + x.moe_layers
    attention: tuple[tuple[np.ndarray, np.ndarray], ...] = ((per_layer * attn, tp_gemm_dim(x, model, model.q_size)),)
    if model.mla is None:
        qkv = 2.0 * h * (model.q_size + model.k_size + model.v_size)
        attention = (
            (per_layer * qkv, tp_gemm_dim(x, model, model.q_size + model.k_size + model.v_size)),
            (per_layer * (attn - qkv), tp_gemm_dim(x, model, model.attn_out_size)),
        )
    return (
        *attention,
        (x.dense_layers * mlp_flops_per_token(model, False), tp_gemm_dim(x, model, model.ffn_hidden_size)),
    )


def tp_gemm_dim(x: PlanArrays, model: ModelSpec, width: float) -> np.ndarray:
    """The smallest dimension of a layer GEMM between the hidden size and a TP-split `width`:
    tokens, h or width / tp."""
    return np.minimum(np.minimum(x.tokens, float(model.hidden_size)), width / x.tp_float)


def layer_gemm_seconds_per_flop(x: PlanArrays, model: ModelSpec, cluster: ClusterSpec, dtype) -> np.ndarray:
    """Seconds of the plan's layers' dense GEMMs per token per forward FLOP-pass at `dtype`: the sum
    over the GEMM classes of FLOPs / rate at that class's shape (`dense_gemm_shapes`)."""
    total = 0.0 * x.tokens
    for flops, dim in dense_gemm_shapes(x, model):
        total = total + flops / gemm_rate(cluster, dtype, dim)
    return total


def expert_gemm_dim(x: PlanArrays, model: ModelSpec) -> np.ndarray:
    """The smallest dimension of one local expert's GEMMs: the tokens it receives per microbatch
    (top-k copies of the EP group's tokens over the experts) or its ffn slice (ffn / etp); the
    hidden size is never the smaller in practice."""
    mo = model.moe
    assert mo is not None  # a MoE model
    per_expert = x.micro_batch * x.seq_len * mo.top_k * x.ep * x.etp / (mo.num_experts * x.tp * x.cp)
    return np.minimum(per_expert, mo.expert_ffn_hidden_size / x.etp.astype(float))
