"""Bad input to `autopar search`: every case is a real `python -m autopar` subprocess that exits 2
with ONE stderr line `autopar: error: ...` naming the problem, and no traceback."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow]  # every case is a fresh `python -m autopar` process

FILES = {
    # TP 16 only, but TP must stay inside an 8-GPU node: nothing left
    "tp16.yaml": "knobs:\n  tp: [16]\nconstraints:\n  tp_within_node: true\n",
    # tp*pp*cp = 8 never divides 12 GPUs
    "tp8.yaml": "knobs:\n  tp: [8]\n  pp: [1]\n  cp: [1]\n",
    "broken.yaml": "knobs:\n  tp: [1, 2\n  pp: : \n",
}

S70 = ["search", "--model", "llama3-70b"]

# (id, argv after `python -m autopar`, substrings the error line must contain (case-insensitive))
CASES = [
    ("space-empty-after-constraints", S70 + ["--gpus", "64", "--space", "{tmp}/tp16.yaml"], ["empty", "space"]),
    ("no-layout-divides-gpus", S70 + ["--gpus", "12", "--space", "{tmp}/tp8.yaml"], ["12", "divide"]),
    ("malformed-space-yaml", S70 + ["--gpus", "64", "--space", "{tmp}/broken.yaml"], ["broken.yaml", "yaml", "line"]),
    ("unknown-space-name", S70 + ["--gpus", "64", "--space", "nosuch"], ["nosuch", "default"]),
    ("unknown-space-typo", S70 + ["--gpus", "64", "--space", "defualt"], ["did you mean 'default'"]),
    (
        "storage-cannot-open",
        S70
        + [
            "--gpus",
            "64",
            "--max-exhaustive",
            "0",
            "--n-trials",
            "5",
            "--storage",
            "postgresql+psycopg2://nobody@127.0.0.1:1/nothing",
            "--run-dir",
            "{tmp}/run",
        ],
        ["storage", "127.0.0.1:1"],
    ),
    ("gpus-zero", S70 + ["--gpus", "0"], ["--gpus"]),
    ("gpus-not-a-number", S70 + ["--gpus", "128,abc"], ["--gpus", "128,abc"]),
    (
        "sampler-unknown",
        S70 + ["--gpus", "64", "--sampler", "nosuch", "--max-exhaustive", "0", "--run-dir", "{tmp}/run"],
        ["sampler", "nosuch", "tpe"],
    ),
    ("what-if-with-run-dir", S70 + ["--gpus", "128,256", "--run-dir", "{tmp}/run"], ["--run-dir"]),
]


@pytest.mark.parametrize("argv,needles", [(a, n) for _, a, n in CASES], ids=[i for i, _, _ in CASES])
def test_bad_search_input(run_cli, tmp_path, argv, needles):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = run_cli(*args, timeout=120)
    assert r.returncode == 2, f"exit {r.returncode}\nstdout: {r.stdout[-1000:]}\nstderr: {r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{r.stderr}"
    line = lines[0]
    assert line.startswith("autopar: error:"), line
    for needle in needles:
        assert needle.lower() in line.lower(), f"{needle!r} not in {line!r}"
    assert r.stdout.strip() == "", f"stdout should be empty: {r.stdout[:500]}"
    # nothing half-made is left behind (no SQLite study, no results)
    assert not (tmp_path / "run" / "study.db").exists()
    assert not (tmp_path / "run" / "plans.parquet").exists()
