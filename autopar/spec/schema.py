"""The input-validation layer: the limits of every size a user gives autopar (model, cluster and
space files, numeric command-line options) and the checks that enforce them.

A bad value is one InputError line that names the field or the option and quotes at most about 80
characters of the value (autopar.errors.quoted). Every size has an upper bound as well as a lower
one, so no value can run a per-layer loop for ever or overflow an int64. Files are bounded before
they are parsed (bytes) and after (values with YAML aliases expanded, nesting depth), so an alias
bomb is refused at once without echoing what it expands to.
"""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path
from typing import NamedTuple, TypeGuard, cast

from autopar.errors import InputError, quoted

MAX_GPUS = 1 << 20
MAX_GPUS_PER_NODE = 4096
MAX_SEQ_LEN = 1 << 24
MAX_LAYERS = 10_000
MAX_BATCH = 1 << 30
#: names (models, GPUs, clusters, spaces): characters at most
MAX_NAME_CHARS = 256
#: a model, cluster or space file: bytes at most (YAML), JSON (a HuggingFace config.json) a little more
YAML_BYTES = 256 * 1024
JSON_BYTES = 4 * 1024 * 1024
#: values in a file once YAML aliases are expanded, and levels of nesting
MAX_NODES = 100_000
MAX_DEPTH = 32
WEEK_S = 7 * 24 * 3600.0

#: model-file fields -> (lowest, highest)
MODEL_LIMITS = {
    "num_layers": (1, MAX_LAYERS),
    "hidden_size": (1, 1 << 20),
    "ffn_hidden_size": (1, 1 << 22),
    "num_attention_heads": (1, 1 << 14),
    "num_kv_heads": (1, 1 << 14),
    "head_dim": (1, 1 << 14),
    "vocab_size": (1, 1 << 24),
    "seq_len": (1, MAX_SEQ_LEN),
}
MOE_LIMITS = {
    "num_experts": (1, 1 << 14),
    "top_k": (1, 1 << 14),
    "expert_ffn_hidden_size": (1, 1 << 22),
    "num_shared_experts": (0, 1 << 14),
    "shared_expert_ffn_hidden_size": (0, 1 << 26),
    "first_k_dense": (0, MAX_LAYERS),
    "layer_freq": (1, MAX_LAYERS),
    "router_groups": (1, 1 << 14),
    "router_group_topk": (1, 1 << 14),
}
MLA_LIMITS = {
    "q_lora_rank": (1, 1 << 16),
    "kv_lora_rank": (1, 1 << 16),
    "qk_nope_head_dim": (1, 1 << 14),
    "qk_rope_head_dim": (1, 1 << 14),
    "v_head_dim": (1, 1 << 14),
}


class Limit(NamedTuple):
    """The range of a numeric option: integers lo..hi, or numbers (`number`) above lo (`above`)."""

    lo: float
    hi: float
    number: bool = False
    above: bool = False


#: numeric command-line options -> their range (a command whose option means something else passes
#: its own Limit to check_flag)
FLAGS: dict[str, Limit] = {
    "--gpus": Limit(1, MAX_GPUS),
    "--gpus-per-node": Limit(1, MAX_GPUS_PER_NODE),
    "--seq-len": Limit(1, MAX_SEQ_LEN),
    "--gbs": Limit(1, MAX_BATCH),
    "--top-k": Limit(1, 100_000),
    "--max-exhaustive": Limit(0, 10**12),
    "--n-trials": Limit(1, 1_000_000),
    "--seed": Limit(0, 2**32 - 1),
    "--trials": Limit(0, 10_000),
    "--trial-budget": Limit(1, 100_000),
    "--rounds": Limit(1, 1_000),
    "--trial-steps": Limit(1, 100_000),
    "--trial-timeout": Limit(0, WEEK_S, True, True),
    "--trial-gpu-hours": Limit(0, 1e9, True, True),
    "--short-run": Limit(1, 100_000),
    "--max-local-ranks": Limit(1, 4096),
    "--proxy-layers": Limit(1, MAX_LAYERS),
    "--proxy-width": Limit(1, 1 << 14),
    "--proxy-seq": Limit(1, MAX_SEQ_LEN),
    "--ranks": Limit(1, 4096),
    "--timeout": Limit(0, WEEK_S, True, True),
    "--steps": Limit(1, 100_000),
    "--warmup": Limit(0, 100_000),
    "--nnodes": Limit(1, 100_000),
    "--node-rank": Limit(0, 99_999),
    "--memory-limit-mib": Limit(0, float(1 << 30), True, True),
    "--master-port": Limit(1, 65_535),
    "--rank": Limit(1, 100_000),
    "--top": Limit(1, 100_000),
}


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _range(lo: float, hi: float, number: bool = False, above: bool = False) -> str:
    """'an integer from 1 to 1,048,576', 'a number above 0 and at most 604,800'."""
    if number:
        return f"a number {'above' if above else 'from'} {_num(lo)} {'and at most' if above else 'to'} {_num(hi)}"
    return f"an integer from {int(lo):,} to {int(hi):,}"


def check_int(value: object, what: str, lo: int, hi: int, fix: str = "fix the value") -> int:
    """`value` when it is an integer in lo..hi, else one line naming `what`, the range and the value."""
    if not _is_int(value) or not lo <= value <= hi:
        raise InputError(f"{what} must be {_range(lo, hi)}, got {quoted(value)}; {fix}")
    return value


