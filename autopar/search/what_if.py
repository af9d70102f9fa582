"""The scenarios of a what-if as the command line asks for them (--gpus x --gpu x --seq-len x --gbs
x --dtype). Declared apart from autopar.search.scenarios, which runs them, so that `autopar search`
checks a question without importing pandas, the cost model or the search."""

from __future__ import annotations

from dataclasses import dataclass

#: scenarios of one what-if at most (each is a whole search)
MAX_SCENARIOS = 64


@dataclass(frozen=True)
class Scenario:
    num_gpus: int
    gpu: str | None  # None: from the cluster file
    seq_len: int
    gbs: int | None = None  # sequences; None: the space's tokens_per_step
    dtype: str | None = None  # --dtype: the space's dtype knob pinned to it; None: the space's own
