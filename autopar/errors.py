"""The one error type for bad user input.

Every layer raises `InputError` for input a user can fix; the CLI turns it into one line on
stderr and exit code 2. Its message names the problem and the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(ValueError):
    """Bad input the user can fix. The message is one line: the problem, then the fix."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""