def check_number(
    value: object, what: str, lo: float, hi: float, *, above: bool = False, fix: str = "fix the value"
) -> float:
    """`value` when it is a finite number in [lo, hi] (above lo with `above`), else one line."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > lo if above else value >= lo)
        and value <= hi
    )
    if not ok:
        raise InputError(f"{what} must be {_range(lo, hi, True, above)}, got {quoted(value)}; {fix}")
    return cast(float, value)  # a finite int or float (ok)


def breaks_line(text: str) -> bool:
    """Whether `text` holds a line break or another control character (they would start a new line
    of a message, a generated script or a file header)."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def check_name(value: object, what: str, max_chars: int = MAX_NAME_CHARS, lines: bool = False) -> str:
    """`value` when it is a string of at most `max_chars` characters without control characters
    (line breaks allowed with `lines`), else one line."""
    if not isinstance(value, str) or len(value) > max_chars:
        kind = "a string" if not isinstance(value, str) else f"at most {max_chars} characters"
        raise InputError(f"{what} must be {kind}, got {quoted(value)}; fix the value")
    if not lines and breaks_line(value):
        raise InputError(
            f"{what} must be one line without control characters, got {quoted(value)}; "
            f"remove the line break or control character"
        )
    return value


def check_storage(value: str | None) -> str | None:
    """A --storage URL or journal file (None = not given) on one line; a URL without spaces. The
    value is never quoted: it may carry a password that a line break or space would hide from the
    masking of autopar.secrets."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError("--storage is empty; give a URL or a journal file, or leave the option out")
    if breaks_line(value):
        raise InputError("--storage holds a line break or control character; give the URL or file name on one line")
    if "://" in value and any(c.isspace() for c in value):
        raise InputError("--storage is a URL with a space in it; percent-encode it (%20), e.g. in the password")
    return value


def check_flag(flag: str, value: object, limit: Limit | None = None) -> object:
    """A numeric option's value (None = not given) in its range (FLAGS, or `limit`), else one line
    naming the option and the value."""
    lo, hi, number, above = limit or FLAGS[flag]
    if value is None:
        return value
    if number:
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value > lo if above else value >= lo)
            and value <= hi
        )
    else:
        ok = _is_int(value) and lo <= value <= hi
    if not ok:
        raise InputError(f"{flag} {quoted(value)} is out of range; {flag} must be {_range(lo, hi, number, above)}")
    return value


def check_flags(values: dict[str, object]) -> None:
    """Every option of `values` (option -> value, None = not given) in its FLAGS range."""
    for flag, value in values.items():
        check_flag(flag, value)


def parse_list(text: str, flag: str, number: bool = True, most: int = 32, example: str | None = None) -> list:
    """A comma list of an option (`--gpus 128,256`, `--gpu h100-sxm,b200`): integers in the option's
    range, or names; an empty list or item, or more than `most` items, is one line."""
    items = [x.strip() for x in str(text).split(",")]
    example = example or ("128,256" if number else "h100-sxm,b200")
    if not any(items):
        raise InputError(f"{flag} {quoted(text)} is empty; give a value, e.g. {flag} {example.split(',')[0]}")
    if not all(items):
        raise InputError(
            f"{flag} {quoted(text)} has an empty item; give a comma list without empty items, e.g. {flag} {example}"
        )
    if len(items) > most:
        raise InputError(f"{flag} lists {len(items)} values; give at most {most}")
    if not number:
        return [check_name(x, flag, 64) for x in items]
    out = []
    for x in items:
        try:
            value = int(x) if len(x) <= 40 and x.lstrip("+-").isascii() else None
        except ValueError:
            value = None
        if value is None:
            raise InputError(
                f"{flag} {quoted(text)} must be an integer or a comma list of integers, e.g. "
                f"{flag} 128,256; {quoted(x)} is not an integer"
            )
        if not FLAGS[flag].lo <= value <= FLAGS[flag].hi:  # named as given (-0, +5 and 1_000 quoted)
            check_flag(flag, value if str(value) == x else x)
        out.append(value)
    return out


def path_kind(path: str | Path) -> str | None:
    """'file', 'dir', 'other' or None (nothing there, or a name the system cannot look up)."""
    try:
        p = Path(path)
        if p.is_file():
            return "file"
        return "dir" if p.is_dir() else ("other" if p.exists() else None)
    except (OSError, ValueError):
        return None


def check_tree(data: object, what: str) -> object:
    """`data` (parsed JSON or YAML) when it holds at most MAX_NODES values with YAML aliases expanded,
    is nested at most MAX_DEPTH levels and does not contain itself; else one line that does not
    echo the value (an alias bomb expands to billions)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(v: object, depth: int) -> int:
        if not isinstance(v, (list, dict)):
            return 1
        if depth > MAX_DEPTH:
            raise InputError(f"{what} is nested more than {MAX_DEPTH} levels deep; fix the file")
        key = id(v)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise InputError(f"{what} contains itself (a recursive YAML alias); remove the alias")
        active.add(key)
        n = 1
        for child in list(v) + list(v.values()) if isinstance(v, dict) else v:
            n += size(child, depth + 1)
            if n > MAX_NODES:
                raise InputError(
                    f"{what} holds more than {MAX_NODES:,} values once its YAML aliases are expanded "
                    f"(an alias bomb?); an autopar file holds a few hundred: remove the aliases"
                )
        active.discard(key)
        sizes[key] = n
        return n

    size(data, 0)
    return data
