"""The cost model's physics against published figures and hand derivations: GEMM rates from MAMF and
the DeepGEMM shape fall-off, attention from the published kernel rates, collectives from the
measured NCCL curves, DeepEP's deduplication, the constants table, the real router's imbalance."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from autopar.calibration.routing_derivation import implied_imbalances
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs
from autopar.cost.collectives import Links, collective_seconds, deduplicated_seconds, place
from autopar.cost.kernels import attention_seconds, causal_share, gemm_rate, half_dims, reference_half_dim
from autopar.cost.profiles import lineage, profiles
from autopar.spec.constants import CostConstants, check_table_matches_fields, constant_table
from autopar.spec.hardware import default_cluster
from autopar.spec.routing import REAL_ROUTER_IMBALANCE
from autopar.spec.table import DTYPE

H100 = default_cluster("h100-sxm")


def test_shape_half_dim_is_the_least_squares_fit_of_the_published_points():
    """x / (x + a) relative to M = 4096, fitted in log to the DeepGEMM points: a fine scan by hand
    finds the same a within the grid's resolution."""
    from autopar.spec.behaviour import shared_figures

    pts = np.array(shared_figures().shape_points)
    m, r = pts[:, 0], pts[:, 1]
    scan = np.linspace(100, 320, 22001)
    err = [np.sum(np.log((m / (m + a)) / (4096 / (4096 + a)) / r) ** 2) for a in scan]
    assert reference_half_dim() == pytest.approx(scan[int(np.argmin(err))], rel=3e-3)


def test_gemm_rate_is_mamf_times_the_shape_fall_off():
    """H100 BF16: ridge 2 x 989.4 / 3.35 = the H800 FP8 ridge 1978.9 / 3.35 (x 1 byte), so the half
    point is the reference one; rate = 794.5 TFLOPS x x / (x + a)."""
    a = reference_half_dim()
    assert float(half_dims(H100, DTYPE["bf16"])) == pytest.approx(a * (2 * 989.4e3 / 3350) / 590.7, rel=1e-6)
    x = 512.0
    half = float(half_dims(H100, DTYPE["bf16"]))
    assert float(gemm_rate(H100, DTYPE["bf16"], x)) == pytest.approx(794.5e12 * x / (x + half))
    # TF32 (fp32 training): twice the bytes per element at half the peak, so the same half point
    assert float(half_dims(H100, DTYPE["fp32"])) == pytest.approx(half, rel=1e-6)
    assert float(gemm_rate(H100, DTYPE["fp32"], x)) == pytest.approx(794.5e12 / 2 * x / (x + half))


def test_attention_seconds_are_the_published_kernel_times():
    """One causal forward + backward at S = 4096 (B=4, H=48, D=128) takes the tritonbench
    1236.9 + 4643.46 us; with a recomputed forward one forward more."""
    flops = 4 * 4 * 4096**2 * 48 * 128 / 2
    t = float(attention_seconds(H100, flops, 4096, 128, 1.0, 0.0))
    assert t == pytest.approx(1236.9e-6 + 4643.46e-6)
    t2 = float(attention_seconds(H100, flops, 4096, 128, 2.0, 0.0))
    assert t2 == pytest.approx(2 * 1236.9e-6 + 4643.46e-6)


def test_flash_attention_in_triton_runs_at_its_published_share_of_fa2():
    """FlashAttention-2 is 1.3-2.5x faster than FlashAttention in Triton (FA2 paper sec. 4.1): the
    Triton kernel's time is the FA2 time x 1.8 (the range's geometric mean, sqrt(1.3 x 2.5) = 1.80),
    and the constant's range is exactly 1 / 2.5 .. 1 / 1.3."""
    spec = constant_table()["triton_attention_rate"]
    assert (spec.low, spec.high) == (pytest.approx(1 / 2.5, abs=1e-4), pytest.approx(1 / 1.3, abs=1e-4))
    assert 1 / spec.prior == pytest.approx((1.3 * 2.5) ** 0.5, rel=1e-4)
    flops = 4 * 4 * 8192**2 * 16 * 128 / 2
    fa2 = float(attention_seconds(H100, flops, 8192, 128, 1.0, 1.0))
    triton = float(attention_seconds(H100, flops, 8192, 128, 1.0, 1.0, fa1=1.0, triton_rate=spec.prior))
    half_triton = float(attention_seconds(H100, flops, 8192, 128, 1.0, 1.0, fa1=0.5, triton_rate=spec.prior))
    assert triton == pytest.approx(fa2 / spec.prior)
    assert half_triton == pytest.approx(0.5 * fa2 + 0.5 * fa2 / spec.prior)


