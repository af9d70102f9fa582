"""Issue 22's memory acceptance, recomputed (nothing stored is read back): the published memory
figures of the bundled calibration runs against the estimate of the same quantity
(autopar.calibration.memory_published: nanotron's peak reserved memory of rank 0, BLOOM's nvidia-smi
figure of the first and last stages, Korthikanti et al.'s Figure 1 terms, torchtitan's peak reserved
memory) at most 10 % MAPE, and every published run predicted to fit its GPUs; the sources and rows
the model still misses are listed with the reason, and the test fails when one of them is met."""

from __future__ import annotations

import pytest

from autopar.calibration.memory_facts import memory_plan, offloading_twins, row_memory_facts, with_twin_offloading
from autopar.calibration.memory_published import _priced_memory, compare_published_memory, published_memory
from autopar.calibration.row_cells import row_offloaded, row_recompute_modules
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs

#: published runs the model still predicts not to fit, each with the reason (the test fails if any
#: other row does not fit, and if one of these starts to fit: then drop it here)
KNOWN_MISSES: dict[str, str] = {}  # NeMo AutoModel's rows 73 and 75 fit since its program's bf16 states
#: sources whose published peaks the model misses by more than 10 % on average, with the reason (the
#: test fails if one of them comes within 10 %: then drop it here)
KNOWN_SOURCE_MISSES: dict[str, str] = {
    "torchtitan-2024-12": "torchtitan prints the caching allocator's peak reserved memory, which grows "
    "toward the 96 GB cap under FSDP2's varying all-gather buffers (4-27 % above the allocated peak "
    "priced here; the reserve is not modelled per step)",
    "torchtitan-h200-2025-06": "torchtitan June 2025 on H200 (compile, Float8 all-gather, per-op selective "
    "checkpointing): predicted 28-30 % high",
}


@pytest.fixture(scope="module")
def result():
    rows = load_runs(None)
    cases, _ = build_cases(rows)
    return compare_published_memory(cases, rows)


def test_every_publishing_row_is_compared(result) -> None:
    counts = {}
    for c in result.comparisons:
        counts[c.source] = counts.get(c.source, 0) + 1
    # 16 nanotron cells, 9 BLOOM benchmarks (row 264 prints no memory), 8 Korthikanti rows x 2 terms,
    # torchtitan's 18 H100 benchmark rows and its 2 H200 ones
    assert counts == {
        "nanotron": 16,
        "bloom": 9,
        "korthikanti-2022": 16,
        "torchtitan-2024-12": 18,
        "torchtitan-h200-2025-06": 2,
    }


def test_published_memory_mape_at_most_10_percent(result) -> None:
    assert result.mape() <= 0.10, result.by_source()
    # the measured peaks alone (the Korthikanti figures are analytic), less the sources the model is
    # known to miss (KNOWN_SOURCE_MISSES, checked below)
    measured = result.mape(
        lambda c: c.figure.quantity in ("reserved", "device") and c.source not in KNOWN_SOURCE_MISSES
    )
    assert measured <= 0.10, result.by_source()
    for source, s in result.by_source().items():
        assert (s["mape"] <= 0.10) != (source in KNOWN_SOURCE_MISSES), (source, s)


def test_korthikanti_figure1_terms_match_to_a_tenth_of_a_percent(result) -> None:
    # Figure 1's values are Korthikanti et al.'s formulas (18 bytes per layer parameter; s b h (10 +
    # 24/t + 5 a s/(h t)) and s b h 34/t per layer, x (1 + (p-1)/(p m)) when interleaved): autopar's
    # first stage must reproduce them, layouts, interleaving and the score terms included
    errors = {(c.row_id, c.figure.quantity): c.error for c in result.comparisons if c.source == "korthikanti-2022"}
    assert len(errors) == 16
    assert max(abs(e) for e in errors.values()) <= 1e-3, errors


def test_no_published_run_is_predicted_not_to_fit(result) -> None:
    assert len(result.fit_checks) >= 140  # every evaluable row of the bundled tables
    missing = {f.row_id: round(f.required_gib - f.capacity_gib, 2) for f in result.not_fitting}
    assert set(missing) == set(KNOWN_MISSES), missing
    assert {f.row_id for f in result.fit_checks if f.row_id in ("50", "49", "37")} == {"50", "49", "37"}
    # NeMo AutoModel's MoE runs, whose model is cast to bf16 before FSDP2 shards it (memory stack
    # "automodel"), fit with the activation checkpointing their rows leave unstated
    assert {f.row_id for f in result.fit_checks if f.row_id in ("72", "73", "75")} == {"72", "73", "75"}


