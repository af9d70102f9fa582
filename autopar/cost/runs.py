"""Price an elementwise function once per run of equal inputs along the plans' axis.

A search prices plans chunk by chunk, and the walk lists them so that neighbours share their outer
knobs (tp, pp, cp, dp ...): a collective's buffer and group change only every few plans (for the
default Megatron space about 1 plan in 6 along the axis, 1 in 40 for the per-rank gradient
buckets). Each run is priced once and repeated, which gives bit-identical figures at a fraction of
the array work (`benchmarks/bench_search_scale.py`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: below this many plans the runs' bookkeeping costs more than it saves
_MIN_PLANS = 1024


def on_runs(fn: Callable[..., np.ndarray], *arrays) -> np.ndarray:
    """`fn(*arrays)` for an `fn` that works element by element (broadcasting its inputs), computed
    on the first plan of each run of plans whose inputs are all equal (the plans' axis is the last;
    an input of one plan, or a scalar, is the same for all) and repeated over the run."""
    arrs = [np.asarray(a) for a in arrays]
    n = max((a.shape[-1] for a in arrs if a.ndim), default=0)
    if n < _MIN_PLANS:
        return fn(*arrs)
    along = [a.ndim > 0 and a.shape[-1] == n for a in arrs]
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for a, varies in zip(arrs, along):
        if varies:
            differs = a[..., 1:] != a[..., :-1]  # NaN differs from itself: each its own run
            change[1:] |= differs.reshape(-1, n - 1).any(axis=0) if differs.ndim > 1 else differs
    starts = np.flatnonzero(change)
    if 2 * len(starts) > n:
        return fn(*arrs)
    out = fn(*(a[..., starts] if varies else a for a, varies in zip(arrs, along)))
    shape = np.broadcast_shapes(*(a.shape for a in arrs))
    out = np.broadcast_to(out, shape[:-1] + (len(starts),))
    return np.repeat(out, np.diff(np.append(starts, n)), axis=-1)
