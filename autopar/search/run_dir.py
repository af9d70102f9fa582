"""The run directory of `autopar search`: its layout and schema version, owned here. Everything else
(the report, compare, export, the measured stage) reads it through `load` and never guesses.

    search.json     the question, the options, the method, counts, timings, schema_version
    top.json        the top-k (full breakdowns), the best plan per trainer, the Pareto front, why
    plans.parquet   every evaluated plan (row groups written as the search streams): the plan's
                    columns and its key figures; rejected_code is a bitmask of the broken rules
                    (search.json's `rule_bits` names them; bit 63 = does not fit in memory)
    scatter.parquet every fitting Pareto point, each trainer's fastest plans and a uniform sample of
                    each category of plan, with every estimate column (the report's scatter)
    plans.csv       plans.parquet as CSV, only with --csv
    trials/<key>.json  a measured stage's (or `autopar trial --run-dir`'s) trial documents;
                    trials/work/ their launchers' scratch (autopar.measured.launcher)
    measured.json   the measured stage's figures (also under search.json's `measured`)
    calibrated.yaml the cluster profile the measured stage calibrated, when it did
    whatif.json     a what-if's scenario directories (relative to this one), read by the report
    study.db        an Optuna study, when the search's storage is the default (autopar.search.optuna_driver)
    report.html     the report (autopar.report.html)
    .incomplete     only while a search replaces these files, or after it was interrupted (search.json
                    is written last, then this marker removed); `load` refuses such a directory

Every file above but study.db and report.html is written here, each atomically (autopar.atomic).
"""

from __future__ import annotations

import io
import os
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from autopar.atomic import publish, temp_path, write_atomic, write_with
from autopar.calibration.uncertainty import INTERVAL_COLUMNS
from autopar.cost.columns import RANKING_COLUMNS
from autopar.errors import InputError, quoted
from autopar.figures import (
    DOMINANT_COST,
    FITS,
    HIGH,
    LAYOUT_TEXT,
    LOW,
    MEMORY_CAPACITY_BYTES,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    REJECTED_BY,
    STEP_TIME_S,
    SUPPORT_GAPS,
    TOKENS_PER_S,
    VALID,
)
from autopar.json_out import dumps
from autopar.secrets import mask_values
from autopar.spec import read_file
from autopar.spec.plan import RESULT_FIELDS
from autopar.spec.plan_fields import BOOL, CATEGORY, FLOAT, INT, LAYOUT, MODULES, OFFLOAD
from autopar.spec.table import PlanTable

SCHEMA_VERSION = 2
#: bytes at most of top.json, search.json and scatter.parquet (the largest top-k and Optuna history
#: autopar writes are a few hundred MiB), of a trial document and of the .incomplete marker
RUN_FILE_BYTES = 1 << 30
TRIAL_BYTES = 16 << 20
MARKER_BYTES = 64 << 10
FILES = ("search.json", "top.json", "plans.parquet", "scatter.parquet")
#: present while a search replaces the files (autopar.search.run_state); search.json is written last
INCOMPLETE = ".incomplete"
WHATIF_FILE = "whatif.json"
#: bytes at most of whatif.json (a path per scenario of at most 32 GPU counts x kinds x ...)
WHATIF_BYTES = 4 << 20

# plans.parquet's plan columns, the search results' (autopar.spec.plan.RESULT_FIELDS) grouped by type:
#: integers, stored as int32 (the plan's place in the walk first, as int64)
INTEGERS = ("plan_index",) + tuple(f.column for f in RESULT_FIELDS if f.kind in (INT, LAYOUT, MODULES, OFFLOAD))
#: categorical columns, as dictionaries of their names (the trainer that runs the plan first):
#: name in plans.parquet -> (PlanTable column, names of its codes)
CATEGORIES = {
    f.name: (f.column, f.choices) for f in sorted(RESULT_FIELDS, key=lambda f: f.plan_key) if f.kind == CATEGORY
}
BOOLEANS = tuple(f.column for f in RESULT_FIELDS if f.kind == BOOL)
#: numbers, stored as float32
FLOATS = tuple(f.column for f in RESULT_FIELDS if f.kind == FLOAT)
#: the search's ranking figures but the GPU's capacity (one number, in search.json), then the intervals
FIGURES = tuple(f for f in RANKING_COLUMNS if f != MEMORY_CAPACITY_BYTES) + INTERVAL_COLUMNS


