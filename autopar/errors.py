"""The one error type for bad user input.

Every layer raises `InputError` for input a user can fix; the CLI turns it into one line on
stderr and exit code 2. Its message names the problem and the fix.
"""

from __future__ import annotations

import difflib
import reprlib
import unicodedata
from collections.abc import Iterable

#: characters of a value that an error message quotes at most
VALUE_CHARS = 80
#: a word of a message longer than this is cut (a value that escaped `quoted`)
_WORD_CHARS = 200


class InputError(ValueError):
    """Bad input the user can fix. The message is one line: the problem, then the fix."""


class UnmetGoal(Exception):
    """An answer, not bad input: the question is sound but no plan meets its deadline or budget.
    The CLI prints the message (what the best plan needs) as one line and exits 1."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix for the closest choice, or '' when none is close."""
    if len(word) > VALUE_CHARS:  # no name is that long (and difflib is quadratic)
        return ""
    close = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _short_repr(value: object, limit: int) -> str:
    """repr of a non-string, bounded in the work it does (huge integers, deep or shared containers)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        digits = len(str(abs(value))) if value.bit_length() < 13000 else "thousands of"  # str() stops at 4300
        return f"an integer of {digits} digits"
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 2, 6, 6, 6, 6
    r.maxstring = r.maxother = r.maxlong = limit
    return r.repr(value)


def quoted(value: object, limit: int = VALUE_CHARS) -> str:
    """A value for a one-line message: repr-quoted (control characters escaped), at most `limit`
    characters of it, with how much was left out."""
    if not isinstance(value, str):
        text = _short_repr(value, limit)
        return text if len(text) <= limit + 3 else text[:limit] + "..."
    more = len(value) - limit
    return repr(value[:limit]) + (f"... ({more} more characters)" if more > 0 else "")


def _visible(c: str) -> str:
    """A character as a one-line message shows it: control and separator characters escaped."""
    return c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c


def one_line(text: str) -> str:
    """A message as one printable line: whitespace runs (newlines too) become one space, control
    characters are escaped, and any word longer than 200 characters is cut."""
    words = []
    for w in str(text).split():
        w = "".join(_visible(c) for c in w)
        words.append(w if len(w) <= _WORD_CHARS else w[: _WORD_CHARS // 2] + f"...({len(w)} characters)")
    return " ".join(words)
