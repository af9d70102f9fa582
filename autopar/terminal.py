"""Untrusted text never drives the terminal: `printable` is the one rule, applied to everything
autopar writes to stdout and stderr (the CLI wraps both in `SafeStream`; its rich consoles clean
every piece of text they lay out, autopar.cli.render).

A model or source name from a user's CSV, a run directory's name or a field of its JSON can hold an
escape sequence that retitles the window, clears the screen, hides text (a "concealed" or
same-colour style) or forges a hyperlink (OSC 8). So every control character but the newline and
the tab is shown escaped, as Python writes it (`\\x1b`, `\\x07`, `\\x9b`): the C0 controls, DEL,
the C1 controls (U+0080-U+009F, whose CSI U+009B starts a sequence on some terminals), and the
Unicode format characters that reorder or hide text (bidirectional overrides U+202A-U+202E and
U+2066-U+2069, zero-width characters). What autopar styles itself is added after the text is
cleaned, and only as SGR colour and weight sequences on a terminal.
"""

from __future__ import annotations

import re
from typing import TextIO

#: SGR (colour, weight) sequences: what a styled console writes itself, kept on a terminal only
SGR = re.compile(r"\x1b\[[0-9;]*m")
#: every character of the Unicode categories Cc (controls), Cf (format), Zl and Zp (line and
#: paragraph separators) but the newline and the tab: what `printable` escapes (a test checks the
#: ranges against unicodedata over every code point)
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)


def printable(text: str) -> str:
    """`text` with every character that could drive a terminal shown escaped (module docstring)."""
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class SafeStream:
    """A text stream that writes `printable` text: stdout and stderr of the command line. On a
    terminal the SGR sequences a styled writer adds (rich, click) pass; nothing else does."""

    def __init__(self, stream: TextIO) -> None:
        self.raw = stream
        self._styles = _isatty(stream)

    def write(self, text: str) -> int:
        if self._styles and "\x1b" in text:
            parts = SGR.split(text)
            styles = SGR.findall(text)
            cleaned = printable(parts[0]) + "".join(s + printable(p) for s, p in zip(styles, parts[1:]))
        else:
            cleaned = printable(text)
        self.raw.write(cleaned)
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def safe(stream: TextIO) -> TextIO:
    """`stream` wrapped in SafeStream (once)."""
    return stream if isinstance(stream, SafeStream) else SafeStream(stream)  # type: ignore[return-value]
