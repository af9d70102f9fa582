"""Each memory mechanism of autopar.cost.memory_stacks against a hand count of the tensors the
program keeps (the code each figure is read from is named in memory_stacks / stack_activations)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar.calibration.memory_facts import nanotron_layout
from autopar.calibration.row_cells import row_offloaded, row_recompute_modules
from autopar.cost.memory_stacks import STACKS, MemoryFacts, stack_name
from autopar.cost.memory_terms import memory_breakdown
from autopar.cost.price import prepare
from autopar.cost.stack_activations import PlanShape, dense_layer, moe_layer
from autopar.spec.hardware import GIB, LOCAL_DEFAULTS, cluster_from_dict, default_cluster
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.recompute_modules import MODULE_BITS
from autopar.spec.table import PlanTable

LLAMA3_8B = get_preset("llama3-8b")  # h 4096, ffn 14336, 32 heads, 8 KV heads of 128, SwiGLU
H100 = default_cluster("h100-sxm")


def shape(tokens=8192, tp=1, sp=False, fp8=False, selective=False, modules=0, flash=1.0, seq=8192) -> PlanShape:
    a = np.array
    return PlanShape(
        tokens=a([float(tokens)]),
        tp=a([float(tp)]),
        sp=a([sp]),
        cp=a([1]),
        etp=a([1]),
        act_bytes=a([2.0]),
        fp8=a([fp8]),
        selective=a([selective]),
        modules=a([modules]),
        flash=flash,
        seq_len=seq,
    )


def per_token(stack: str, model=LLAMA3_8B, **kw) -> float:
    s = shape(**kw)
    return float(dense_layer(STACKS[stack], model, s)[0] / s.tokens[0])


def breakdown(plan: ParallelPlan, model, cluster=H100, seq=8192, facts=None):
    p = prepare(PlanTable.from_plans([plan]), model, cluster, num_gpus=plan.num_gpus, seq_len=seq, every_rank=True)
    return p, memory_breakdown(p.x, model, cluster, p.params, facts)


# ---- activations ---------------------------------------------------------------------------------


def test_megatron_bf16_layer_is_korthikanti() -> None:
    # Korthikanti Table 2 generalised, 16-bit, tp 1: norm inputs 4h, QKV and MLP inputs 4h,
    # Q/K/V 2(4096 + 1024 + 1024), attention output 2*4096, SwiGLU fc1 output 2*2F + fc2 input 2F
    assert per_token("megatron-core") == 16384 + 16384 + 12288 + 8192 + 6 * 14336 == 139_264


def test_transformer_engine_fp8_saves_fp8_linear_inputs() -> None:
    # under FP8 the QKV, MLP and fc2 inputs are the 1-byte quantized copies and the output
    # projection keeps its own 1-byte copy of the attention output: 16384 + 8192 + 12288 +
    # (8192 + 4096) + (4*14336 + 14336)
    assert per_token("megatron-core", fp8=True) == 16384 + 8192 + 12288 + 12288 + 5 * 14336 == 120_832


def test_attention_without_flash_keeps_the_scores_unless_selective() -> None:
    # Korthikanti §4.1: softmax output 2, dropout mask 1, dropout output 2 bytes per score,
    # heads x s scores per token, sharded by tp: 5 a s / t
    gpt = replace(get_preset("gpt3-175b"), dropout=True)
    flash = per_token("megatron-core", model=gpt, tp=8, sp=True, seq=2048)
    plain = per_token("megatron-core", model=gpt, tp=8, sp=True, seq=2048, flash=0.0)
    assert plain - flash == pytest.approx(5 * 96 * 2048 / 8)
    assert per_token("megatron-core", model=gpt, tp=8, sp=True, seq=2048, flash=0.0, selective=True) == flash


def test_torchtitan_eager_layer_by_hand() -> None:
    # eager RMSNorm x2: fp32 input copy 4h + normalised bf16 2h + fp32 1/rms 4; the two gathered
    # linear inputs 2h each; Q + K, V repeated to 32 heads: 2(4096 + 4*2048); attention output
    # twice (SDPA's and the contiguous copy wo saves) 2*2*4096; log-sum-exp 4*32; SwiGLU 4 x 2F
    expect = 2 * (16384 + 8192 + 4) + 2 * 8192 + 2 * (4096 + 4 * 2048) + 16384 + 128 + 8 * 14336
    assert per_token("torchtitan") == expect == 221_320


def test_torchtitan_op_sac_keeps_every_other_matmul() -> None:
    # the block input 2h and the outputs of wq (2q), wv (2v), w1 (2F), w2 (2h), SDPA (2o + 4 a)
    s = shape(selective=True)
    got = float(dense_layer(STACKS["torchtitan"], LLAMA3_8B, s)[0] / 8192)
    assert got == 8192 + 8192 + 2048 + 28672 + 8192 + 8192 + 128 == 63_616


def test_compiled_swiglu_and_norms_keep_less() -> None:
    # fms-fsdp (torch.compile): fused norms 2h each, gathered linear inputs 2h each, Q/K/V unrepeated,
    # one attention output, log-sum-exp, SwiGLU's two projections
    expect = 2 * 8192 + 2 * 8192 + 12288 + 8192 + 128 + 2 * 2 * 14336
    assert per_token("fms-fsdp") == expect


def test_megatron_recompute_modules() -> None:
    layernorm = per_token("megatron-core", modules=MODULE_BITS["layernorm"])
    assert per_token("megatron-core") - layernorm == 16384  # the two norm outputs (QKV, MLP inputs)
    mlp = per_token("megatron-core", modules=MODULE_BITS["mlp"])
    assert per_token("megatron-core") - mlp == 6 * 14336


def test_moe_keeps_no_expert_output_since_probabilities_moved_into_the_activation() -> None:
    # Qwen3-30B-A3B-like MoE layer, 8 routed copies per token: the expert output (2h each) is kept
    # only by the older unpermute-with-probabilities path (Megatron-DeepSpeed's stack here)
    model = get_preset("qwen3-30b-a3b")
    s = shape(tokens=4096)
    core = moe_layer(STACKS["megatron-core"], model, s)[0]
    old = moe_layer(STACKS["megatron-deepspeed"], model, s)[0]
    assert old - core == pytest.approx(4096 * model.moe.top_k * 2 * model.hidden_size)
    act = moe_layer(STACKS["megatron-core"], model, s._replace(modules=np.array([MODULE_BITS["moe_act"]])))[0]
    assert core - act == pytest.approx(4096 * model.moe.top_k * 2 * model.moe.expert_ffn_hidden_size)


# ---- states --------------------------------------------------------------------------------------


def test_te_fp8_weight_cache_vs_fp8_parameters() -> None:
    # Megatron-LM FP8 keeps TE's FP8 weight and transpose beside the bf16 weights: +2 bytes per
    # linear parameter (llama3-8b tp1: 32 layers x (4096*6144 + 4096*4096 + 3*4096*14336) =
    # 6,979,321,856, and the 32*2*4096 + 4096 norm weights the estimate counts with them);
    # NeMo/Bridge gather FP8 parameters (FP8 + transpose = the 2 bytes of bf16)
    plan = ParallelPlan(dp=8, global_batch_size=64, dtype="fp8")
    _, fp8 = breakdown(plan, LLAMA3_8B)
    _, bf16 = breakdown(plan.with_(dtype="bf16"), LLAMA3_8B)
    _, bridge = breakdown(plan, LLAMA3_8B, facts=MemoryFacts(stack="nemo-bridge"))
    assert fp8.weights[0, 0] - bf16.weights[0, 0] == pytest.approx(2 * (6_979_321_856 + 32 * 2 * 4096 + 4096))
    assert bridge.weights[0, 0] == bf16.weights[0, 0]


def test_fsdp2_keeps_pipeline_stages_unsharded_under_torchtitans_default_policy() -> None:
    plan = ParallelPlan(pp=2, dp=4, zero_stage=3, trainer="torchtitan", global_batch_size=32)
    p, export = breakdown(plan, LLAMA3_8B, facts=MemoryFacts(stack="torchtitan"))
    _, default = breakdown(plan, LLAMA3_8B, facts=MemoryFacts(stack="torchtitan-default"))
    params = p.params.total[0, 0]
    assert default.weights[0, 0] - export.weights[0, 0] == pytest.approx(2 * params)  # bf16, the whole stage
    assert export.buffers[0, 0] - default.buffers[0, 0] == pytest.approx(2 * 2 * p.params.dense_layer_max[0])
    assert export.weights[0, 0] == pytest.approx(4 * params / 4)  # fp32 shards
    assert export.gradients[0, 0] == pytest.approx(4 * params / 4 + 4 * params)  # + fp32 accumulation under PP


def test_automodel_holds_parameters_gradients_and_adam_in_bf16() -> None:
    # NeMo AutoModel casts its MoE models to bf16 before sharding: 2-byte shards, gradients and
    # Adam moments (8 bytes per parameter against torchtitan's 16), the same bf16 stage gathered
    # under pipelining
    plan = ParallelPlan(pp=2, dp=4, zero_stage=3, trainer="torchtitan", global_batch_size=32)
    p, titan = breakdown(plan, LLAMA3_8B, facts=MemoryFacts(stack="torchtitan-default"))
    _, auto = breakdown(plan, LLAMA3_8B, facts=MemoryFacts(stack="automodel"))
    params = p.params.total[0, 0]
    assert auto.weights[0, 0] == pytest.approx(2 * params / 4 + 2 * params)  # bf16 shards + the gathered stage
    assert titan.weights[0, 0] == pytest.approx(4 * params / 4 + 2 * params)
    assert auto.gradients[0, 0] == pytest.approx(2 * params / 4 + 2 * params)  # + bf16 accumulation under PP
    assert auto.optimizer[0, 0] == pytest.approx(2 * 2 * params / 4)  # Adam m and v in bf16
    assert titan.optimizer[0, 0] == pytest.approx(2 * 4 * params / 4)
    assert auto.activations[0, 0] == titan.activations[0, 0]


def test_nanotron_states() -> None:
    # FP32GradientAccumulator: bf16 weights 2, fp32 gradient buffer 4, fp32 master + Adam 12 sharded
    # with ZeRO-1; under ZeRO-0 with dp > 1 torch DDP's bf16 buckets add 2 to the gradients
    nano = MemoryFacts(stack="nanotron")
    torch_cluster = replace(H100, training_stack="torch")
    p, z1 = breakdown(
        ParallelPlan(tp=8, dp=4, zero_stage=1, global_batch_size=32), LLAMA3_8B, torch_cluster, facts=nano
    )
    params = p.params.total[0, 0]
    assert z1.weights[0, 0] == pytest.approx(2 * params)
    assert z1.optimizer[0, 0] == pytest.approx(12 * params / 4)
    _, z0 = breakdown(
        ParallelPlan(tp=8, dp=4, zero_stage=0, global_batch_size=32), LLAMA3_8B, torch_cluster, facts=nano
    )
    assert z0.gradients[0, 0] == pytest.approx(6 * params)
    assert z0.optimizer[0, 0] == pytest.approx(12 * params)


def test_deepspeed_fp16_zero1_partition_and_bucket() -> None:
    # DeepSpeed fp16 ZeRO-1: 16-bit gradients, fp32 master + Adam + an fp32 gradient partition
    # (16/d), a reduce bucket of 5e8 16-bit elements
    plan = ParallelPlan(
        tp=8, pp=4, dp=4, zero_stage=1, main_grads_fp32=False, trainer="deepspeed", global_batch_size=64
    )
    p, b = breakdown(plan, LLAMA3_8B, facts=MemoryFacts(stack="megatron-deepspeed"))
    params = p.params.total[0, 0]
    assert b.gradients[0, 0] == pytest.approx(2 * params)
    assert b.optimizer[0, 0] == pytest.approx(16 * params / 4)
    assert b.buffers[0, 0] == pytest.approx(1e9)


# ---- runtime and allocator -----------------------------------------------------------------------


def test_reserved_device_and_required() -> None:
    plan = ParallelPlan(tp=4, pp=2, dp=4, global_batch_size=64)
    _, b = breakdown(plan, LLAMA3_8B, facts=MemoryFacts(stack="nanotron"))
    stack = STACKS["nanotron"]
    assert np.allclose(b.reserved - b.allocated, stack.fragmentation * (b.activations + b.buffers))
    assert np.allclose(b.device - b.reserved, b.cuda_context + b.nccl)
    assert np.allclose(b.required, b.allocated + b.cuda_context + b.nccl)
    # rank 0 of tp4 pp2 dp4: tensor, pipeline, data groups (no Megatron groups on this program)
    assert b.nccl[0, 0] == pytest.approx((1.45 + 2 * 0.25) * GIB)
    assert b.cuda_context[0, 0] == pytest.approx(0.47 * GIB)


def test_2022_runs_pay_every_communicator_in_full() -> None:
    # NCCL before lazy connection: each communicator as the first (1.45 GiB); torch 1.10's eager
    # context 1.78 GiB. Rank 0 of tp8 pp12 dp4 on Megatron: tp, pp, dp, model-parallel, embedding
    plan = ParallelPlan(tp=8, pp=12, dp=4, zero_stage=1, trainer="deepspeed", global_batch_size=64)
    model = replace(LLAMA3_8B, num_layers=48)
    _, b = breakdown(plan, model, facts=MemoryFacts(stack="megatron-deepspeed", era_2022=True))
    assert b.nccl[0, 0] == pytest.approx(5 * 1.45 * GIB)
    assert b.cuda_context[0, 0] == pytest.approx(1.78 * GIB)


def test_the_program_follows_the_priced_cluster_not_the_plans_trainer() -> None:
    # the search prices the trainers that share a performance profile once (estimate_per_trainer):
    # the program is the priced cluster's, the `local` profile's is the built-in model
    local = cluster_from_dict(LOCAL_DEFAULTS, origin="local defaults")
    assert stack_name(local) == "autopar-builtin"
    assert stack_name(H100) == "megatron-core"
    assert stack_name(replace(H100, training_stack="torch")) == "autopar-builtin"  # its meaning so far
    # (FP8 parameters named: Megatron-Bridge's FP8 recipe gathers them, Megatron-LM's default does not)
    plan = ParallelPlan(tp=2, dp=4, global_batch_size=32, dtype="fp8", fp8_param_gather="on")
    _, megatron = breakdown(plan, LLAMA3_8B)
    _, bridge = breakdown(plan.with_(trainer="bridge"), LLAMA3_8B)
    assert megatron.required[0, 0] == bridge.required[0, 0]


# ---- facts of published rows ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,modules",
    [
        ("selective: norm, act", {"layernorm", "moe_act"}),
        ("selective: layernorm, moe", {"layernorm", "moe"}),
        ("selective: moe_act, layernorm", {"layernorm", "moe_act"}),
        ("selective: mlp (dense layers) + mla up_proj", {"mlp", "mla_up_proj"}),
        (
            "selective: moe_act, layernorm + fine-grained activation offloading (expert_fc1, moe_act)",
            {"layernorm", "moe_act", "offload_expert_fc1", "offload_moe_act"},
        ),
        ("moe_act, layernorm (B.2)", {"layernorm", "moe_act"}),
        ("up_proj, mlp (B.2); Table 17 lists mlp, mla_up_proj, moe_act, layernorm", {"mla_up_proj", "mlp"}),
        ("selective: all RMSNorm + MLA up-projections (Sec 3.2.3)", {"layernorm", "mla_up_proj"}),
        ("selective (attention core only)", set()),
        ("selective (layer)", set()),
        ("none (B.2)", set()),
        ("full", set()),
    ],
)
def test_recompute_modules_of_a_row(text, modules) -> None:
    read = set(row_recompute_modules(text)) | {f"offload_{m}" for m in row_offloaded(text)}
    assert read == modules


def test_nanotron_layout_by_compute_cost() -> None:
    # costs: a layer 4 a d h + 3 h F, the LM head V h; a rank takes blocks until the cumulative cost
    # passes its share, that block included. 1.34B (16 layers, h 2048, F 8192, V 131072): the head
    # is 4 layers, total 20, rank 0's share 10 -> layers 1..11 on rank 0
    small = replace(LLAMA3_8B, num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32,
                    num_kv_heads=32, head_dim=64, vocab_size=131072)  # fmt: skip
    assert nanotron_layout(small, 2).stages == (11, 5)
    # 80B (80 layers, h 8192, F 28672): the head is 1.10 layers; rank 0's share 81.1/32 = 2.53 -> 3
    big = replace(small, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                  num_kv_heads=64, head_dim=128)  # fmt: skip
    stages = nanotron_layout(big, 32).stages
    assert stages[0] == 3 and sum(stages) == 80
