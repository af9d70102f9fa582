"""The one JSON writer: every JSON document autopar prints or writes (`--json` output, top.json,
search.json, trial documents, measured.json, ...) goes through `dumps`.

What it writes is strict JSON (`allow_nan=False`: no NaN or Infinity, which strict parsers refuse)
without a secret (autopar.secrets.mask_secrets on every string). A figure that is not a finite
number is written as null; the code that can produce one says why beside it (e.g. the MTBF of a
cluster without interruptions, autopar.cost.goodput.RunTime.to_dict).
"""

from __future__ import annotations

import json
import math
from pathlib import PurePath

from autopar.secrets import mask_secrets


def plain(obj):
    """A copy of `obj` as plain JSON data: numpy scalars and arrays as numbers and lists, tuples as
    lists, paths as strings, non-finite floats as None, every string masked; anything else as
    `str` (a dataclass or an enum a caller forgot: readable, never a crash)."""
    if isinstance(obj, str):
        return mask_secrets(obj)
    if obj is None or isinstance(obj, (bool, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {(mask_secrets(k) if isinstance(k, str) else str(k)): _plain_item(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain_item(v) for v in obj]
    if isinstance(obj, PurePath):
        return mask_secrets(str(obj))
    item = getattr(obj, "tolist", None)  # numpy scalars (-> Python numbers) and arrays (-> lists)
    if callable(item):
        return plain(item())
    if hasattr(obj, "__float__") and not hasattr(obj, "__len__"):
        return plain(float(obj))
    return mask_secrets(str(obj))


#: the values `plain` leaves as they are: taken without a call each in a document's many numbers
_AS_IS = frozenset({int, bool, type(None)})


def _plain_item(v):
    if type(v) in _AS_IS or (type(v) is float and math.isfinite(v)):
        return v
    return plain(v)


def dumps(obj, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """`obj` as strict JSON text (see the module docstring)."""
    return json.dumps(plain(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)
