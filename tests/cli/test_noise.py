"""Tables without noise: no rows of zeros for what a plan does not have, no exponent notation for a
throughput."""

from __future__ import annotations

import re


def test_estimate_of_a_dense_plan_prints_no_rows_of_zeros(cli_run):
    out = cli_run("estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4").stdout
    assert "EP all-to-all" not in out and "CP comm" not in out and "offload" not in out
    assert not re.search(r"│ (ep|cp) +│ +0\.000 │", out)
    assert "TP comm (exposed)" in out and "pipeline bubble" in out  # the terms it has


def test_validate_prints_throughputs_with_separators(cli_run):
    out = cli_run("validate").stdout
    assert not re.search(r"\d\.\d+e\+\d\d", out)
    assert re.search(r"\d{1,3},\d{3}", out)


def test_the_fitted_constants_table_prints_no_exponents():
    """`validate --fit`'s constants (a layer overhead of 1,792 us, its shift of +1,392 over a
    400 us prior, a bucket of 40,000,000 parameters) as plain figures with separators."""
    from autopar.cli.render_validate import _figure, _signed_figure

    assert (_figure(1792.0), _signed_figure(1392.4), _figure(4e7)) == ("1,792", "+1,392", "40,000,000")
    assert (_figure(9.967), _signed_figure(-2.033), _signed_figure(0.0)) == ("9.967", "-2.03", "+0")


def test_a_space_of_one_trainer_says_the_others_were_not_searched(cli_run, tmp_path):
    """A space whose trainer knob names torchtitan only: the other trainers were not searched (not
    "nothing fits"), and torchtitan, which has a plan that fits, is not said to be unable to run."""
    from pathlib import Path

    default = (Path(__file__).resolve().parents[2] / "search_spaces" / "default.yaml").read_text()
    space = tmp_path / "tt.yaml"
    space.write_text(default.replace("  dtype: [bf16]", "  dtype: [bf16]\n  trainer: [torchtitan]", 1))
    out = cli_run("search", "--model", "8b", "--gpus", "8", "--space", space, "--run-dir", tmp_path / "run").stdout
    assert re.search(r"Megatron-LM +not searched", out) and re.search(r"DeepSpeed +not searched", out)
    assert "nothing fits" not in out
    assert "torchtitan cannot run" not in out


def test_a_knob_the_space_leaves_off_is_not_a_bound(cli_run, tmp_path):
    """Qwen3-30B-A3B at 4K: the space searches no context parallelism (its one choice is 1), so the
    winner's cp 1 is the space's choice, not a bound to widen."""
    out = cli_run("search", "--model", "qwen3-30b-a3b", "--gpus", "64", "--run-dir", tmp_path / "run").stdout
    assert "cp hit the space's maximum 1" not in out


def test_one_trainers_lines_rejecting_the_same_plans_are_one_entry():
    """DeepSpeed's moe, moe-dispatch and moe-dispatcher lines reject the same 74,750 MoE plans: one
    entry, not the same plans three times; other trainers' lines and other counts stay apart."""
    from autopar.spec.rules import rejection_summary

    counts = {
        "memory": 122577,
        "deepspeed:moe": 74750,
        "deepspeed:moe_dispatch": 74750,
        "deepspeed:moe_dispatcher": 74750,
        "torchtitan:zero_stages_with_pp": 71500,
        "deepspeed:uneven_stages": 71500,
        "torchtitan:ep_in_fsdp": 49680,
    }
    assert rejection_summary(counts) == (
        "memory (122,577), DeepSpeed: moe, moe dispatch, moe dispatcher (74,750), "
        "torchtitan: zero stages with pp (71,500), DeepSpeed: uneven stages (71,500), "
        "torchtitan: ep in fsdp (49,680)"
    )
    assert (
        rejection_summary(counts, limit=2) == "memory (122,577), DeepSpeed: moe, moe dispatch, moe dispatcher (74,750)"
    )