class PlansWriter:
    """plans.parquet, one row group per priced chunk (atomic: renamed into place when closed).
    Each row group is encoded and compressed on a background thread (Arrow releases the GIL) while
    the search prices the next chunk; one is in flight at a time, and a failed write raises at the
    next call. The chunk's arrays are not changed after they are handed over (each chunk is priced
    into new ones)."""

    def __init__(self, run_dir: Path, extra=None):
        self.path = run_dir / "plans.parquet"
        #: (table, estimate) -> more columns (the whole run's days and cost with --tokens)
        self.extra = extra
        self.tmp = temp_path(self.path)
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plans-parquet")
        self._in_flight: Future | None = None

    def write(self, parts: list[tuple[PlanTable, dict]]) -> None:
        """One row group of the (table, estimate) parts of a priced chunk."""
        batch = pa.concat_tables([pa.table(self._columns(table, est)) for table, est in parts])
        self._finish_in_flight()
        if self.writer is None:
            # plain (not dictionary) pages compress smaller and write ~3x faster here, but the
            # categorical columns keep their dictionaries (decoding them to plain strings costs a
            # quarter of the write); statistics only where a reader filters (plan, speed, memory, fit)
            self.writer = pq.ParquetWriter(
                self.tmp,
                batch.schema,
                compression="zstd",
                use_dictionary=list(CATEGORIES),
                write_statistics=["plan_index", STEP_TIME_S, PEAK_MEMORY_BYTES, FITS, VALID],
            )
        self._in_flight = self._thread.submit(self.writer.write_table, batch)
        self.rows += batch.num_rows

    def _finish_in_flight(self) -> None:
        pending, self._in_flight = self._in_flight, None
        if pending is not None:
            pending.result()  # the writer's error, if any, raised here

    def _columns(self, table: PlanTable, est: dict) -> dict:
        c = table.columns
        out: dict = {}
        for name in INTEGERS:
            if name in c:
                out[name] = pa.array(c[name], type=pa.int64() if name == "plan_index" else pa.int32())
        for name, (col, names) in CATEGORIES.items():
            out[name] = pa.DictionaryArray.from_arrays(pa.array(c[col], type=pa.int8()), pa.array(list(names)))
        for name in BOOLEANS:
            out[name] = pa.array(c[name], type=pa.bool_())
        for name in FLOATS:
            out[name] = pa.array(c[name], type=pa.float32())
        for name in FIGURES:
            out[name] = pa.array(est[name])
        if self.extra is not None:
            out |= {name: pa.array(v) for name, v in self.extra(table, est).items()}
        return out

    def close(self) -> None:
        try:
            self._finish_in_flight()
        finally:
            self._thread.shutdown()
        if self.writer is not None:
            self.writer.close()
            publish(self.path)
        elif self.path.exists():
            self.path.unlink()

    def abort(self) -> None:
        with suppress(Exception):  # aborting anyway: the partial file is removed below
            self._finish_in_flight()
        self._thread.shutdown()
        if self.writer is not None:
            self.writer.close()
        self.tmp.unlink(missing_ok=True)


def write_csv(run_dir: Path) -> Path:
    """plans.csv from plans.parquet, row group by row group."""
    import pyarrow.csv as pacsv

    src = pq.ParquetFile(run_dir / "plans.parquet")

    def write(tmp: Path) -> None:
        with pacsv.CSVWriter(tmp, src.schema_arrow) as w:
            for i in range(src.num_row_groups):
                w.write_table(src.read_row_group(i))

    return write_with(run_dir / "plans.csv", write)


def write_scatter(run_dir: Path, df: pd.DataFrame) -> None:
    write_with(run_dir / "scatter.parquet", lambda tmp: df.to_parquet(tmp, index=False))


def write_top(run_dir: Path, doc: dict) -> None:
    write_atomic(run_dir / "top.json", dumps(doc, indent=2))


def write_search_info(run_dir: Path, info: dict) -> None:
    """search.json: written last by a search (autopar.search.run_state unmarks the directory after it)."""
    write_atomic(run_dir / "search.json", dumps(info, indent=2))


def write_marker(run_dir: Path, doc: dict) -> None:
    """The .incomplete marker (autopar.search.run_state), with who holds the directory."""
    write_atomic(run_dir / INCOMPLETE, dumps(doc))


def write_trial_doc(doc: dict, trials_dir: Path) -> Path:
    """trials/<key>.json (`trials_dir`: the run directory's trials/)."""
    trials_dir = Path(trials_dir)
    trials_dir.mkdir(parents=True, exist_ok=True)
    return write_atomic(trials_dir / f"{doc['key']}.json", dumps(doc, indent=1))


def write_measured(run_dir: Path, figures: dict, calibrated_yaml: str | None) -> None:
    """The measured stage's files: calibrated.yaml (when it calibrated), measured.json, and the
    figures in this search's own search.json, read back through the one reader."""
    from autopar.spec.read_file import read_json as read_raw

    if calibrated_yaml is not None:
        write_atomic(run_dir / "calibrated.yaml", calibrated_yaml)
    write_atomic(run_dir / "measured.json", dumps(figures, indent=2))
    info_path = run_dir / "search.json"
    info = read_raw(info_path, f"'{info_path}'", RUN_FILE_BYTES)
    info["measured"] = figures
    write_search_info(run_dir, info)


