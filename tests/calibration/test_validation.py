"""`autopar validate` on the bundled public runs: every row read with its source's conventions, the
FLOP conventions checked against the rows that print two throughput figures, and the model's
accuracy RECOMPUTED here (leave-one-source-out: fit on every source but one, predict that one; no
stored figure is read back), against the bars of the physics-first cost model (issue 22)."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.calibration.flop_conventions import flops_per_token
from autopar.calibration.profile_fit import fit_profiles
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs, num
from autopar.calibration.stored_figures import stored_figures
from autopar.calibration.validate_runs import current_digest, leave_one_source_out
from autopar.calibration.validation import evaluate_cases
from autopar.spec.model import ModelSpec


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {r["row_id"]: r for r in load_runs(None)}


@pytest.fixture(scope="module")
def cases(rows):
    return build_cases(list(rows.values()))


def test_at_least_195_of_208_rows_evaluated(rows, cases):
    evaluated, skipped = cases
    assert len(rows) == 208
    distinct = {c.row_id for c in evaluated if not c.row_id.endswith("d")}
    assert len(distinct) >= 195
    assert len(distinct) + len(skipped) == 208
    assert all(reason for _, _, reason in skipped)


def test_every_category_and_family_has_rows(cases):
    evaluated, _ = cases
    cats = {g for c in evaluated for g in c.categories()}
    assert cats == {"dense Megatron-family", "FSDP-family", "MoE", "long context"}
    assert {c.family for c in evaluated} == {"megatron", "fsdp", "nanotron", "deepspeed", "meta"}
    assert {c.plan.trainer for c in evaluated} == {"megatron", "torchtitan", "deepspeed"}


def test_llm_foundry_mpt_parameter_count_matches_the_printed_numparams(cases):
    """llm-foundry prints NumParams (tied wte + learned wpe): MPT-70b at seq 2048 = 64,862,437,376."""
    mpt70 = next(c for c in cases[0] if c.row_id == "201")
    assert mpt70.model.params_total == 64_862_437_376


@pytest.mark.parametrize("rid", ["201", "204", "212", "216", "221", "223", "227"])
def test_llm_foundry_convention_reproduces_its_model_tflops(rows, cases, rid):
    """llm-foundry's 'Model TFLOP' = (6 N s + 12 L d s^2) x samples/s / GPUs (collect_results.py), so
    TFLOP/s / (tokens/s/GPU) is its FLOPs per token: hand formula here, the convention in autopar."""
    r, c = rows[rid], next(c for c in cases[0] if c.row_id == rid)
    m: ModelSpec = c.model
    s = c.seq_len
    by_hand = 6 * m.params_total + 12 * m.num_layers * m.hidden_size * s
    assert flops_per_token("6n-full-attention", m, s) == pytest.approx(by_hand)
    implied = (
        num(r, "mfu")
        / 100
        * (1979e12 if c.plan.dtype == "fp8" else 989e12 if "h100" in c.cluster.gpu.key else 312e12)
        / num(r, "tokens_per_sec_per_gpu")
    )
    assert by_hand == pytest.approx(implied, rel=0.01)


@pytest.mark.parametrize("rid", ["232", "233", "234", "235", "238", "240", "242"])
def test_palm_convention_reproduces_torchtitan_and_fms_mfu(rows, cases, rid):
    """torchtitan (2024) and fms-fsdp print MFU and tokens/s/GPU: 6 N + 12 L H Q T per token."""
    r, c = rows[rid], next(c for c in cases[0] if c.row_id == rid)
    m = c.model
    by_hand = 6 * m.params_total + 12 * m.num_layers * m.num_attention_heads * m.head_dim * c.seq_len
    assert flops_per_token("palm", m, c.seq_len) == pytest.approx(by_hand)
    implied = num(r, "mfu") / 100 * 312e12 / num(r, "tokens_per_sec_per_gpu")
    assert by_hand == pytest.approx(implied, rel=0.01)


@pytest.mark.parametrize("rid", ["28", "32", "38", "49", "53", "405"])
def test_megatron_conventions_reproduce_the_printed_tflops(rows, cases, rid):
    """NeMo, Megatron-Bridge and the Megatron-Core MoE report print TFLOP/s and tokens/s/GPU: their
    ratio is the FLOPs per token (the report's FP8 rows exceed the BF16 peak: model FLOPs)."""
    r, c = rows[rid], next(c for c in cases[0] if c.row_id == rid)
    implied = num(r, "tflops_per_gpu") * 1e12 / num(r, "tokens_per_sec_per_gpu")
    assert c.flops_per_token == pytest.approx(implied, rel=0.03)


def test_dropless_measurements_are_second_cases_of_the_same_layout(cases):
    drop = {c.row_id: c for c in cases[0] if c.dropless}
    assert set(drop) == {"282d", "283d", "284d", "285d"}
    for rid, c in drop.items():
        forced = next(x for x in cases[0] if x.row_id == rid[:-1])
        assert c.plan == forced.plan and c.published < forced.published
        assert c.routing_imbalance > forced.routing_imbalance == 1.0


def test_kernel_facts_of_old_sources_are_recorded(cases):
    bloom = next(c for c in cases[0] if c.row_id == "264")
    assert bloom.kernel_overrides["attention_flash"] == 0.0  # no FlashAttention in 2022
    assert any("no FlashAttention" in a for a in bloom.assumptions)


def test_wide_ep_rows_carry_their_dispatcher_and_overlap(cases):
    """calibration_runs_3: HybridEP / DeepEP with 1F1B all-to-all overlap where the row says ON,
    DeepSeek's own run with its deduplicating kernels and DualPipe, a whole-run average."""
    by = {c.row_id: c for c in cases[0]}
    assert by["401"].plan.moe_dispatcher == "deepep" and by["401"].plan.ep_comm_overlap
    assert by["402"].plan.moe_dispatcher == "deepep" and not by["402"].plan.ep_comm_overlap
    assert by["410"].plan.moe_dispatcher == "deepep" and by["410"].whole_run
    assert by["410"].cluster.gpu.key == "h800" and by["410"].routing_imbalance > 1
    assert by["411"].plan.moe_dispatcher == "alltoall"


# ---- accuracy, recomputed --------------------------------------------------------------------------

#: leave-one-source-out MAPE per category over the four bundled files that the model must stay under
#: (the figures reached are in docs/cost-model.md): a guard against regressions, not issue 42's
#: target of 10 % in each, which only the dense Megatron-family meets (the 52 runs of
#: calibration_runs_4.csv brought torchtitan's context parallelism at CP >= 4, Megatron-Bridge's
#: GPT-OSS and NeMo AutoModel, which no mechanism explains yet)
BARS = {"dense Megatron-family": 0.10, "FSDP-family": 0.12, "MoE": 0.15, "long context": 0.16}
#: fitted constants on a bound of their documented range, each a mechanism the model lacks (the test
#: fails when one leaves its bound: then drop it here)
KNOWN_ON_BOUND: dict[tuple[str, str], str] = {}

#: categories whose leave-one-source-out intervals hold more than 90 % of their rows, with why (the
#: test fails when one comes back under 90 %: then drop it here)
KNOWN_OVER_COVERED = {
    "MoE": "the new-source widening (one draw per source) is set by two small sources the model misses "
    "most, the GB200 DeepSeek-V3 baseline of an optimization history and Mixtral under MCore v0.8's "
    "real router; the seven well-predicted sources' 41 runs then sit well inside: 82.5 % of the sources"
}


@pytest.fixture(scope="module")
def loso(cases):
    return leave_one_source_out(*cases)


@pytest.mark.parametrize("category", list(BARS))
def test_cross_validated_mape_meets_the_bar(loso, category):
    got = loso.summary()["by_category"][category]
    assert got["rows"] >= 10
    assert got["mape"] <= BARS[category], f"{category}: {100 * got['mape']:.1f}% over {got['rows']} rows"


def test_every_held_out_source_is_predicted(loso, cases):
    assert {r.case.row_id for r in loso.rows} == {c.row_id for c in cases[0]}


def test_the_fit_stays_inside_the_documented_ranges(cases):
    """Inside its range and on neither bound but the known ones (a constant on a bound is a mechanism
    the model lacks);
    a constant a trainer's mechanism fixes (Megatron's dp_overlap) is not fitted at all."""
    fit = fit_profiles(cases[0])
    assert fit.success
    for p in fit.parameters:
        assert p.low <= p.value <= p.high, p
    assert {(p.profile, p.name) for p in fit.parameters if p.on_bound} == set(KNOWN_ON_BOUND)
    assert ("megatron", "dp_overlap") not in {(p.profile, p.name) for p in fit.parameters}


def test_korthikanti_table5(cases):
    """Korthikanti et al. 2022 Table 5 (rows 20-27): average <= 12 %, max <= 20 % in sample."""
    result = evaluate_cases(cases[0], cases[1])
    errs = [abs(r.error) for r in result.rows if r.case.source == "korthikanti-2022"]
    assert len(errs) == 8
    assert np.mean(errs) <= 0.12 and max(errs) <= 0.20


def test_stored_figures_are_for_this_code_and_data():
    """The figures shipped with the profiles (profiles.cv.json, quoted by the docs) were computed
    with this code, data and these constants: regenerate them with
    `autopar validate --fit --write-profiles autopar/cost/data/profiles.toml` after a change."""
    stored = stored_figures()
    assert stored is not None
    assert stored["digest"] == current_digest()


@pytest.mark.parametrize("category", list(BARS))
def test_the_80_percent_interval_covers_70_to_90_percent_of_held_out_rows(loso, category):
    """The interval of every published run, built from the other sources' held-out residuals alone
    (its band and both widenings: recomputed above, not read back), holds its published value for
    70-90 % of the rows of each category (a category known to over-cover: 70-90 % of its sources,
    each weighed alike, and still over 90 % of its rows, or drop it from KNOWN_OVER_COVERED); the
    stored coverage (what `autopar validate --json` prints) is this one."""
    from autopar.calibration.support import calibration_point
    from autopar.calibration.uncertainty import nested_coverage

    points = [calibration_point(r.case, r.error) for r in loso.rows if not r.case.dropless]
    got = nested_coverage(points)[category]
    assert got["rows"] >= 10
    rows, by_source = f"{100 * got['covered']:.1f}% of {got['rows']} rows", got["covered_by_source"]
    if category in KNOWN_OVER_COVERED:
        assert got["covered"] > 0.90, f"{category} no longer over-covers ({rows}): drop it from KNOWN_OVER_COVERED"
        assert 0.70 <= by_source <= 0.90, f"{category}: {100 * by_source:.1f}% of {got['sources']} sources"
    else:
        assert 0.70 <= got["covered"] <= 0.90, f"{category}: {rows}"
    assert stored_figures()["uncertainty"]["coverage"][category] == pytest.approx(got)
