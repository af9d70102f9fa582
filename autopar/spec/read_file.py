"""The one reader of every file autopar reads from a user or a run directory: model, cluster, space
and profile files, calibration CSVs (`validate --runs`), and top.json, search.json, trials/*.json.

A file is read only when it is a regular file (not a FIFO, a device, a socket or a link to one: a
FIFO blocks a reader for ever and /dev/zero never ends), no larger than its bound (checked on the
open file before reading, and again while reading), and within a time bound: it is read in chunks,
so a slow file system is given up on and a signal is handled between chunks. What it holds is then
the caller's to check against its schema (autopar.spec.schema, autopar.search.run_schema). Every
problem is one InputError line naming the file and the fix.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from autopar.errors import InputError

#: seconds a read may take: a few MiB from a local disk take milliseconds; a file system that does
#: not answer within this is reported rather than waited on
READ_TIMEOUT_S = 30.0
#: bytes read at a time (a signal is handled between two reads)
CHUNK_BYTES = 1 << 20


def size_text(n: int) -> str:
    """1,048,576 -> '1 MiB', 262,144 -> '256 KiB'."""
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n / 1024:,.0f} KiB"


def _what_it_is(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse_special(mode: int, what: str, fix: str) -> None:
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} is {_what_it_is(mode)}, not a regular file (or a link to one); {fix}")


def check_regular(path: str | Path, what: str, fix: str = "check the path") -> None:
    """One line when `path` exists but is not a regular file (a FIFO, a device, a link to one): for
    a file another library opens (an Optuna journal or SQLite file), which would block on a FIFO or
    read /dev/zero for ever. A path not there yet is fine (it will be created)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        raise InputError(f"cannot use {what}: {getattr(e, 'strerror', None) or type(e).__name__}; {fix}") from None
    _refuse_special(mode, what, fix)


def _too_big(what: str, max_bytes: int, usual: str, fix: str) -> InputError:
    return InputError(f"{what} is larger than {size_text(max_bytes)}{f' ({usual})' if usual else ''}; {fix}")


def read_bytes(
    path: str | Path, what: str, max_bytes: int, *, fix: str = "check the path", usual: str = "", timeout_s=None
) -> bytes:
    """The bytes of the regular file `path` (`what` names it in messages, e.g. "cluster file
    'c.yaml'"), at most `max_bytes` of them (`usual` says how large such a file is), read within
    `timeout_s` (default READ_TIMEOUT_S); else one line."""
    timeout_s = READ_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        mode = os.stat(path).st_mode  # follows a link: a link to a device is the device
    except FileNotFoundError:
        raise InputError(f"{what} does not exist; {fix}") from None
    except (OSError, ValueError) as e:  # permissions, a name too long, a NUL in the name
        raise InputError(f"cannot read {what}: {getattr(e, 'strerror', None) or type(e).__name__}; {fix}") from None
    _refuse_special(mode, what, fix)
    deadline = time.monotonic() + timeout_s
    try:
        # O_NONBLOCK: a FIFO put in its place since the stat opens at once (and is refused below)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {what}: {getattr(e, 'strerror', None) or type(e).__name__}; {fix}") from None
    try:
        st = os.fstat(fd)
        _refuse_special(st.st_mode, what, fix)
        if st.st_size > max_bytes:
            raise _too_big(what, max_bytes, usual, fix)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(CHUNK_BYTES, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if time.monotonic() > deadline:
                raise InputError(
                    f"{what} took more than {timeout_s:g} s to read (a file system that does not answer?); {fix}"
                )
    except OSError as e:
        raise InputError(f"cannot read {what}: {e.strerror or type(e).__name__}; {fix}") from None
    finally:
        os.close(fd)
    if total > max_bytes:  # it grew while being read
        raise _too_big(what, max_bytes, usual, fix)
    return b"".join(chunks)


def read_text(
    path: str | Path,
    what: str,
    max_bytes: int,
    *,
    encoding: str = "utf-8",
    fix: str = "check the path",
    usual: str = "",
    timeout_s=None,
) -> str:
    """read_bytes decoded (`utf-8-sig` drops the byte-order mark spreadsheets write), else one line."""
    data = read_bytes(path, what, max_bytes, fix=fix, usual=usual, timeout_s=timeout_s)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        raise InputError(f"{what} is not UTF-8 text (a binary file?); {fix}") from None


def parse_json(text: str, what: str, fix: str) -> Any:
    """JSON text as data, or one line: a syntax error with its line and column, a number of more
    than 4,300 digits, nesting past Python's stack."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{what} is corrupt: not JSON (line {e.lineno}, column {e.colno}: {e.msg}); {fix}") from None
    except (ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else "a number of more than 4,300 digits?"
        raise InputError(f"{what} is corrupt: it holds a value autopar cannot read ({why}); {fix}") from None


def read_json(path: str | Path, what: str, max_bytes: int, *, fix: str = "check the path") -> Any:
    """A JSON file read by read_text and parsed by parse_json."""
    return parse_json(read_text(path, what, max_bytes, fix=fix), what, fix)