def test_all_gather_context_parallelism_hides_nothing():
    """cp_ring_overlap 1 (the ring) hides the CP traffic (K/V and dK/dV) under (cp - 1) / cp of the
    attention; 0 (Meta's all-gather CP) leaves all of it exposed: the exposed CP seconds are then
    the traffic's own plus nothing hidden, so with no contention they equal the CP traffic. PyTorch's
    all-gather (cp_kv_all_gather 1) hides each pass's K/V under 1 / cp of the attention and the
    dK/dV ring under (cp - 1) / cp of the backward's, twice the forward's."""
    from dataclasses import replace

    from autopar.cost.compute import assemble_compute
    from autopar.cost.step import exposed

    case = next(c for c in build_cases(load_runs(None))[0] if c.row_id == "276")
    from autopar.calibration.case_batch import case_cluster, prime_inputs

    prime_inputs([case])
    inp = case.inputs
    meta = case_cluster(case).constants
    ring = replace(meta, cp_ring_overlap=1.0, cp_kv_all_gather=0.0)
    torch_gather = replace(ring, cp_kv_all_gather=1.0)
    quiet = inp._replace(comm_sm_share=np.zeros_like(inp.comm_sm_share))
    cp = float(inp.cp_size[0])
    attention = float(assemble_compute(inp.raw, ring).attention[0, 0])
    kv, grads = float(inp.cp[0, 0]), float(inp.cp_grad[0, 0])
    assert kv > 0 and grads > 0
    assert float(exposed(quiet, meta).cp[0, 0]) == pytest.approx(kv + grads)
    assert float(exposed(quiet, ring).cp[0, 0]) == pytest.approx(max(kv + grads - attention * (cp - 1) / cp, 0.0))
    backward = attention * 2.0 / 3.0  # no full recompute: the forward once, the backward twice it
    assert float(inp.forward_share[0, 0]) == pytest.approx(1 / 3)
    assert float(exposed(quiet, torch_gather).cp[0, 0]) == pytest.approx(
        max(kv - attention / cp, 0.0) + max(grads - backward * (cp - 1) / cp, 0.0)
    )


def test_context_parallel_exchanges_by_the_trainers_facts():
    """Per layer per microbatch, Llama 3 8B (8 K/V heads of 128 of 32 query heads), 8192 local tokens,
    tp 1, cp 4, bf16, no recompute: the ring passes the 4 MiB K/V block (8192 x 2 x 1024 x 2 bytes) 3
    times in the forward and 3 in the backward, and dK/dV 3 times; PyTorch's all-gather receives the
    same 3 blocks once per pass (a 16 MiB gathered buffer); fp32 gradients double dK/dV's bytes, and
    K/V repeated to the 32 query heads quadruples every block."""
    from autopar.cost.comm import cp_calls, volume
    from autopar.spec.presets import resolve_model

    model = resolve_model("llama3-8b")
    block = 8192 * 2 * 1024 * 2
    args = (model, 8192.0, 1, 4, 1.0, 0.0, 2.0)
    kv, grads = cp_calls(*args)
    assert float(volume(kv, 4).handed) == pytest.approx(6 * block)
    assert float(volume(grads, 4).handed) == pytest.approx(3 * block)
    kv, grads = cp_calls(*args, all_gather=1.0, grad_fp32=1.0)
    gathered = [c for c in kv if np.any(c.count > 0)]
    assert [c.kind for c in gathered] == ["all_gather"] and float(gathered[0].full_bytes) == pytest.approx(4 * block)
    assert float(gathered[0].count) == 2.0  # the forward's and the backward's
    assert float(volume(grads, 4).handed) == pytest.approx(3 * 2 * block)
    kv, grads = cp_calls(*args, repeat_kv=1.0)
    assert float(volume(kv, 4).handed) == pytest.approx(6 * 4 * block)
    assert float(volume(grads, 4).handed) == pytest.approx(3 * 4 * block)


def test_context_parallel_ranks_run_mostly_unmasked_blocks():
    """With the load-balanced split a CP rank's diagonal blocks are 1 / (2 cp) of its work."""
    assert float(causal_share(1)) == 1.0 and float(causal_share(4)) == pytest.approx(1 / 8)


def test_all_reduce_across_nodes_runs_at_the_nic_rate():
    """64 GPUs (8 nodes of 8), 16 GiB: the in-node part at the measured NVLink busbw, the cross-node
    part 2 (N-1)/N x S/8 over one NIC at 48 GB/s (nccl-tests #267) x the scan's size efficiency 1."""
    g = place(np.array(64), np.array(1), 8)
    links = Links.of(H100)
    s = 16 * 2**30
    t = float(collective_seconds("all_reduce", s, g, links))
    intra = float(collective_seconds("all_reduce", s, place(np.array(8), np.array(1), 8), links))
    inter = 2 * 7 / 8 * (s / 8) / 48e9
    assert t == pytest.approx(intra + inter + 2 * (8.4e-6 + np.log2(8) * 14e-6), rel=1e-6)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_a_ring_collective_across_nodes_pays_a_latency_per_step(kind):
    """NCCL runs all-gather and reduce-scatter as a ring: ranks - 1 steps, nodes - 1 of them over the
    network (src/graph/tuning.cc, Simple protocol: base 8.4 us, NVLink hop 3.4 us, network hop 14
    us). On 512 GPUs of 64 nodes that is 8.4 + 448 x 3.4 + 63 x 14 = 2,413.6 us beside the in-node
    part of a tiny message (the measured NVLink curve, its own latency in it); against a tree's
    logarithm it grows with the group."""
    links = Links.of(H100)
    in_node = float(collective_seconds(kind, 8.0, place(np.array(8), np.array(1), 8), links))
    t = float(collective_seconds(kind, 8.0, place(np.array(512), np.array(1), 8), links))
    assert t == pytest.approx(in_node + (8.4 + 448 * 3.4 + 63 * 14) * 1e-6, rel=1e-4)
    # two nodes: 8.4 + 14 x 3.4 + 14 us
    t2 = float(collective_seconds(kind, 8.0, place(np.array(16), np.array(1), 8), links))
    assert t2 == pytest.approx(in_node + (8.4 + 14 * 3.4 + 14) * 1e-6, rel=1e-4)


