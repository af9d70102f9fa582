"""`autopar report` and `autopar compare`: what they write, and bad input as one line
`autopar: error: ...` on stderr, nothing on stdout, exit code 2, never a traceback. Most cases run
the CLI's entry point in-process (fast); a few run it as a real `python -m autopar` subprocess."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in ("scatter.parquet", "top.json", "search.json"):
        shutil.copy(src / f, dst / f)
    return dst


@pytest.fixture(scope="module")
def bad_runs(run70, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bad")
    out = {"missing": base / "nope", "empty": base / "empty", "file": base / "a_file"}
    out["empty"].mkdir()
    out["file"].write_text("x")
    out["corrupt-parquet"] = _copy_run(run70, base / "corrupt_parquet")
    (out["corrupt-parquet"] / "scatter.parquet").write_bytes(b"PAR1 this is not parquet at all")
    out["truncated-parquet"] = _copy_run(run70, base / "truncated_parquet")
    p = out["truncated-parquet"] / "scatter.parquet"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    out["corrupt-top"] = _copy_run(run70, base / "corrupt_top")
    (out["corrupt-top"] / "top.json").write_text('{"top": [')
    out["no-search-json"] = _copy_run(run70, base / "no_search")
    (out["no-search-json"] / "search.json").unlink()
    out["wrong-columns"] = _copy_run(run70, base / "wrong_columns")
    pd.DataFrame({"a": [1, 2]}).to_parquet(out["wrong-columns"] / "scatter.parquet")
    return out


REPORT_CASES = [
    ("missing-dir", ["{missing}"], ["does not exist"]),
    ("not-a-dir", ["{file}"], ["not a directory"]),
    ("dir-without-scatter-parquet", ["{empty}"], ["scatter.parquet", "missing"]),
    ("corrupt-parquet", ["{corrupt-parquet}"], ["scatter.parquet", "corrupt"]),
    ("truncated-parquet", ["{truncated-parquet}"], ["scatter.parquet", "corrupt"]),
    ("corrupt-top-json", ["{corrupt-top}"], ["top.json", "corrupt"]),
    ("no-search-json", ["{no-search-json}"], ["search.json", "missing"]),
    ("wrong-columns", ["{wrong-columns}"], ["lacks column"]),
]


def one_line_error(p, needles) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == "", p.stdout
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("autopar: error: ")
    for n in needles:
        assert n.lower() in lines[0].lower(), (n, lines[0])
    return lines[0]


@pytest.mark.parametrize("case,args,needles", REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_report_bad_run_directory(cli, bad_runs, case, args, needles):
    argv = [a.format(**{k: str(v) for k, v in bad_runs.items()}) for a in args]
    one_line_error(cli("report", *argv), needles)


@pytest.mark.parametrize("case", ["missing", "corrupt-parquet"])
def test_report_bad_run_directory_subprocess(cli_subprocess, bad_runs, case):
    one_line_error(cli_subprocess("report", bad_runs[case]), ["does not exist" if case == "missing" else "corrupt"])


def test_compare_different_models_subprocess(cli_subprocess, run70):
    one_line_error(cli_subprocess("compare", run70, "--tp 8 --model llama3-8b"), ["models differ"])


def test_report_usage_errors(cli, run70, run70_128, tmp_path):
    one_line_error(cli("report", run70, run70_128, "--out", tmp_path / "x.html"), ["--out", "one run directory"])
    one_line_error(cli("report", run70, "--out", tmp_path), ["--out", "directory"])
    one_line_error(cli("report"), ["missing argument"])


def test_report_writes_the_page(cli, run70, tmp_path):
    out = tmp_path / "r.html"
    p = cli("report", run70, "--out", out)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"Report: {out} ({out.stat().st_size / 1e6:.1f} MB)"
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


FLAGS_A, FLAGS_B = "--tp 8 --pp 4", "--tp 4 --pp 8 --recompute full"


def test_compare_flag_strings_and_run_directories(cli, run70, tmp_path):
    out = tmp_path / "cmp.html"
    p = cli("compare", "--model", "70b", "--gpus", "256", FLAGS_A, FLAGS_B, run70, f"{run70}#3", "--out", out)
    assert p.returncode == 0, p.stderr
    assert "4 layouts of llama3-70b on 256 x h100-sxm" in p.stdout
    winner = json.loads((run70 / "top.json").read_text())["top"][0]["plan_name"]
    for label in ("#1 tp8.pp4.dp8", "#2 tp4.pp8.dp8", f"#3 {winner}"):
        assert label in p.stdout
    for row in ("step time", "TP comm", "pipeline bubble", "activations", "capacity", "MFU"):
        assert row in p.stdout
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.count('class="diff"') > 10 and 'class="best"' in text
    for fig in ("fig-time", "fig-memory", "fig-comm"):
        assert f'id="{fig}-json"' in text


def test_compare_run_directory_winner_equals_top_json(cli, run70):
    """A run directory's layouts, re-estimated by compare, have the numbers the search wrote."""
    p = cli("compare", run70, f"{run70}#2", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    top = json.loads((run70 / "top.json").read_text())["top"]
    assert got["model"] == "llama3-70b" and got["num_gpus"] == 256
    for lay, e in zip(got["layouts"], top[:2]):
        assert lay["name"] == e["plan_name"]
        assert lay["step_time_s"] == pytest.approx(e["step_time_s"], rel=1e-12)
        assert lay["peak_memory_bytes"] == pytest.approx(e["peak_memory_bytes"], rel=1e-12)
        assert lay["time_s"] == pytest.approx(e["time_s"], rel=1e-12)
        assert lay["memory_bytes"] == pytest.approx(e["memory_bytes"], rel=1e-12)


def test_compare_flag_strings_inherit_the_run_question(cli, run70, tmp_path):
    plan_file = tmp_path / "plan.json"
    top = json.loads((run70 / "top.json").read_text())["top"]
    plan_file.write_text(json.dumps({"plan": top[4]["plan"]}))
    p = cli("compare", run70, FLAGS_A, plan_file, "--json")
    assert p.returncode == 0, p.stderr
    lays = json.loads(p.stdout)["layouts"]
    assert lays[1]["plan"]["global_batch_size"] == 512 and lays[1]["plan"]["tp"] == 8
    assert lays[2]["step_time_s"] == pytest.approx(top[4]["step_time_s"], rel=1e-12)


COMPARE_CASES = [
    ("different-models", ["--model", "70b", "--gpus", "256", FLAGS_A, "--tp 8 --model llama3-8b"], ["models differ"]),
    ("run-vs-other-model", ["{run}", "--model", "llama3-8b", FLAGS_A], ["models differ", "llama3-8b", "llama3-70b"]),
    ("different-gpu-counts", ["{run}", "--tp 2 --gpus 128"], ["gpu counts differ"]),
    ("different-gpus", ["--model", "70b", "--gpus", "256", FLAGS_A, "--tp 8 --gpu a100-80gb"], ["clusters differ"]),
    ("one-layout", ["--model", "70b", "--gpus", "256", FLAGS_A], ["two or more"]),
    ("no-model", [FLAGS_A, FLAGS_B], ["--model", "--gpus"]),
    ("unknown-flag", ["--model", "70b", "--gpus", "256", "--tp 8 --pq 4", FLAGS_B], ["layout #1", "--pq"]),
    ("not-a-layout", ["--model", "70b", "--gpus", "256", FLAGS_A, "nonsense"], ["layout #2", "nonsense"]),
    ("rank-out-of-range", ["{run}", "{run}#99"], ["#99", "out of range"]),
    ("indivisible", ["--model", "70b", "--gpus", "256", FLAGS_A, "--tp 3"], ["layout #2", "divide"]),
    ("invalid-plan", ["--model", "70b", "--gpus", "256", FLAGS_A, "--tp 8 --pp 3"], ["layout #2"]),
    ("bad-rank-dir", ["{run}", "/nonexistent/dir#2"], ["layout #2"]),
    ("unbalanced-quotes", ["--model", "70b", "--gpus", "256", FLAGS_A, "--tp '8"], ["layout #2", "quotation"]),
]


@pytest.mark.parametrize("case,args,needles", COMPARE_CASES, ids=[c[0] for c in COMPARE_CASES])
def test_compare_bad_input(cli, run70, case, args, needles):
    argv = [a.replace("{run}", str(run70)) for a in args]
    one_line_error(cli("compare", *argv), needles)


def test_compare_an_estimate_json_file_lends_its_question(cli, tmp_path):
    est = cli("estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--json")
    assert est.returncode == 0, est.stderr
    f = tmp_path / "est.json"
    f.write_text(est.stdout)
    p = cli("compare", f, FLAGS_B, "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["model"] == "llama3-70b" and got["num_gpus"] == 256
    assert got["layouts"][0]["step_time_s"] == json.loads(est.stdout)["step_time_s"]
    assert got["layouts"][1]["plan"]["recompute"] == "full"
    one_line_error(cli("compare", f, FLAGS_B, "--gpus", "128"), ["gpu counts differ"])
