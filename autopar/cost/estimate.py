"""The estimate: memory, time and throughput of every plan in a PlanTable, in one vectorised pass.

`estimate_table` is the single source of truth; `estimate` (one plan) runs it on a one-row table.
Contract: pure and deterministic; never raises on an infeasible or invalid plan: it returns
`valid`/`fits` and the reasons.

Step time (per pipeline): every candidate rank's time per microbatch = compute + exposed TP, CP,
EP and PP communication; the pipeline runs at the pace of its slowest stage, so
pipeline time = m * max_rank(t_mb) / (1 - bubble fraction); then the exposed DP communication and
the optimizer step of the slowest rank. Memory is checked on the most loaded candidate rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar.cost import activations as act
from autopar.cost.collectives import Links, place
from autopar.cost.comm import (cp_calls, moe_stat_calls, dp_calls, ep_calls, grad_reductions_per_step, pp_calls,
                               tp_calls, tp_step_calls, traffic)
from autopar.cost.compute import attention_rate, gemm_rate
from autopar.cost.flops import (attention_core_flops_per_token, attention_linear_flops_per_token,
                                head_flops_per_token, mlp_flops_per_token, model_flops_per_step)
from autopar.cost.memory import precision_bytes, state_bytes
from autopar.cost.params import rank_params
from autopar.cost.pipeline import bubble_fraction, microbatches_in_flight
from autopar.cost.torch_stack import torch_stack_memory
from autopar.spec.hardware import GIB, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.rules import check_rules
from autopar.spec.stages import stage_profiles
from autopar.spec.table import DTYPE, RECOMP, PlanTable

AXES = ("tp", "cp", "ep", "pp", "dp")
TIME_TERMS = ("compute", "tp", "cp", "ep", "pp", "dp", "bubble", "optimizer")
MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations", "other")

#: optimizer step traffic per parameter of the local optimizer shard: read grad (4), master,
#: m, v (12); write master, m, v (12) and the bf16 weight (2); plus grad zeroing (4)
OPTIMIZER_BYTES_PER_PARAM = 34.0


def estimate_table(table: PlanTable, model: ModelSpec, cluster: ClusterSpec, *, num_gpus: int | None = None,
                   seq_len: int | None = None, routing_imbalance: float = 1.0) -> dict[str, np.ndarray]:
    """Every estimate column for every plan of the table."""
    with np.errstate(divide="ignore", invalid="ignore"):  # invalid plans (e.g. FP8 on A100) are marked, not warned
        return _estimate_table(table, model, cluster, num_gpus, seq_len, routing_imbalance)


def _estimate_table(table, model, cluster, num_gpus, seq_len, routing_imbalance) -> dict[str, np.ndarray]:
    s = seq_len or model.seq_len
    k = cluster.constants
    links = Links.of(cluster)
    st = stage_profiles(table, model)
    rules = check_rules(table, model, num_gpus=num_gpus, cluster=cluster, seq_len=s, stages=st)

    t, p, d, c, e, et, v = (table.tp, table.pp, table.dp, table.cp, table.ep, table.etp, table.vpp)
    tf = t.astype(float)
    sp = table.sequence_parallel.astype(bool)
    b = table.micro_batch_size.astype(float)
    m = table.num_microbatches.astype(float)
    m = np.maximum(m, 1.0)
    tokens = b * s / c  # tokens of one microbatch on one CP rank
    edp = np.maximum(1, (t * c * d) // np.maximum(e * et, 1))

    # every pipeline rank: arrays shaped (R, n); `active` marks ranks the plan has
    active = st.active
    dense_l, moe_l = st.dense_layers.astype(float), st.moe_layers.astype(float)
    layers = dense_l + moe_l
    emb, head = st.has_embedding.astype(float), st.has_head.astype(float)
    rank = st.rank

    # recompute: share of a rank's layers whose forward is recomputed
    full = table.recompute == RECOMP["full"]
    rl = np.where(table.recompute_layers < 0, np.inf, table.recompute_layers)
    recompute_share = np.where(full, np.minimum(1.0, rl / np.maximum(layers, 1.0)), 0.0)
    selective = table.recompute == RECOMP["selective"]
    fp32 = table.dtype == DTYPE["fp32"]
    act_bytes = np.where(fp32, 4.0, 2.0)
    act_scale = act_bytes / 2.0  # the activation formulas are for 2-byte activations
    weight_bytes, _ = precision_bytes(fp32)

    # ---- memory ----------------------------------------------------------------------------
    prm = rank_params(model, dense_l, moe_l, emb, head, t, p, e, et)
    states = state_bytes(prm.dense, prm.expert, table.zero_stage, d * c, edp, table.main_grads_fp32, fp32, p)
    a_dense = act.dense_layer_bytes(model, tokens, t, sp) * act_scale
    a_moe = (act.moe_layer_bytes(model, tokens, t, et) if model.moe else np.zeros_like(a_dense)) * act_scale
    a_input = act.layer_input_bytes(model, tokens, t, sp) * act_scale
    full_layers_act = dense_l * a_dense + moe_l * a_moe
    stored = (full_layers_act * (1 - recompute_share) + layers * a_input * recompute_share
              + emb * act.embedding_bytes(model, tokens, t, sp) + head * act.head_bytes(model, tokens, t, sp, act_bytes))
    inflight = microbatches_in_flight(table.schedule, p, rank, m, v)
    working_set = np.where(recompute_share > 0, np.maximum(a_dense, a_moe), 0.0)
    activations = inflight * stored + working_set
    fsdp_gather = np.where((table.zero_stage == 3) & (d * c > 1), 2.0 * weight_bytes * prm.dense_layer_max, 0.0)
    moe_buffers = (2.0 * tokens / np.where(sp, tf, 1.0) * model.moe.top_k * model.hidden_size * act_bytes * et
                   if model.moe else 0.0) * (moe_l > 0)
    other = (k.runtime_reserved_gib * GIB + k.allocator_overhead_fraction * activations
             + fsdp_gather + moe_buffers)
    memory = {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
              "activations": activations, "other": other}
    if cluster.training_stack == "torch":  # PyTorch eager + FSDP2/DDP + torch pipelining (the built-in model)
        memory = torch_stack_memory(model, table, st, prm, states, tokens=tokens, m=m, inflight=inflight,
                                    recompute_share=recompute_share, selective=selective, act_bytes=act_bytes,
                                    fp32=fp32, edp=edp, constants=k, fsdp_gather=fsdp_gather, moe_buffers=moe_buffers)
    mem_total = np.where(active, sum(memory.values()), -np.inf)
    mem_rank = np.argmax(mem_total, axis=0)
    pick = lambda a: np.take_along_axis(np.broadcast_to(a, mem_total.shape), mem_rank[None], 0)[0]  # noqa: E731
    peak = pick(mem_total)

    # ---- compute ---------------------------------------------------------------------------
    lin_layer = (dense_l * (attention_linear_flops_per_token(model) + mlp_flops_per_token(model, False))
                 + moe_l * attention_linear_flops_per_token(model))
    expert_layer = moe_l * mlp_flops_per_token(model, True) if model.moe else 0.0 * moe_l
    core = layers * attention_core_flops_per_token(model, s)
    head_f = head * head_flops_per_token(model, t)
    fwd_gemm = tokens * (lin_layer + head_f) / tf
    fwd_expert = tokens * expert_layer / tf
    fwd_core = tokens * core / tf
    recompute_dense = recompute_share * tokens * lin_layer / tf
    recompute_expert = recompute_share * tokens * expert_layer / tf
    recompute_gemm = recompute_dense + recompute_expert
    recompute_core = np.where(selective | full, np.where(full, recompute_share, 1.0), 0.0) * fwd_core

    x_dense = np.minimum.reduce([tokens, np.full_like(tokens, model.hidden_size), model.ffn_hidden_size / tf,
                                 model.q_size / tf])
    rate_dense = gemm_rate(cluster, table.dtype, x_dense)
    rate_expert = rate_dense
    if model.moe:  # grouped expert GEMMs: tokens per expert instance, expert ffn / etp
        mo = model.moe
        per_expert = b * s * mo.top_k * e * et / (mo.num_experts * t * c)
        x_exp = np.minimum.reduce([per_expert, mo.expert_ffn_hidden_size / et.astype(float),
                                   np.full_like(tokens, model.hidden_size)])
        rate_expert = gemm_rate(cluster, table.dtype, x_exp) * k.expert_gemm_efficiency
    gemm_time = (3 * fwd_gemm + recompute_dense) / rate_dense + (3 * fwd_expert + recompute_expert) / rate_expert
    attn_time = (3 * fwd_core + recompute_core) / attention_rate(cluster)
    elementwise = (k.elementwise_traffic_factor * (full_layers_act * (1 + recompute_share))
                   / (cluster.gpu.hbm_gbps * 1e9))
    launch = layers * (1 + recompute_share / 2) * k.layer_overhead_us * 1e-6
    compute_mb = gemm_time + attn_time + elementwise + launch

    # ---- communication ---------------------------------------------------------------------
    gpn = cluster.gpus_per_node
    # MoE aux-loss statistics over the ranks holding a sequence's tokens (cp x tp under SP): booked
    # on cp when cp > 1, else on tp (the built-in model names its group so: autopar.trial.parallelize)
    stat_n = c * np.where(sp, t, 1)
    stat_bytes, stat_time = traffic(moe_stat_calls(model, b, stat_n, moe_l, recompute_share), stat_n, place(stat_n, 1, gpn), links)
    on_cp = c > 1
    tp_bytes, tp_time = traffic(tp_calls(model, tokens, sp, dense_l, moe_l, emb, head, recompute_share, et, act_bytes),
                                t, place(t, 1, gpn), links)
    tp_bytes, tp_time = tp_bytes + np.where(on_cp, 0.0, stat_bytes), tp_time + np.where(on_cp, 0.0, stat_time)
    cp_group = place(c, t, gpn)
    cp_bytes, cp_time = traffic(cp_calls(model, tokens, t, c, layers, recompute_share, act_bytes), c, cp_group, links,
                                crosses_node=cp_group.nodes > 1)
    cp_bytes, cp_time = cp_bytes + np.where(on_cp, stat_bytes, 0.0), cp_time + np.where(on_cp, stat_time, 0.0)
    ep_bytes, ep_time = traffic(ep_calls(model, tokens, t, sp, moe_l, routing_imbalance, act_bytes, recompute_share), e,
                                place(e, et, gpn), links)
    pp_stride = t * c * d
    pp_bytes, pp_time = traffic(pp_calls(model, tokens, t, sp, p, v, rank, act_bytes), p, None, links,
                                crosses_node=pp_stride * np.minimum(p, 2) > gpn)
    grad_b = np.where(table.main_grads_fp32 | fp32, 4.0, 2.0)
    red_d, gat_d = dp_calls(prm.dense, table.zero_stage, grad_b, weight_bytes, m, p, d * c)
    red_e, gat_e = dp_calls(prm.expert, table.zero_stage, grad_b, weight_bytes, m, p, edp)
    # once-per-step TP traffic: SP norm gradients, all-reduced with each gradient reduction
    tps_bytes, tps_time = traffic(tp_step_calls(model, sp, dense_l, moe_l, head, grad_b,
                                                grad_reductions_per_step(table.zero_stage, m, p, d * c)),
                                  t, place(t, 1, gpn), links)
    dgroup, egroup = place(d * c, t, gpn), place(edp, e * et, gpn)
    rb_d, rt_d = traffic(red_d, d * c, dgroup, links)
    gb_d, gt_d = traffic(gat_d, d * c, dgroup, links)
    rb_e, rt_e = traffic(red_e, edp, egroup, links)
    gb_e, gt_e = traffic(gat_e, edp, egroup, links)
    dp_bytes = rb_d + gb_d + rb_e + gb_e
    reduce_t, gather_t = rt_d + rt_e, gt_d + gt_e

    tp_exp = tp_time * (1 - k.tp_overlap * table.tp_comm_overlap)
    ep_exp = ep_time * (1 - k.ep_overlap)
    cp_exp = np.maximum(0.0, cp_time - attn_time)  # the ring overlaps with the blockwise attention
    pp_exp = pp_time * (1 - k.pp_overlap)
    t_mb = np.where(active, compute_mb + tp_exp + ep_exp + cp_exp + pp_exp, -np.inf)

    # DP: gradient reduce under the last microbatch's backward, parameter gather under the first
    # forward; FSDP (ZeRO-3) gathers and reduces every microbatch under its compute
    z3 = table.zero_stage == 3
    bwd_mb, fwd_mb = compute_mb * 2 / 3, compute_mb / 3
    dp_exposed = np.where(
        z3, np.maximum(0.0, reduce_t + gather_t - k.dp_overlap * m * compute_mb),
        np.maximum(0.0, reduce_t - k.dp_overlap * bwd_mb) + np.maximum(0.0, gather_t - k.dp_overlap * fwd_mb))
    opt_shard = (prm.dense / np.where(table.zero_stage >= 1, d * c, 1.0)
                 + prm.expert / np.where(table.zero_stage >= 1, edp, 1.0))
    optimizer_t = opt_shard * OPTIMIZER_BYTES_PER_PARAM / (cluster.gpu.hbm_gbps * 1e9)

    pace_rank = np.argmax(t_mb, axis=0)
    at = lambda a: np.take_along_axis(np.broadcast_to(a, t_mb.shape), pace_rank[None], 0)[0]  # noqa: E731
    pace = at(t_mb)
    f = bubble_fraction(table.schedule, p, m, v)
    pipeline_t = m * pace / (1 - f)
    tail = np.where(active, dp_exposed + optimizer_t + tps_time, -np.inf)
    tail_rank = np.argmax(tail, axis=0)
    at_tail = lambda a: np.take_along_axis(np.broadcast_to(a, tail.shape), tail_rank[None], 0)[0]  # noqa: E731
    step = pipeline_t + at_tail(tail)

    gbs = table.global_batch_size.astype(float)
    flops = model_flops_per_step(model, gbs, s, t)
    hw_extra = (np.max(recompute_gemm + recompute_core, axis=0) * t * c * p * d * m) if len(table) else 0
    n_gpus = table.num_gpus.astype(float)
    peak_bf16 = cluster.gpu.bf16_tflops * 1e12
    tflops = flops / step / n_gpus / 1e12
    valid = rules.valid
    cap = cluster.gpu.hbm_bytes

    out: dict[str, np.ndarray] = {
        "valid": valid,
        "fits": valid & (peak <= cap),
        "rejected_by": np.where(valid, np.where(peak <= cap, "", "memory"), rules.short_reasons()),
        "memory_miss_gib": np.where(valid & (peak > cap), (peak - cap) / GIB, 0.0),
        "peak_memory_bytes": peak,
        "memory_capacity_bytes": np.full(len(table), cap),
        "memory_rank": np.take_along_axis(rank, mem_rank[None], 0)[0],
        "step_time_s": step,
        "time_compute": m * at(compute_mb), "time_tp": m * at(tp_exp) + at_tail(tps_time),
        "time_tp_per_step": at_tail(tps_time), "time_cp": m * at(cp_exp),
        "time_ep": m * at(ep_exp), "time_pp": m * at(pp_exp), "time_dp": at_tail(dp_exposed),
        "time_bubble": pipeline_t - m * pace, "time_optimizer": at_tail(optimizer_t),
        "pace_rank": np.take_along_axis(rank, pace_rank[None], 0)[0],
        "tokens_per_s": gbs * s / step,
        "tokens_per_s_per_gpu": gbs * s / step / n_gpus,
        "model_tflops_per_gpu": tflops,
        "mfu": flops / step / n_gpus / peak_bf16,
        "hfu": (flops + hw_extra) / step / n_gpus / peak_bf16,
        "bubble_fraction": f,
        "num_microbatches": table.num_microbatches,
        "params_per_gpu": np.max(np.where(active, prm.total, 0.0), axis=0),
        "params_total": np.full(len(table), float(model.params_total)),
        "model_flops_per_step": flops,
        "stage_imbalance": st.imbalance,
        "layout": st.layout_text,
    }
    for name, arr in memory.items():
        out[f"mem_{name}"] = pick(arr)
    per_rank_bytes = {"tp": tp_bytes * m + tps_bytes, "cp": cp_bytes * m, "ep": ep_bytes * m, "pp": pp_bytes * m, "dp": dp_bytes}
    for axis, arr in per_rank_bytes.items():
        out[f"comm_bytes_{axis}"] = np.max(np.where(active, np.broadcast_to(arr, t_mb.shape), 0.0), axis=0)
    # per pipeline rank ((R, n) arrays, inactive ranks masked), for the detailed report and tests
    out["stage_active"] = active
    out["stage_memory_bytes"] = np.where(active, mem_total, 0.0)
    out["stage_time_per_mb"] = np.where(active, t_mb, 0.0)
    out["stage_params"] = np.where(active, prm.total, 0.0)
    out["stage_layers"] = np.where(active, layers, 0.0)
    for axis, arr in per_rank_bytes.items():
        out[f"stage_comm_bytes_{axis}"] = np.where(active, np.broadcast_to(arr, t_mb.shape), 0.0)
    return out


@dataclass
class Estimate:
    """One plan's estimate (the `--json` schema of `autopar estimate`)."""

    plan: ParallelPlan
    fits: bool
    valid: bool
    reasons: list[str]
    peak_memory_bytes: float
    memory_bytes: dict[str, float]
    step_time_s: float
    time_s: dict[str, float]
    comm_bytes_per_gpu: dict[str, float]
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    params_total: float
    params_per_gpu: float
    memory_capacity_bytes: float
    layout: str
    num_microbatches: int
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "fits", "valid", "reasons", "peak_memory_bytes", "memory_bytes", "step_time_s", "time_s",
            "comm_bytes_per_gpu", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu",
            "bubble_fraction", "params_total", "params_per_gpu", "memory_capacity_bytes", "layout",
            "num_microbatches")}
        out["plan"] = self.plan.to_dict()
        out.update(self.extra)
        return out