def write_scenarios(run_dir: Path, scenarios: list[Path]) -> None:
    """Record the what-if scenario directories (relative to this run directory) in whatif.json."""
    rel = [os.path.relpath(Path(s).resolve(), Path(run_dir).resolve()) for s in scenarios]
    write_atomic(Path(run_dir) / WHATIF_FILE, dumps({"scenarios": rel}, indent=2))


def forget_scenarios(run_dir: Path) -> None:
    """Remove a whatif.json an earlier what-if left (a search of one scenario)."""
    (Path(run_dir) / WHATIF_FILE).unlink(missing_ok=True)


def read_scenarios(run_dir: Path) -> list[Path]:
    """The what-if scenarios recorded with this run (whatif.json), as directories; [] when none."""
    from autopar.search.run_schema import Scenarios, check

    path = run_dir / WHATIF_FILE
    if not path.exists():
        return []
    fix = "rerun the what-if search, or delete the file"
    doc = check(read_file.read_json(path, f"'{path}'", WHATIF_BYTES, fix=fix), Scenarios, f"'{path}'", fix)
    data = cast(dict, doc)  # valid for Scenarios: a JSON object
    dirs = [Path(p) for p in data["scenarios"]]
    return [p if p.is_absolute() else (run_dir / p) for p in dirs]


@dataclass
class RunFiles:
    """What a run directory holds, read whole (top.json, search.json, the scatter)."""

    run_dir: Path
    search: dict
    top: dict
    scatter: pd.DataFrame

    @property
    def question(self) -> dict:
        return self.search.get("question", {})


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:160] + "...") if len(text) > 160 else text or type(e).__name__


def _writer_alive(marker: Path) -> bool:
    """Whether the search that wrote the marker still runs: another process of this host (a second
    worker sharing the run directory, whose files are each replaced atomically)."""
    import socket

    try:
        who = read_file.read_json(marker, f"'{marker}'", MARKER_BYTES)
        pid = int(who["pid"])
        if who.get("host") != socket.gethostname() or pid == os.getpid():
            return False
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (OSError, ValueError, KeyError, TypeError, OverflowError):  # InputError: an unreadable marker
        return False
    return True


def _check_complete(d: Path) -> None:
    """One line when the run directory is marked incomplete (autopar.search.run_state) by a search
    that no longer runs."""
    marker = d / INCOMPLETE
    if marker.exists() and not _writer_alive(marker):
        raise InputError(
            f"'{d}' holds a search that did not finish (interrupted); rerun the same "
            f"`autopar search ... --run-dir {d}` to finish it"
        )


def read_json(path: Path) -> dict:
    """A JSON object file through the one reader (autopar.spec.read_file): a run directory's
    top.json or search.json, checked against its schema (autopar.search.run_schema; and refused
    while the directory is marked incomplete), or a plan file (compare's). One line naming the file
    and the fix when it is missing, special, too large, not JSON or of the wrong shape."""
    from autopar.search.run_schema import FILES, PlanFile, check, check_run_file

    run_file = path.name in FILES
    if run_file:
        _check_complete(path.parent)
        if not path.exists():
            raise InputError(
                f"'{path}' is missing: '{path.parent}' is not a complete autopar run directory; rerun "
                f"`autopar search ... --run-dir {path.parent}`"
            )
    fix = (
        "rerun `autopar search` to rewrite the run directory"
        if run_file
        else "give a plan JSON file written by autopar (`autopar estimate --json`, a trial file)"
    )
    data = read_file.read_json(path, f"'{path}'", RUN_FILE_BYTES, fix=fix)
    if not isinstance(data, dict):
        raise InputError(f"'{path}' is corrupt: expected a JSON object; {fix}")
    if path.name == "search.json":
        _check_version(path.parent, data)  # another schema's fields are not this one's
    checked = check_run_file(data, path) if run_file else check(data, PlanFile, f"plan file '{path}':", fix)
    # what autopar wrote is masked already; a file edited by hand may hold a password, which then
    # reaches no page, export or message
    return mask_values(checked)


def read_trial(path: Path) -> tuple[dict | None, str]:
    """A trial document (trials/*.json, through the one reader) checked against its schema, or
    (None, why it is skipped: 'trials/x.json is not valid JSON ...')."""
    from autopar.search.run_schema import trial_problem

    what = f"trials/{path.name}"
    try:
        data = read_file.read_json(path, what, TRIAL_BYTES, fix="")
    except InputError as e:
        return None, _one_line(e).removesuffix("; ")
    why = trial_problem(data)
    return (None, f"{what}: {why}") if why else (mask_values(data), "")


