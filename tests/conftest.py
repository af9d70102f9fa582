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
    """The tests that share the torchrun launches (tests/trial/conftest.py `launches`) first, in
    their order: pytest-xdist's load scheduling hands the first items to one worker as one batch
    (about a quarter of its share), so that worker runs the launches one after another while the
    other works through the suite. Spread over both, one waited on the
    lock of a launch the other was running: about 100 s of a core per `make test` on 2 cores (the
    durations of tests/trial/test_distributed.py's cases matched their launches')."""
    shared = [item for item in items if "launches" in getattr(item, "fixturenames", ())]
    if shared:
        first = {id(item) for item in shared}
        items[:] = shared + [item for item in items if id(item) not in first]
