"""Settings for the whole suite."""

from __future__ import annotations

import os


def pytest_configure(config) -> None:
    """pytest-xdist's workers set COLUMNS=80 and LINES=24 (`make test` runs the suite on every
    core); the tests read autopar's piped output at its own default width, as a serial run does."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


def pytest_collection_modifyitems(config, items) -> None:
    """The long tests (marked distributed or slow: torchrun trials, real DeepSpeed runs) first, in
    their order: under `make test`'s workers the short ones then fill in around them instead of
    leaving one worker alone with a long tail. A stable sort, the same on every worker."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("distributed") or item.get_closest_marker("slow") else 1)
