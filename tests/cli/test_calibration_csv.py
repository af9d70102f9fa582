"""`autopar validate --runs FILE` with hostile calibration CSVs (issue 24): a bad row is skipped with
its reason while the others are evaluated; the file is read with utf-8-sig, bounded in bytes and
rows, refused at once when it is a FIFO or a device; --fit with no evaluable row is one line and
exit 2 and writes nothing. `--json` output parses with a strict parser (no NaN, no Infinity)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from autopar.calibration.run_rows import MAX_RUN_ROWS, RUNS_BYTES, bundled_runs

#: rows 1-5 of the bundled table: dense Megatron-LM README runs on H100, all evaluable
ROWS = [r for r in bundled_runs() if r["row_id"] in ("1", "2", "3", "4", "5")]


def strict_json(text: str):
    """json.loads refusing NaN and Infinity (what a strict parser does)."""

    def refuse(word: str):
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def write_rows(path: Path, rows: list[dict], bom: bool = False) -> Path:
    with path.open("w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_gpus", "1e400"),
        ("num_gpus", "0"),
        ("tp", "0"),
        ("pp", "0"),
        ("num_attention_heads", "0"),
        ("micro_batch_size", "0"),
        ("seq_len", "1e400"),
        ("hidden_size", "1e400"),
        ("tokens_per_sec_per_gpu", "-5"),
        ("step_time_s", "-1"),
        ("mfu", "500%"),
    ],
)
def test_one_bad_row_is_skipped_with_its_reason(cli_run, tmp_path, field, value):
    path = write_rows(tmp_path / "my.csv", [dict(ROWS[0], **{field: value})] + ROWS[1:])
    r = cli_run("validate", "--runs", path, "--json")
    assert r.returncode == 0, r.stderr
    out = strict_json(r.stdout)
    assert out["evaluated"] == 4 and sorted(row["row_id"] for row in out["rows"]) == ["2", "3", "4", "5"]
    (skipped,) = out["skipped_rows"]
    assert skipped["row_id"] == "1" and field.split("_")[0] in json.dumps(skipped).lower(), skipped


def test_a_bom_file_reads_as_the_same_rows(cli_run, tmp_path):
    """An Excel CSV (UTF-8 with a byte-order mark) is the same table as without it."""
    plain = strict_json(cli_run("validate", "--runs", write_rows(tmp_path / "a.csv", ROWS), "--json").stdout)
    r = cli_run("validate", "--runs", write_rows(tmp_path / "b.csv", ROWS, bom=True), "--json")
    assert r.returncode == 0, r.stderr
    assert strict_json(r.stdout)["rows"] == plain["rows"] and plain["evaluated"] == 5


def test_fit_without_an_evaluable_row_is_one_line_and_writes_nothing(cli_run, one_line_error, tmp_path):
    path = write_rows(tmp_path / "bad.csv", [dict(r, tp="0") for r in ROWS])
    profile = tmp_path / "p.yaml"
    r = cli_run("validate", "--runs", path, "--fit", "--write-profile", profile)
    one_line_error(r, ["--fit", "no row to fit", "5 rows", "tp 0"])
    assert not profile.exists()


def test_a_file_over_the_byte_bound_is_one_line(cli_run, one_line_error, tmp_path):
    path = tmp_path / "big.csv"
    with path.open("wb") as f:  # sparse: the size is checked before a byte is read
        f.truncate(RUNS_BYTES + 1)
    one_line_error(cli_run("validate", "--runs", path), ["big.csv", "larger than 32 MiB"])


def test_a_file_over_the_row_bound_is_one_line(cli_run, one_line_error, tmp_path):
    path = tmp_path / "many.csv"
    header = ",".join(ROWS[0])
    path.write_text(header + "\n" + "1,x\n" * (MAX_RUN_ROWS + 1))
    one_line_error(cli_run("validate", "--runs", path), ["many.csv", f"more than {MAX_RUN_ROWS:,} rows"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_is_refused_at_once(cli_run, one_line_error, tmp_path, kind):
    path = tmp_path / "runs.csv"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    one_line_error(cli_run("validate", "--runs", path), ["runs.csv", "not a regular file"])


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", ["lacks the calibration columns"]),
        (",".join(ROWS[0]).encode() + b"\n", ["no row"]),
        (b"row_id,model\n1,\xe9\n", ["not UTF-8"]),
        (b'row_id,model\n1,"' + b"x" * 200_000 + b'"\n', ["not a readable CSV", "field larger than field limit"]),
    ],
    ids=["empty", "header-only", "latin-1", "huge-field"],
)
def test_an_unusable_file_is_one_line(cli_run, one_line_error, tmp_path, content, words):
    path = tmp_path / "runs.csv"
    path.write_bytes(content)
    one_line_error(cli_run("validate", "--runs", path), ["runs.csv", *words])


def test_a_long_table_shows_its_worst_rows_and_says_how_to_see_all(cli_run, tmp_path):
    """70 rows (rows 1-5 repeated with new ids): the per-row table keeps the 60 furthest off and
    says how many it leaves out and how to get them; --all-rows prints every row; --json lists all."""
    rows = [dict(ROWS[i % len(ROWS)], row_id=str(1000 + i)) for i in range(70)]
    path = write_rows(tmp_path / "long.csv", rows)
    table = cli_run("validate", "--runs", path)
    assert table.returncode == 0, table.stderr
    assert "10 more rows not shown: --all-rows prints every one, --json lists them all." in table.stdout
    shown = {str(1000 + i) for i in range(70) if f"\n│ {1000 + i} " in table.stdout}
    assert len(shown) == 60
    every = cli_run("validate", "--runs", path, "--all-rows")
    assert "more rows not shown" not in every.stdout
    assert {str(1000 + i) for i in range(70) if f"\n│ {1000 + i} " in every.stdout} == {
        str(1000 + i) for i in range(70)
    }
    assert len(strict_json(cli_run("validate", "--runs", path, "--json").stdout)["rows"]) == 70
