"""Values written into generated scripts: refuse what no quoting makes safe, quote the rest.

Exports and `autopar trial --emit-slurm` write user values (job names, partitions, paths, model
names, recipe names) into shell scripts, sbatch directives, Python and TOML files:
- control characters (newline, carriage return, tab, ...), Unicode line and paragraph separators
  and bidirectional overrides are refused: `check_text` raises a one-line InputError;
- shell words: `shlex.quote`; sbatch directive values: `sbatch_word` (double quotes with `\\` and
  `"` escaped, which sbatch's own `#SBATCH` parser and a POSIX shell read the same way; sbatch
  honours a backslash even inside single quotes, so shlex.quote would not round-trip there);
- Python literals: `repr`; TOML strings: `toml_string`;
- module and function names: `check_identifier` (ASCII identifiers, dotted for module paths);
- comments: `comment_text` escapes whatever could end the comment line.
"""

from __future__ import annotations

import json
import keyword
import re
import string
import unicodedata

from autopar.errors import InputError

#: bidirectional embedding / override / isolate marks ("trojan source": code that reads differently)
_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: characters an sbatch directive value keeps unescaped
_SBATCH_PLAIN = frozenset(string.ascii_letters + string.digits + "_@%+=:,./-")


def _unsafe(c: str) -> bool:
    """Whether a character may end a line, or reorder what a reader sees, in some target language."""
    return c in _BIDI or unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")  # Cs: a lone surrogate


def shown(value: object, limit: int = 60) -> str:
    """A value for a one-line message: quoted with control characters escaped, cut to `limit`."""
    text = str(value)
    more = len(text) - limit
    return repr(text[:limit]) + (f"... ({more} more characters)" if more > 0 else "")


def check_text(value: str, what: str) -> str:
    """`value` unchanged; a one-line InputError naming `what` when it holds a control character,
    a line or paragraph separator or a bidirectional override (no target language quotes those
    safely in a comment, and a newline would start a new line of code)."""
    for c in value:
        if _unsafe(c):
            name = _NAMES.get(
                c, f"the {'lone surrogate' if 0xD800 <= ord(c) <= 0xDFFF else 'control character'} U+{ord(c):04X}"
            )
            raise InputError(
                f"{what} {shown(value)} contains {name}; values written into generated scripts "
                f"must be one line of printable text: remove it"
            )
    return value


def check_identifier(value: str, what: str, *, dotted: bool = False, example: str = "") -> str:
    """`value` unchanged when it is an ASCII Python name (a dotted module path with `dotted`), not a
    keyword; else a one-line InputError: such names are pasted into `import` lines and commands."""
    parts = value.split(".") if dotted else [value]
    if not all(_IDENT.match(p) and not keyword.iskeyword(p) for p in parts):
        kind = (
            "dotted Python module path (names of letters, digits and _ joined by dots)"
            if dotted
            else "Python name (letters, digits and _, not starting with a digit)"
        )
        raise InputError(f"{what} {shown(value)} is not a {kind}" + (f"; pass one like {example}" if example else ""))
    return value


def comment_text(text: str) -> str:
    """`text` for a comment line: characters that could end the line (or reorder it) escaped."""
    return "".join(c.encode("unicode_escape", "backslashreplace").decode("ascii") if _unsafe(c) else c for c in text)


def sbatch_word(value: str, what: str = "an sbatch option") -> str:
    """A value for an `#SBATCH --key=VALUE` line (refused when not one line): as it is when made of
    letters, digits and `_@%+=:,./-`, else in double quotes with `\\` and `"` backslash-escaped.
    sbatch (opt.c `_get_argument`) and a POSIX shell both read that back as the one word: quotes
    keep spaces and `#`, and a backslash escapes the next character inside them."""
    check_text(value, what)
    if value and all(c in _SBATCH_PLAIN for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_directives(options: list[tuple[str, object]], names: dict[str, str] | None = None) -> str:
    """`#SBATCH --key=value` lines, one per (key, value); True writes a bare `--key`, None skips it.
    `names` maps a key to the flag a user gave its value with (for the refusal message)."""
    lines = []
    for key, value in options:
        if value is None or value is False:
            continue
        if value is True:
            lines.append(f"#SBATCH --{key}\n")
        else:
            lines.append(f"#SBATCH --{key}={sbatch_word(str(value), (names or {}).get(key, f'--{key}'))}\n")
    return "".join(lines)


def toml_string(value: str) -> str:
    """A TOML basic string (control characters and DEL escaped; JSON's escapes are TOML's)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
