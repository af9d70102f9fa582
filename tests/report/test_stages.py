"""The winner's pipeline stages in the report (autopar/report/stage_tables.py, stage_figures.py): the
per-stage memory is the estimate's, the timeline is the schedule the search priced (its bubble the
priced bubble fraction, every stage's parts adding up to the priced step time), the export block's
command runs, and a what-if over GPU counts draws MFU against them; compare ranks only the rows
where lower or higher is better whatever the layout."""

from __future__ import annotations

import html
import json
import math
import re
import shlex
from pathlib import Path

import pytest

from autopar.report import run_data as D
from autopar.report import stage_tables as W
from autopar.report.html import REPORT_FILE, write_report, write_reports
from autopar.spec.hardware import GIB


def top_json(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "top.json").read_text())["top"]


def figure(text: str, fig_id: str) -> dict:
    return json.loads(re.search(rf'id="{fig_id}-json">(.*?)</script>', text, re.S).group(1))


@pytest.fixture(scope="module")
def page70(run70, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("stages") / "r.html"
    return write_report(run70, out=out).read_text(encoding="utf-8")


def _independent_estimate(entry: dict):
    """The winner estimated from scratch with the conftest's question (70B, 256 x H100, seq 8192)."""
    from autopar.calibration.estimate import estimate
    from autopar.spec.hardware import default_cluster
    from autopar.spec.plan import ParallelPlan
    from autopar.spec.presets import get_preset

    m = get_preset("llama3-70b")
    return estimate(ParallelPlan.from_dict(entry["plan"]), m, default_cluster("h100-sxm"), num_gpus=256, seq_len=8192)


def test_stage_memory_is_the_estimates(run70, page70):
    w = top_json(run70)[0]
    assert w["plan"]["pp"] > 1  # else there would be one stage to check
    est = _independent_estimate(w)
    stages = W.winner_stages(D.load_run(run70))
    assert stages is not None and stages.same_as_run
    want = [s["memory_bytes"] for s in est.extra["stages"]]
    assert len(want) == w["plan"]["pp"]
    # the most loaded stage is the peak the search ranked by
    assert max(want) == w["peak_memory_bytes"]
    section = re.search(r'<h2 id="stages">.*?</table>', page70, re.S).group(0)
    shown = [float(v) for v in re.findall(r'<td data-v="([^"]+)">[\d.]+</td><td data-v="[^"]+">[\d.]+%</td>', section)]
    assert shown == [b / GIB for b in want]
    fig = figure(page70, "fig-stage-memory")
    assert fig["data"][0]["x"] == [b / GIB for b in want]
    capacity = [s for s in fig["layout"]["shapes"] if s["line"]["color"] == "#d62728" and s["line"]["width"] == 2]
    assert capacity[0]["x0"] == w["memory_capacity_bytes"] / GIB
    assert "most memory" in section


def test_timeline_is_the_priced_schedule(run70, page70):
    """Figures from top.json (the search's pricing) and the estimate's stages, by hand: the pipeline
    lasts m x the slowest stage's time per microbatch / (1 - bubble fraction); the bubble is that
    fraction of it; each stage's parts add up to the step time."""
    w = top_json(run70)[0]
    est = _independent_estimate(w)
    m = w["plan"]["num_microbatches"]
    per_mb = [s["time_per_mb_s"] for s in est.extra["stages"]]
    pipeline = m * max(per_mb) / (1 - w["bubble_fraction"])
    fig = figure(page70, "fig-timeline")
    parts = {t["name"]: t["x"] for t in fig["data"]}
    bubble = parts["pipeline bubble"]
    assert all(math.isclose(b / pipeline, w["bubble_fraction"], rel_tol=1e-12) for b in bubble)
    assert all(math.isclose(b, w["time_s"]["bubble"], rel_tol=1e-9) for b in bubble)
    for i, t in enumerate(per_mb):
        total = sum(x[i] for x in parts.values())
        assert math.isclose(total, w["step_time_s"], rel_tol=1e-12)
        busy = parts["forward"][i] + parts["backward (with any recomputed forward)"][i]
        assert math.isclose(busy, m * t, rel_tol=1e-12)
        # no recomputation: the forward is a third of the FLOPs (forward + backward = 3 x forward)
        assert w["plan"]["recompute"] == "none"
        assert math.isclose(parts["forward"][i], m * t / 3, rel_tol=1e-12)
    end = next(s for s in fig["layout"]["shapes"] if s["line"].get("dash") == "dot")
    assert math.isclose(end["x0"], pipeline, rel_tol=1e-12)


def test_forward_share_counts_the_recomputed_forward():
    """Full recomputation re-runs the layers' forward in the backward (not the LM head's), so the
    forward's share of a microbatch falls from 1/3 towards 1/4."""
    from autopar.calibration.estimate import estimate
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import get_preset
    from autopar.spec.resolve import resolve_plan

    m, c = get_preset("llama3-70b"), default_cluster("h100-sxm")
    none = estimate(resolve_plan(m, 256, 8192, tp=8, pp=4), m, c, num_gpus=256, seq_len=8192)
    full = estimate(resolve_plan(m, 256, 8192, tp=8, pp=4, recompute="full"), m, c, num_gpus=256, seq_len=8192)
    assert W.forward_share(none) == pytest.approx(1 / 3, rel=1e-12)
    assert 1 / 4 < W.forward_share(full) < 1 / 3 - 0.01


def test_export_block_command_runs(run70, page70, cli, tmp_path):
    """The block's first command, as shown, exports the winner; every trainer it lists runs it."""
    import autopar.export  # noqa: F401  (registers the exporters)
    from autopar.export.registry import EXPORTERS

    w = top_json(run70)[0]
    cmds = [html.unescape(c) for c in re.findall(r'<pre class="cmd"><code>(.*?)</code></pre>', page70)]
    assert len(cmds) == len(w["trainers"]) >= 1
    argv = shlex.split(cmds[0])
    assert argv[:2] == ["autopar", "export"] and argv[-2:] == ["--to", w["trainer"]]
    assert Path(argv[argv.index("--run") + 1]) == run70.resolve()
    listed = [shlex.split(c)[-1] for c in cmds]
    assert sorted(listed) == sorted(w["trainers"]) and set(listed) <= set(EXPORTERS)
    r = cli(*argv[1:], "--out", tmp_path / "x")
    assert r.returncode == 0, r.stderr
    written = list((tmp_path / "x" / w["trainer"]).iterdir())
    assert written and any("--rank 1" in p.read_text() for p in written if p.is_file())  # the header's command


def test_whatif_over_gpu_counts_draws_mfu(run70, run70_128, tmp_path):
    import shutil

    dirs = []
    for src, name in ((run70, "a"), (run70_128, "b")):
        d = tmp_path / name
        d.mkdir()
        for f in ("scatter.parquet", "top.json", "search.json"):
            shutil.copy(src / f, d / f)
        dirs.append(d)
    write_reports(dirs)
    fig = figure((dirs[0] / REPORT_FILE).read_text(encoding="utf-8"), "fig-whatif-mfu")
    (line,) = fig["data"]
    assert line["x"] == [128.0, 256.0]
    assert line["y"] == [100 * top_json(run70_128)[0]["mfu"], 100 * top_json(run70)[0]["mfu"]]
    write_reports(dirs[:1])  # one scenario: no what-if, no MFU figure
    assert "fig-whatif-mfu" not in (dirs[0] / REPORT_FILE).read_text(encoding="utf-8")


def test_compare_ranks_only_where_lower_or_higher_is_better():
    """Of two layouts (TP 8 PP 4; TP 4 PP 8 with full recompute), the step time, throughput, MFU and
    peak memory are ranked; HFU (higher with recomputation, which does no work), the weights and
    every other part of a total are not, though they differ."""
    from autopar.calibration.estimate import estimate
    from autopar.report import compare_tables as C
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import get_preset
    from autopar.spec.resolve import resolve_plan

    m, c = get_preset("llama3-70b"), default_cluster("h100-sxm")
    plans = [resolve_plan(m, 256, 8192, tp=8, pp=4), resolve_plan(m, 256, 8192, tp=4, pp=8, recompute="full")]
    ests = [estimate(p, m, c, num_gpus=256, seq_len=8192).to_dict() | {"name": p.describe()} for p in plans]
    t = C.compare_table(["a", "b"], ests).set_index("key")
    keys = {k for _, k, _ in C.COMPARE_ROWS}
    assert set(C.BETTER) <= keys  # each declared direction names a row
    for k in ("hfu", "memory_bytes.weights", "time_s.compute", "bubble_fraction", "comm_bytes_per_gpu.tp"):
        assert t.loc[k, "differs"] and t.loc[k, "best"] == "", k
    faster = "a" if ests[0]["step_time_s"] < ests[1]["step_time_s"] else "b"
    assert t.loc["mfu", "best"] == faster and t.loc["step_time_s", "best"] == faster
    assert ests[1]["hfu"] > ests[1]["mfu"]  # the recomputation HFU counts
