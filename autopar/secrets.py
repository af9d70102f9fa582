"""Credentials never leave autopar: `mask_secrets` is the one masking rule, applied to every message
(autopar.cli), log line, file and JSON document autopar writes (autopar.json_out).

Optuna storage URLs (`--storage postgresql://user:PASSWORD@host/db`) carry passwords, in the
userinfo or in the query (`?password=`, `?sslpassword=`, `?api_key=`). The rule, for any word of a
text (URL-like or not, parsed or not, a mistyped scheme such as `postgresql:/u:PASS@host` too):
  - userinfo: in a word holding an '@', whatever follows the user name's ':' up to the last '@'
    is the password (the user name is the part after the scheme and its slashes; an unescaped '@'
    in a password would otherwise leave its tail visible): `user:***@host`; a user name holding a
    percent-encoding (`u%3Asecret@host`, a colon and a password in disguise) is masked whole with
    its password: `postgresql://***@host`;
  - query: the value of every parameter whose name contains pass, secret, token or key
    (case-insensitive) after '?', '&' or ';': `?sslpassword=***`.
"""

from __future__ import annotations

import re

MASK = "***"

#: a scheme with its slashes ('postgresql://', 'postgresql:/', 'file:///')
_SCHEME_SLASHES = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:/+")
#: a scheme without slashes that a user:password follows ('postgres:u:PASS@host')
_SCHEME_BARE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:(?=[^:]*:)")
#: name=value of a query whose name says it holds a secret
_QUERY = re.compile(r"(?P<head>[?&;][^=&;?\s'\"]*(?:pass|secret|token|key)[^=&;?\s'\"]*=)[^&;\s'\"]*", re.IGNORECASE)
_KEYWORDS = ("pass", "secret", "token", "key")


def _mask_userinfo(word: str) -> str:
    at = word.rfind("@")
    if at <= 0:
        return word
    head = word[:at]
    lead = len(head) - len(head.lstrip("'\"(<[`"))  # a quoted or bracketed URL
    m = _SCHEME_SLASHES.match(head, lead) or _SCHEME_BARE.match(head, lead)
    start = m.end() if m else lead
    colon = head.find(":", start)
    user = head[start:] if colon < 0 else head[start:colon]
    if "%" in user:
        # a percent-encoded user name may hide the colon and the password after it (u%3Asecret):
        # the whole userinfo goes
        return head[:start] + MASK + word[at:]
    return word if colon < 0 else head[: colon + 1] + MASK + word[at:]


def mask_secrets(text: str) -> str:
    """`text` with every password in it replaced by ***: `user:***@host`, `?sslpassword=***`."""
    if "@" not in text and "?" not in text and "&" not in text and ";" not in text:
        return text  # neither a userinfo nor a query: most texts, a report's many JSON keys
    if "@" in text:  # the userinfo first: a query value may hold an '@', a password '?key='
        text = "".join(_mask_userinfo(w) for w in re.split(r"(\s+)", text))
    if any(k in text.lower() for k in _KEYWORDS):
        text = _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)
    return text


#: values that hold no text: copied as they are, without a call per number (a run's top.json holds
#: some 100,000 of them)
_NO_TEXT = frozenset({int, float, bool, type(None)})


def mask_values(obj):
    """A copy of a JSON-like value (dicts, lists, strings) with `mask_secrets` applied to every string
    (keys too)."""
    if isinstance(obj, str):
        return mask_secrets(obj)
    if isinstance(obj, dict):
        return {mask_values(k): v if type(v) in _NO_TEXT else mask_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [v if type(v) in _NO_TEXT else mask_values(v) for v in obj]
    return obj