def estimate(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec, *, num_gpus: int | None = None,
             seq_len: int | None = None, routing_imbalance: float = 1.0) -> Estimate:
    """One plan: `estimate_table` on a table of one row."""
    table = PlanTable.from_plans([plan])
    cols = estimate_table(table, model, cluster, num_gpus=num_gpus, seq_len=seq_len,
                          routing_imbalance=routing_imbalance)
    row = {k: v[0] for k, v in cols.items() if not k.startswith("stage_") or k == "stage_imbalance"}
    reasons = plan.problems(model, num_gpus=num_gpus, cluster=cluster, seq_len=seq_len)
    if row["valid"] and not row["fits"]:
        reasons.append(f"needs {row['peak_memory_bytes'] / GIB:.1f} GiB on pipeline rank {int(row['memory_rank'])} "
                       f"but the {cluster.gpu.key} has {row['memory_capacity_bytes'] / GIB:.1f} GiB "
                       f"({row['memory_miss_gib']:.1f} GiB short)")
    extra = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()
             if k in ("memory_rank", "pace_rank", "stage_imbalance", "model_flops_per_step", "time_tp_per_step")}
    extra["stages"] = [
        {"rank": r, "layers": int(cols["stage_layers"][r, 0]), "memory_bytes": float(cols["stage_memory_bytes"][r, 0]),
         "time_per_mb_s": float(cols["stage_time_per_mb"][r, 0]), "params": float(cols["stage_params"][r, 0]),
         "comm_bytes": {a: float(cols[f"stage_comm_bytes_{a}"][r, 0]) for a in AXES}}
        for r in range(plan.pp)]
    return Estimate(
        plan=plan, fits=bool(row["fits"]), valid=bool(row["valid"]), reasons=reasons,
        peak_memory_bytes=float(row["peak_memory_bytes"]),
        memory_bytes={n: float(row[f"mem_{n}"]) for n in MEMORY_TERMS},
        step_time_s=float(row["step_time_s"]),
        time_s={n: float(row[f"time_{n}"]) for n in TIME_TERMS},
        comm_bytes_per_gpu={a: float(row[f"comm_bytes_{a}"]) for a in AXES},
        tokens_per_s=float(row["tokens_per_s"]), tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
        model_tflops_per_gpu=float(row["model_tflops_per_gpu"]), mfu=float(row["mfu"]), hfu=float(row["hfu"]),
        bubble_fraction=float(row["bubble_fraction"]), params_total=float(row["params_total"]),
        params_per_gpu=float(row["params_per_gpu"]), memory_capacity_bytes=float(row["memory_capacity_bytes"]),
        layout=str(row["layout"]), num_microbatches=int(row["num_microbatches"]), extra=extra)
