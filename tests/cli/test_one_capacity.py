"""One capacity figure everywhere: the search's tables, `estimate` and `compare` give a GPU's memory
as the GPU file's HBM in GiB (79.6 for the H100 SXM's 81,559 MiB), never a rounded "80"."""

from __future__ import annotations

import re

from autopar.spec.hardware import GIB, default_cluster


def test_search_estimate_and_compare_print_the_gpus_own_capacity(cli_run, tmp_path, monkeypatch):
    cap = f"{default_cluster('h100-sxm').gpu.hbm_bytes / GIB:.1f}"
    assert cap == "79.6"
    monkeypatch.chdir(tmp_path)
    search = cli_run("search", "--model", "70b", "--gpus", "256", "--top-k", "3", "--run-dir", "run").stdout
    estimate = cli_run("estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4").stdout
    compare = cli_run("compare", "--model", "70b", "--gpus", "256", "--tp 8 --pp 4", "--tp 4 --pp 8").stdout
    shown = re.findall(r"\d+\.\d/(\d+(?:\.\d)?)\b", search)  # the top table's "54.2/79.6"
    assert shown and set(shown) == {cap}, shown
    assert re.search(rf"peak \d+\.\d / {re.escape(cap)} GiB", estimate), estimate[:500]
    capacity = re.search(r"capacity\s+([\d.]+)\s+([\d.]+)", compare)
    assert capacity and {float(capacity[1]), float(capacity[2])} == {float(cap)}, compare[:800]
