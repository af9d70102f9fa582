"""Bash arrays in the exported scripts: `bash_array` writes one (a flag and its value per line,
grouped under comments) and `read_bash_array` reads its words back."""

from __future__ import annotations

import shlex


def bash_array(name: str, groups: list[tuple[str, list[str]]]) -> str:
    """A bash array literal, one flag (and its value) per line, grouped under comments."""
    out = [f"{name}=("]
    for title, argv in groups:
        if not argv:
            continue
        out.append(f"  # {title}")
        i = 0
        while i < len(argv):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append(f"  {argv[i]} {shlex.quote(argv[i + 1])}")
                i += 2
            else:
                out.append(f"  {argv[i]}")
                i += 1
    out.append(")")
    return "\n".join(out) + "\n"


def read_bash_array(text: str, name: str) -> list[str]:
    """The words of `NAME=( ... )` in a script written by `bash_array` (comments dropped)."""
    start = text.find(f"\n{name}=(")
    if start < 0 and text.startswith(f"{name}=("):
        start = 0
    if start < 0:
        raise ValueError(f"no {name}=( ... ) array in the script")
    body = text[text.index("(", start) + 1 :]
    words: list[str] = []
    for line in body.splitlines():
        s = line.strip()
        if s == ")":
            return words
        if not s or s.startswith("#"):
            continue
        words += shlex.split(s, comments=True)
    raise ValueError(f"unterminated {name}=( ... ) array")


def number_word(x: float) -> str:
    """A flag's number: an integral value without a fraction or exponent (500000, not 5e+05, which an
    int-typed argparse flag refuses), else Python's shortest repr (1e-05)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))
