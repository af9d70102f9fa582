"""A run directory as the report reads it: autopar.search.run_dir's files (the question, the
answer, the plans kept) plus the measured stage's trials and a what-if's other scenarios."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from autopar.figures import (
    BUBBLE_FRACTION,
    DOMINANT_COST,
    FITS,
    LAYOUT_TEXT,
    MEM,
    MEMORY_CAPACITY_BYTES,
    MEMORY_TERMS,
    MFU,
    PEAK_MEMORY_BYTES,
    PLAN_NAME,
    REJECTED_BY,
    STEP_TIME_S,
    TIME,
    TIME_TERMS,
    TOKENS_PER_S,
    TOKENS_PER_S_PER_GPU,
    VALID,
)
from autopar.search.run_dir import load, read_json, read_scenarios, read_trial  # noqa: F401  (read_json: compare reads plan files)

#: scatter.parquet columns the report reads
REQUIRED_COLUMNS = (
    (
        PLAN_NAME,
        FITS,
        VALID,
        REJECTED_BY,
        PEAK_MEMORY_BYTES,
        MEMORY_CAPACITY_BYTES,
        STEP_TIME_S,
        TOKENS_PER_S,
        TOKENS_PER_S_PER_GPU,
        MFU,
        BUBBLE_FRACTION,
        DOMINANT_COST,
        "tp",
        "cp",
        "pp",
        "vpp",
        "dp",
        "ep",
        "zero_stage",
        "micro_batch_size",
        "pp_schedule",
        "recompute",
        LAYOUT_TEXT,
    )
    + tuple(TIME[t] for t in TIME_TERMS)
    + tuple(MEM[t] for t in MEMORY_TERMS)
)


@dataclass
class RunData:
    """A run directory, loaded."""

    run_dir: Path
    plans: pd.DataFrame  # the plans the search kept (scatter.parquet), not every plan
    top: dict
    search: dict
    trials: list[dict] = field(default_factory=list)  # each: the trial JSON plus "_file"
    trial_problems: list[str] = field(default_factory=list)  # trial files skipped, and why
    scenarios: list[Path] = field(default_factory=list)  # what-if run directories (this one included)
    #: tables derived from the files, built once per load (autopar.report.top_tables.top_rows: a
    #: report asks for its top rows a dozen times, a what-if's reports for every scenario's winner)
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def question(self) -> dict:
        return self.search.get("question", {})

    @property
    def headroom_gib(self) -> float:
        return float(self.search.get("space", {}).get("constraints", {}).get("memory_headroom_gib", 0.0) or 0.0)

    @property
    def top_k(self) -> int:
        return len(self.top.get("top", []))

    @property
    def plans_fit(self) -> int:
        return int(self.search.get("plans_fit", int(self.plans[FITS].sum()) if len(self.plans) else 0))

    @property
    def plans_evaluated(self) -> int:
        return int(self.search.get("plans_evaluated", len(self.plans)))

    @property
    def sureness(self) -> list[str] | None:
        """search.json's `sureness` lines (autopar.search.results.sureness_lines), or None where the
        file has none (written before the search stored them) or not as a list of strings."""
        lines = self.search.get("sureness")
        if isinstance(lines, list) and all(isinstance(line, str) for line in lines):
            return list(lines)
        return None


def load_run(run_dir: str | Path, *, with_trials: bool = True, with_scenarios: bool = True) -> RunData:
    """Read a run directory. Missing or corrupt: InputError with one line naming the file and the fix."""
    files = load(run_dir, REQUIRED_COLUMNS)
    run = RunData(run_dir=files.run_dir, plans=files.scatter, top=files.top, search=files.search)
    if with_trials:
        run.trials, run.trial_problems = load_trials(run.run_dir)
    if with_scenarios:
        run.scenarios = read_scenarios(run.run_dir)
    return run


def load_trials(run_dir: Path) -> tuple[list[dict], list[str]]:
    """`trials/*.json` of the run: each needs `plan`, `predicted` and `measured` objects
    (autopar.search.run_schema.TrialDoc). Files that cannot be read or used are skipped and
    reported, so one bad trial does not hide the others."""
    out, problems = [], []
    for path in sorted((run_dir / "trials").glob("*.json")):
        data, why = read_trial(path)
        if data is None:
            problems.append(why)
        else:
            out.append(data | {"_file": path.name})
    return out, problems