def _check_version(d: Path, search: dict) -> None:
    """One line when search.json was written by an autopar of another run-directory schema."""
    version = search.get("schema_version", 1)
    if version != SCHEMA_VERSION:
        raise InputError(
            f"'{d}' was written by another autopar (run schema {quoted(version, 20)}, this one reads "
            f"{SCHEMA_VERSION}); rerun the search"
        )


def load(run_dir: str | Path, required_columns: tuple[str, ...] = ()) -> RunFiles:
    """A finished run directory of this schema version, its scatter holding `required_columns`, or
    one line saying what is wrong and what to do."""
    d = Path(run_dir)
    hint = "give a directory written by `autopar search --run-dir DIR`"
    if not d.exists():
        raise InputError(f"run directory '{d}' does not exist; {hint}")
    if not d.is_dir():
        raise InputError(f"'{d}' is not a directory; {hint}")
    _check_complete(d)
    missing = [f for f in ("scatter.parquet", "top.json", "search.json") if not (d / f).exists()]
    if missing:
        raise InputError(
            f"'{d}' is not a complete autopar run directory: {', '.join(missing)} missing; "
            f"rerun `autopar search ... --run-dir {d}`"
        )
    search = read_json(d / "search.json")  # and its schema version
    top = read_json(d / "top.json")
    fix = f"rerun `autopar search ... --run-dir {d}`"
    data = read_file.read_bytes(d / "scatter.parquet", f"'{d / 'scatter.parquet'}'", RUN_FILE_BYTES, fix=fix)
    try:
        scatter = pd.read_parquet(io.BytesIO(data))
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError, ...) for a bad file
        raise InputError(f"'{d / 'scatter.parquet'}' is corrupt or unreadable ({_one_line(e)}); {fix}") from None
    lacking = [c for c in required_columns if c not in scatter.columns]
    if lacking:
        raise InputError(
            f"'{d / 'scatter.parquet'}' lacks column(s) {', '.join(lacking[:5])}"
            f"{' ...' if len(lacking) > 5 else ''}; it was not written by this autopar version; "
            f"rerun `autopar search`"
        )
    present = tuple(c for c in _FIGURE_COLUMNS if c in scatter.columns and c not in required_columns)
    _check_scatter_types(scatter, (*required_columns, *present), d / "scatter.parquet", fix)
    return RunFiles(d, search, top, scatter)


#: scatter.parquet columns a reader uses where this version writes them (an older run has none):
#: the 80 % intervals and the support gaps
_FIGURE_COLUMNS = (
    LOW[STEP_TIME_S],
    HIGH[STEP_TIME_S],
    LOW[TOKENS_PER_S],
    HIGH[TOKENS_PER_S],
    LOW[PEAK_MEMORY_BYTES],
    HIGH[PEAK_MEMORY_BYTES],
    SUPPORT_GAPS,
)

#: scatter.parquet columns that hold text (the plan's names and categories, the rejection, the why)
_TEXT_COLUMNS = frozenset(
    {PLAN_NAME, REJECTED_BY, DOMINANT_COST, "pp_schedule", "recompute", LAYOUT_TEXT, "trainer", "dtype"}
)


def _check_scatter_types(scatter: pd.DataFrame, columns: tuple[str, ...], path: Path, fix: str) -> None:
    """The columns a reader needs have the type this version writes: text, true/false (`valid`,
    `fits`, the plan's switches) or numbers; the figures are not all missing. One line naming the
    file, the column and the fix otherwise."""
    from pandas.api import types as t

    from autopar.spec.plan import FIELDS
    from autopar.spec.plan_fields import BOOL, INT

    flags = {VALID, FITS} | {f.column for f in FIELDS if f.kind == BOOL}
    whole = {f.column for f in FIELDS if f.kind == INT}  # a plan's knob: every row holds one
    for c in columns:
        col = scatter[c]
        if c in _TEXT_COLUMNS:
            ok = t.is_string_dtype(col) or t.is_object_dtype(col) or isinstance(col.dtype, pd.CategoricalDtype)
            want = "text"
        elif c in flags:
            ok, want = t.is_bool_dtype(col), "true/false"
        else:
            ok, want = t.is_numeric_dtype(col) and not t.is_bool_dtype(col), "numbers"
        if not ok:
            raise InputError(f"'{path}' column '{c}' holds {col.dtype} where this autopar writes {want}; {fix}")
        if c in whole and not np.isfinite(col.to_numpy(dtype=float)).all():
            raise InputError(f"'{path}' column '{c}' is missing for some plans (a knob every plan has); {fix}")
    if STEP_TIME_S in columns and len(scatter) and scatter[STEP_TIME_S].isna().all():
        raise InputError(f"'{path}' has no step time for any plan (every figure is missing); {fix}")


def rejection_bits() -> list[str]:
    """Names of the bits of rejected_code (for search.json)."""
    from autopar.spec.rules import all_rules

    return [r.name for r in all_rules()]
