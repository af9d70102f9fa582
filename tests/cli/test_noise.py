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