def test_deepep_crosses_the_network_once_per_remote_node():
    """EP16 on two H100 nodes, top-8: a token reaches the other node with probability 1 - 0.5^8 and
    crosses once; NCCL's all-to-all sends 8 of its 16 destinations' copies over the NIC."""
    g = place(np.array(16), np.array(1), 8)
    links = Links.of(H100)
    s = 4096 * 8 * 7168 * 2.0  # 4096 tokens, top-8, hidden 7168, BF16
    dedup = float(deduplicated_seconds(s, g, links, top_k=8))
    rdma = 4096 * 7168 * 2.0 * (1 - 0.5**8) / 50e9
    nvlink = s * (7 / 16 + 8 / 16 * 7 / 8) / (450e9 * 0.7775)
    assert dedup == pytest.approx(max(rdma, nvlink) + 2 * 8.4e-6, rel=1e-6)
    nccl = float(collective_seconds("all_to_all", s, g, links))
    assert nccl > 3 * dedup


def test_constants_table_matches_the_dataclass_and_the_profiles_stay_in_range():
    check_table_matches_fields()
    table = constant_table()
    assert {f.name for f in fields(CostConstants)} == set(table)
    for name, spec in table.items():
        assert spec.source and spec.meaning and spec.low <= spec.prior <= spec.high, name
    for prof in profiles().values():
        for n in prof.own:
            spec = table[n].for_profile(prof.name, lineage(prof.name))
            if spec.kind == "fitted":
                assert spec.low <= getattr(prof.constants, n) <= spec.high, (prof.name, n)


def test_real_router_imbalance_is_what_the_paired_measurements_imply():
    """autopar.spec.routing's default for a real router is the median of the imbalances the four
    forced-balanced / dropless pairs imply under the shipped profiles."""
    cases, _ = build_cases(load_runs(None))
    implied = implied_imbalances(cases)
    assert set(implied) == {"282d", "283d", "284d", "285d"}
    assert REAL_ROUTER_IMBALANCE == pytest.approx(np.median(list(implied.values())), abs=0.05)


def test_ep_overlap_needs_a_partner_chunk():
    """Megatron's 1F1B all-to-all overlap pairs a forward with a backward: interleaved pp4 x v6 with
    16 microbatches warms up 2(p-1) + (v-1)p = 26 of its 96 chunks without a partner; plain 1F1B
    p - 1 of m; without a pipeline only the first forward."""
    from autopar.cost.pipeline import steady_fraction
    from autopar.spec.table import SCHED

    inter, plain = SCHED["interleaved-1f1b"], SCHED["1f1b"]
    assert float(steady_fraction(inter, 4, 16, 6)) == pytest.approx(1 - 26 / 96)
    assert float(steady_fraction(plain, 8, 32, 1)) == pytest.approx(1 - 7 / 32)
    assert float(steady_fraction(plain, 1, 8, 1)) == pytest.approx(1 - 1 / 8)


def test_every_memory_program_is_a_training_stack_a_cluster_may_name():
    from autopar.cost.memory_stacks import LEGACY, STACKS
    from autopar.spec.hardware import TRAINING_STACKS

    assert set(TRAINING_STACKS) == set(STACKS) | set(LEGACY)


def test_deepep_beside_the_gemms_costs_its_measured_overhead():
    """DeepEP's 20 SMs cost the GEMMs beside it "roughly 20%" on an H100 (132 SMs; arXiv 2603.07685
    sec. 4.2.3), more than their 15 % share; a B200 (148 SMs) loses as much per SM taken:
    0.20 x 132 / 148. The overlapped rows of the published runs (row 278: H100, row 287: GB200)
    carry that share."""
    from autopar.calibration.case_batch import prime_inputs

    cases = {c.row_id: c for c in build_cases(load_runs(None))[0] if c.row_id in ("278", "287") and not c.dropless}
    prime_inputs(list(cases.values()))
    assert float(cases["278"].inputs.dispatch_sm_share[0]) == pytest.approx(0.20)
    assert float(cases["287"].inputs.dispatch_sm_share[0]) == pytest.approx(0.20 * 132 / 148)
