"""A run directory edited by hand or half-written: every field of each JSON file of a real run
directory is corrupted in turn (a number made NaN, infinite, a string or negative; a string made a
number, an object or null; a list or object made a scalar), and every reader of run directories
(`report`, `export --run`, `compare`) either refuses it in one line with exit 2 or does not depend
on that field (exit 0). Never a traceback, never another exit.

A list of records is corrupted in its first record, and a record shape that repeats (the plan
entries of top.json's `top`, `variants`, `pareto` and `per_trainer`) once per field name: one
schema reads every entry."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

READERS = {
    "report": lambda run, out: ("report", run, "--out", out / "r.html"),
    "export": lambda run, out: ("export", "--run", run, "--to", "megatron", "--out", out / "export"),
    "compare": lambda run, out: ("compare", run, f"{run}#2"),
}
FILES = ("search.json", "top.json")


def _leaves(x, path=()):
    """Paths of every leaf (and empty container); a list's first element only, and of an object
    whose values are records of one shape or null (top.json's `per_trainer`), the first record and
    the nulls."""
    if isinstance(x, dict):
        if not x:
            yield path
        records = [(k, v) for k, v in x.items() if isinstance(v, dict)]
        one_shape = len(records) > 1 and len({tuple(v) for _, v in records}) == 1
        if one_shape and all(v is None or isinstance(v, dict) for v in x.values()):
            x = {k: v for k, v in x.items() if v is None} | dict(records[:1])
        for key, value in x.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(x, list):
        if not x:
            yield path
        for i, value in enumerate(x[:1]):
            yield from _leaves(value, (*path, i))
    else:
        yield path


def _distinct(paths):
    """One path per field of a repeated record: keyed by what follows the first list index."""
    seen, kept = set(), []
    for p in paths:
        first = next((i for i, k in enumerate(p) if isinstance(k, int)), None)
        key = p if first is None else ("[]", *p[first:])
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return kept


def _corrupt(value, i: int):
    """A wrong value of another kind, cycling through the kinds by `i`."""
    if isinstance(value, bool):
        return ["yes", 2][i % 2]
    if isinstance(value, (int, float)):
        return [float("nan"), float("inf"), "12", -1][i % 4]
    if isinstance(value, str):
        return [17, {"a": 1}, None][i % 3]
    if value is None:
        return [[1], "x"][i % 2]
    if isinstance(value, list):
        return ["x", 3][i % 2]
    return [3, "x"][i % 2]  # an object


def _at(data, path):
    for key in path:
        data = data[key]
    return data


@pytest.fixture(scope="module")
def run_dir(cli_run, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("sound") / "run"
    r = cli_run("search", "--model", "tiny", "--gpus", "8", "--run-dir", run, "--json")
    assert r.returncode == 0, r.stderr
    return run


@pytest.fixture(scope="module")
def measured_run_dir(cli_run, tmp_path_factory) -> Path:
    """A run with its measured stage: one trial of the built-in model on this machine's CPUs (its
    measured.json and trials/*.json)."""
    run = tmp_path_factory.mktemp("measured") / "run"
    r = cli_run("search", "--model", "tiny", "--gpus", "2", "--gpu", "local", "--trials", "1", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    return run


@pytest.mark.slow
@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("name", FILES)
def test_every_field_corrupted_is_refused_in_one_line_or_not_read(cli_run, run_dir, tmp_path, name, reader):
    _corrupt_each_field(cli_run, run_dir, tmp_path, name, reader)


@pytest.mark.slow
def test_every_field_of_the_measured_stage_corrupted_is_refused_or_not_read(cli_run, measured_run_dir, tmp_path):
    """measured.json and a trial file of a run with trials, for every reader (one test: the trial
    that makes the run is launched once)."""
    for name in ("measured.json", "trials/*.json"):
        found = sorted(measured_run_dir.glob(name))
        assert found, f"the run has no {name}"
        for reader in sorted(READERS):
            where = tmp_path / f"{found[0].stem}-{reader}"
            _corrupt_each_field(cli_run, measured_run_dir, where, str(found[0].relative_to(measured_run_dir)), reader)


def _refused_or_not_read(r, what: str) -> bool:
    """The reader refused the corrupted file in one line (exit 2: True) or ran (exit 0: False);
    never a traceback or another exit."""
    shown = f"{what} exit {r.returncode}\n{r.stderr[-600:]}"
    assert r.returncode in (0, 2), shown
    assert "Traceback" not in r.stderr + r.stdout, shown
    if r.returncode == 2:
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("autopar: error: "), shown
    return r.returncode == 2


def _corrupt_each_field(cli_run, run_dir: Path, tmp_path: Path, name: str, reader: str) -> None:
    """Every field of the run's JSON file `name` corrupted in turn: `reader` refuses it in one line
    (exit 2) or does not read it (exit 0)."""
    sound = json.loads((run_dir / name).read_text())
    paths = _distinct(list(_leaves(sound)))
    assert len(paths) > 20  # the files hold the fields this test is about
    refused = 0
    for i, path in enumerate(paths):
        case = tmp_path / f"case{i}"
        run = case / "run"
        shutil.copytree(run_dir, run)
        data = json.loads((run_dir / name).read_text())
        holder = _at(data, path[:-1]) if path else None
        bad = _corrupt(_at(data, path), i)
        if holder is None:
            data = bad
        else:
            holder[path[-1]] = bad
        (run / name).write_text(json.dumps(data))
        r = cli_run(*READERS[reader](run, case))
        refused += _refused_or_not_read(r, f"{name} {'.'.join(map(str, path))} = {bad!r}: {reader}")
        shutil.rmtree(case)
    # the typed schema refuses corrupted fields up front (finite numbers, ranges, enums); the rest
    # are fields this reader does not read (the figures a re-estimate recomputes)
    if name in FILES:  # what every reader reads
        assert refused > 0, f"none of {len(paths)} corrupted fields refused by {reader}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ("scatter.parquet", "plans.parquet"))
def test_every_column_corrupted_is_refused_in_one_line_or_not_read(cli_run, run_dir, tmp_path, name):
    """The parquet files likewise, a column at a time: made text, all missing (NaN) or negative. A
    knob every plan has (pp, ZeRO, micro-batch) missing for some plans and an interval column of
    text were tracebacks in `report` (int(NaN), float('x')) before the scatter's check read them."""
    import pandas as pd

    sound = pd.read_parquet(run_dir / name)
    assert len(sound.columns) > 30
    for i, column in enumerate(sound.columns):
        case = tmp_path / f"case{i}"
        run = case / "run"
        shutil.copytree(run_dir, run)
        frame = sound.copy()
        frame[column] = [["x"] * len(frame), float("nan"), -1][i % 3]
        frame.to_parquet(run / name)
        for reader in sorted(READERS):
            r = cli_run(*READERS[reader](run, case))
            _refused_or_not_read(r, f"{name} {column} (kind {i % 3}): {reader}")
        shutil.rmtree(case)