def test_parsing_reads_what_each_source_prints() -> None:
    rows = {r["row_id"]: r for r in load_runs(None)}
    (nano,) = published_memory(rows["253"], "nanotron")
    assert (nano.quantity, nano.gib, nano.ranks) == ("reserved", 58.34, "rank 0")
    (bloom,) = published_memory(rows["269"], "bloom")
    assert (bloom.quantity, bloom.gib, bloom.ranks) == ("device", 76.0, "first/last stage")
    states, acts = published_memory(rows["23"], "korthikanti-2022")
    assert (states.gib, acts.gib, acts.variant) == (45.5625, 12.35, "")
    _, plain = published_memory(rows["22"], "korthikanti-2022")
    assert (plain.gib, plain.variant) == (66.84, "no SP, no recompute")
    assert published_memory(rows["264"], "bloom") == []  # the production run prints no memory
    assert published_memory(rows["50"], "bridge-25.09") == []


def test_the_same_run_published_twice_shares_its_offloading() -> None:
    # row 406 (the MoE report's Qwen3-235B MXFP8 on 256 GB200, PP4 VPP6 EP64, MBS 3, 919 TF/GPU)
    # and row 287 (ModelZoo's command line of that run) are one run: 287 states the fine-grained
    # activation offloading that 406's recompute cell leaves out
    rows = {r["row_id"]: r for r in load_runs(None)}
    twins = offloading_twins(list(rows.values()))
    merged = with_twin_offloading(rows["406"], twins)
    assert {"moe_act", "layernorm"} <= set(row_recompute_modules(merged["recompute"]))
    assert row_offloaded(merged["recompute"]) == ("expert_fc1", "moe_act"), merged["recompute"]
    assert "row 287" in merged["recompute"]
    # a row without a twin, and the twin that already states it, are left as they are
    assert with_twin_offloading(rows["405"], twins) is rows["405"]
    assert with_twin_offloading(rows["287"], twins) is rows["287"]


def test_nvidia_deepseek_v3_recipe_bf16_moments_and_gradients() -> None:
    # Megatron-Bridge recipes/deepseek/deepseek_v3.py: precision-aware optimizer, bf16 exp_avg and
    # exp_avg_sq (fp32 master), bf16 main gradients, in every recipe of that file
    rows = load_runs(None)
    by = {r["row_id"]: r for r in rows}
    cases = {c.row_id: c for c in build_cases(rows)[0]}
    for rid in ("401", "402", "403", "404"):
        plan, _, notes = memory_plan(cases[rid], by[rid])
        assert not plan.main_grads_fp32 and row_memory_facts(by[rid], "megatron-moe-report").bf16_optimizer_states
        assert any("deepseek_v3.py" in n for n in notes)
    for rid in ("405", "406", "407"):  # Qwen3 rows of the same report: the Qwen3 recipes keep fp32
        plan, _, _ = memory_plan(cases[rid], by[rid])
        assert plan.main_grads_fp32 and not row_memory_facts(by[rid], "megatron-moe-report").bf16_optimizer_states
    c, row = cases["403"], by["403"]
    plan, model, _ = memory_plan(c, row)
    bf16 = _priced_memory(c, row, plan, model)[1]
    fp32 = _priced_memory(c, row, plan.with_(main_grads_fp32=True), model)[1]
    assert bf16.gradients[2, 0] == pytest.approx(fp32.gradients[2, 0] / 2, rel=1e-9)  # 2 of 4 bytes


def test_torchtitan_2024_fits_with_its_fused_rmsnorm(result) -> None:
    # Llama 2 13B, no AC, local batch 2 x 4096 on 64 A100-80GB: with the eager RMSNorm every norm
    # keeps an fp32 copy of its input (4 h bytes per token) and fp32 1/rms (4) beyond the fused
    # kernel's bf16 input; 2 norms in each of 40 layers and the final norm: 81 x (4 h + 4) x 8192
    check = {f.row_id: f for f in result.fit_checks}["235"]
    assert "fused_rmsnorm" in check.assumed and check.fits
    rows = load_runs(None)
    by = {r["row_id"]: r for r in rows}
    c = {c.row_id: c for c in build_cases(rows)[0]}["235"]
    plan, model, _ = memory_plan(c, by["235"])
    eager = _priced_memory(c, by["235"], plan, model)[1].required[0, 0]
    fused = _priced_memory(c, by["235"], plan, model, "torchtitan-fused-norm")[1].required[0, 0]
    assert eager - fused == pytest.approx(81 * (4 * 5120 + 4) * 8192, rel=1e-12)
    assert check.required_gib == pytest.approx(fused / 2**30, rel=1e-12)
    # a run that fits with the default is checked with it: nothing assumed
    assert not {f.row_id: f for f in result.fit_checks}["233"].assumed
