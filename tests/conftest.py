"""Settings for the whole suite."""

from __future__ import annotations

import os


def pytest_configure(config) -> None:
    """pytest-xdist's workers set COLUMNS=80 and LINES=24 (`make test` runs the suite on every
    core); the tests read autopar's piped output at its own default width, as a serial run does."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
