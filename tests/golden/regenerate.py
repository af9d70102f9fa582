"""Write the golden files of tests/golden/cases.py (run from the repository root):
.venv/bin/python tests/golden/regenerate.py"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from golden_cases import ESTIMATES, SEARCHES
from golden_runner import run_estimate, run_search

HERE = Path(__file__).resolve().parent / "data"


def main() -> None:
    HERE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in SEARCHES.items():
            plans, top = run_search(args, Path(tmp) / name)
            plans.to_parquet(HERE / f"{name}.plans.parquet", index=False, compression="zstd")
            (HERE / f"{name}.top.json").write_text(json.dumps(top, indent=1, sort_keys=True) + "\n")
            print(f"search {name}: {len(plans)} plans")
        for name, args in ESTIMATES.items():
            est = run_estimate(args, Path(tmp))
            (HERE / f"{name}.estimate.json").write_text(json.dumps(est, indent=1, sort_keys=True) + "\n")
            print(f"estimate {name}")


if __name__ == "__main__":
    main()
