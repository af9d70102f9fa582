"""The checks that imitate new ground (autopar.calibration.new_ground), recomputed: the chronological
split fits only on what was published before its cutoff, leaving out a group leaves out every source
of it at once, and the physics-only model has every fitted constant at its prior."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autopar.calibration.new_ground import CUTOFF, chronological, leave_one_group_out, physics_only
from autopar.calibration.profile_fit import fit_profiles, prior_constants
from autopar.calibration.run_cases import build_cases
from autopar.calibration.run_rows import load_runs
from autopar.calibration.sources import SOURCES, declared
from autopar.calibration.validation import evaluate_cases
from autopar.spec.constants import constant_table


@pytest.fixture(scope="module")
def cases():
    return build_cases(load_runs(None))


def test_every_declared_source_has_a_date_and_a_group():
    for s in SOURCES:
        assert len(s.published) == 10 and s.published[4] == "-" and s.group, s
    assert len({s.key for s in SOURCES}) == len(SOURCES)


def test_chronological_predicts_the_later_sources_from_the_earlier_ones(cases):
    evaluated, skipped = cases
    result = chronological(evaluated, skipped)
    assert result is not None
    held = {r.case.row_id for r in result.rows}
    later = {c.row_id for c in evaluated if declared(c.source).published >= CUTOFF}
    assert held == later and held
    # the same figures as a fit on the earlier sources alone, recomputed here
    before = [c for c in evaluated if declared(c.source).published < CUTOFF]
    again = evaluate_cases([r.case for r in result.rows], [], fit_profiles(before).constants)
    assert np.allclose([r.error for r in again.rows], [r.error for r in result.rows])
    assert "by_category" in result.summary()
    # nothing published before the cutoff: no chronological figure
    assert chronological(evaluated, skipped, cutoff="2000-01-01") is None


def test_a_group_is_left_out_whole(cases):
    evaluated, skipped = cases
    result = leave_one_group_out(evaluated, skipped)
    assert {r.case.row_id for r in result.rows} == {c.row_id for c in evaluated}
    # NVIDIA's performance summaries (NeMo 24.07, long sequence, Megatron-Bridge) predicted by a fit
    # that saw none of them
    group = "nvidia-performance-summary"
    train = [c for c in evaluated if declared(c.source).group != group]
    held = [c for c in evaluated if declared(c.source).group == group]
    assert {c.source for c in held} >= {"nemo-24.07", "nemo-long-sequence", "bridge-25.09"}
    again = {r.case.row_id: r.error for r in evaluate_cases(held, [], fit_profiles(train).constants).rows}
    got = {r.case.row_id: r.error for r in result.rows if r.case.row_id in again}
    assert got == pytest.approx(again)


def test_physics_only_has_every_fitted_constant_at_its_prior(cases):
    priors = prior_constants()
    table = constant_table()
    assert priors["megatron"].gemm_efficiency == table["gemm_efficiency"].prior
    assert priors["megatron"].moe_layer_overhead_us == table["moe_layer_overhead_us"].prior
    # a profile with its own prior for a constant its trainer's mechanism changes
    assert (
        priors["torchtitan"].elementwise_traffic_factor
        == table["elementwise_traffic_factor"].for_profile("torchtitan").prior
    )
    evaluated, skipped = cases
    result = physics_only(evaluated, skipped)
    assert len(result.rows) == len(evaluated)
    assert np.allclose(
        [r.error for r in result.rows], [r.error for r in evaluate_cases(evaluated, skipped, priors).rows]
    )


@pytest.mark.slow
def test_validate_json_has_the_new_ground_sections(capsys):
    from autopar.cli import main

    try:
        main(["validate", "--json"])
    except SystemExit as e:
        assert e.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    for name in ("chronological", "physics_only", "families"):
        assert out[name] is not None and "by_category" in out[name], name
        assert out[name]["evaluated"] > 0


def test_coverage_on_new_ground_is_recomputed_as_stored(cases):
    """The intervals' coverage when a whole group is left out, and chronologically, as `validate`
    reports it (stored with the profiles): recomputed here from the held-out residuals."""
    from autopar.calibration.stored_figures import stored_figures
    from autopar.calibration.support import calibration_point
    from autopar.calibration.uncertainty import by_group, nested_coverage

    evaluated, skipped = cases
    groups = leave_one_group_out(evaluated, skipped)
    pts = [calibration_point(r.case, r.error) for r in groups.rows if not r.case.dropless]
    got = nested_coverage(pts, by_group)
    stored = stored_figures()["uncertainty"]["coverage_on_new_ground"]
    assert got["all rows"] == pytest.approx(stored["leave one group out"]["all rows"])
    assert 0 < stored["chronological"]["all rows"]["rows"] < len(evaluated)
