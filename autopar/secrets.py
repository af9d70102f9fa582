"""Credentials never leave autopar: `mask_url` hides the password of every URL in a text.

Optuna storage URLs (`--storage postgresql://user:PASSWORD@host/db`) carry passwords. Every message,
file, report and export that shows a storage URL shows it through `mask_url` as `user:***@host`.
"""

from __future__ import annotations

import re

#: scheme://user:password@ ; the password runs to the last '@' of the word (an unescaped '@' in a
#: password would otherwise leave its tail visible)
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s'\"]*):(?P<secret>\S*)@")
#: password=... in a URL's query string (mysql and postgresql drivers accept it there too)
_QUERY = re.compile(r"(?P<head>[?&;](?:password|passwd|pwd)=)(?P<secret>[^&;\s'\"]*)", re.IGNORECASE)

MASK = "***"


def mask_url(text: str) -> str:
    """`text` with the password of every URL in it replaced by ***: `user:***@host`, `?password=***`."""
    if "://" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)


def mask_values(obj):
    """A copy of a JSON-like value (dicts, lists, strings) with `mask_url` applied to every string."""
    if isinstance(obj, str):
        return mask_url(obj)
    if isinstance(obj, dict):
        return {k: mask_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mask_values(v) for v in obj]
    return obj
