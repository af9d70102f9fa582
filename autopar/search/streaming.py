"""Exhaustive search in bounded memory: the space is enumerated and priced chunk by chunk
(autopar.search.enumerate.Enumerator), and only running results are kept: each trainer's fastest
plans and each layout's fastest (a pool that ranks the top-k and feeds the measured stage with
diverse candidates), the Pareto front of throughput
against memory, the rejection counts, the counts of plans evaluated, valid and fitting, and a uniform
sample of every category of plan for the report's scatter. Memory does not depend on the size of the
space; the results do not depend on the chunk size (ties are broken by the plan's place in the walk,
and the sample keeps the plans with the smallest hash of that place).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from autopar.calibration.estimate import estimate_per_trainer
from autopar.figures import FITS, MEMORY_MISS_GIB, PEAK_MEMORY_BYTES, RANK_TIME_S, REJECTED_CODE, STEP_TIME_S, VALID
from autopar.search.enumerate import Enumerator
from autopar.search.evaluate import estimate_fitting
from autopar.search.results import MEMORY_BIT, frame, pareto_positions, rank_order, set_rank_time
from autopar.spec.plan import LAYOUT_KEY  # what a layout is, for the per-layout pool
from autopar.spec.question import Question
from autopar.spec.rules import all_rules, rule_label
from autopar.spec.table import TABLE_COLUMNS, PlanTable
from autopar.spec.trainers import ALL_TRAINERS

#: plans priced at once: the working set is a few hundred bytes per plan and costed rank
DEFAULT_CHUNK = 1 << 16
#: the figures a kept row carries until the end of the walk (then it is priced in full)
LIGHT_FIGURES = (VALID, FITS, STEP_TIME_S, RANK_TIME_S, PEAK_MEMORY_BYTES, MEMORY_MISS_GIB)
#: a kept row's bitmask of the trainers (bit = autopar.spec.table TRAINER code) that can run its plan
#: and fit it, from the walk's per-trainer pricing (the walk's rows only, not Optuna's)
FIT_MASK = "fit_mask"
#: the PlanTable columns of a kept row
PLAN_COLUMNS = TABLE_COLUMNS + ("plan_index",)
#: most points the report's all-plans scatter draws (SVG: each is a DOM node, ~0.2 ms to draw);
#: beyond it the report draws a deterministic sample plus every Pareto and top-k plan
SCATTER_POINTS = 5_000


@dataclass(frozen=True)
class StreamOptions:
    top_k: int = 10
    pool: int = 200  # fastest fitting plans kept per trainer (>= top_k; the measured stage draws from them)
    per_layout: int = 2  # fastest fitting plans kept per layout (LAYOUT_KEY): diverse trial candidates
    #: plans kept per category (fits / memory / invalid) for the report's scatter: the three samples
    #: together fill its SCATTER_POINTS, and each kept row is priced in full once more at the end
    sample: int = -(-SCATTER_POINTS // 3)
    chunk: int = DEFAULT_CHUNK
    headroom_gib: float = 0.0
    seed: int = 20240601


@dataclass
class Streamed:
    """The running results of a streamed search, as small frames (autopar.search.results.frame)."""

    pool: pd.DataFrame  # each trainer's fastest fitting plans, ranked
    pareto: pd.DataFrame  # fitting plans no other beats on both step time and memory
    sample: pd.DataFrame  # a uniform sample of each category
    closest: pd.DataFrame  # the valid plan that misses memory by the least (one row, or none)
    evaluated: int = 0
    valid: int = 0
    fit: int = 0
    rejections: dict = field(default_factory=dict)  # label -> plans it rejects
    layouts: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)


class _Keeper:
    """Bounded running state: candidate rows are kept as light frames (the plan's columns and its
    ranking figures) and pruned as they grow; the rows kept at the end are priced in full."""

    def __init__(self, opts: StreamOptions, q: Question):
        self.opts = opts
        self.q = q
        self.pool: list[pd.DataFrame] = []
        self.pairs: Counter = Counter()  # (rule bitmask, trainer) -> plans
        self.evaluated = self.valid = self.fit = 0
        self.held = self.kept = 0  # rows held now, and after the last prune
        # bars a new row must pass to matter, from the last prune: per trainer the pool's slowest
        # step time, per category the sample's largest key (rows beyond them are never kept)
        self.pool_bar: dict[int, float] = {}
        self.sample_bar = [np.uint64(2**64 - 1)] * 3

    def add(self, table, est: dict, index: np.ndarray) -> None:
        fits, valid = est[FITS], est[VALID]
        self.evaluated += len(index)
        self.valid += int(valid.sum())
        self.fit += int(fits.sum())
        bad = np.flatnonzero(~fits)
        for t in np.unique(table.trainer[bad]) if len(bad) else ():
            mine = bad[table.trainer[bad] == t] if len(np.unique(table.trainer)) > 1 else bad
            codes, counts = np.unique(est[REJECTED_CODE][mine], return_counts=True)
            self.pairs.update({(int(c), int(t)): int(n) for c, n in zip(codes, counts)})
        rows = np.unique(
            np.concatenate(
                [
                    self._pool_rows(table, est, index),
                    self._layout_rows(table, est, index),
                    self._pareto_rows(est, index),
                    self._sample_rows(est, index),
                    self._closest_rows(est),
                ]
            )
        )
        if not len(rows):
            return
        kept = LIGHT_FIGURES + (FIT_MASK,) if FIT_MASK in est else LIGHT_FIGURES
        df = pd.DataFrame({c: v[rows] for c, v in table.columns.items()} | {c: est[c][rows] for c in kept})
        df["plan_index"] = index[rows]
        df["sample_key"] = _hash(index[rows], self.opts.seed)
        self.pool.append(df)
        self.held += len(df)
        if self.held > 2 * self.kept + 8 * (self.opts.pool + self.opts.sample):
            self.prune()

    def _pool_rows(self, table, est, index) -> np.ndarray:
        out = []
        for t in np.unique(table.trainer):
            ok = est[FITS] & (table.trainer == t) & (est[RANK_TIME_S] <= self.pool_bar.get(int(t), np.inf))
            out.append(_smallest(np.flatnonzero(ok), est[RANK_TIME_S], self.opts.pool))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _layout_rows(self, table, est, index) -> np.ndarray:
        """The `per_layout` fastest fitting rows of each layout (ties by place in the walk)."""
        rows = np.flatnonzero(est[FITS])
        if not len(rows):
            return rows
        key = np.zeros(len(rows), dtype=np.int64)
        for c in LAYOUT_KEY:  # one mixed-radix integer per layout (each knob is far below 2^9)
            v = table.columns[c][rows].astype(np.int64)
            key = key * (int(v.max()) + 1) + v
        _, group = np.unique(key, return_inverse=True)
        order = np.lexsort((index[rows], est[PEAK_MEMORY_BYTES][rows], est[RANK_TIME_S][rows], group))
        g = group[order]
        rank = np.arange(len(g)) - np.searchsorted(g, g)  # place within its layout, fastest first
        return rows[order[rank < self.opts.per_layout]]

    def _pareto_rows(self, est, index) -> np.ndarray:
        rows = np.flatnonzero(est[FITS])
        return rows[pareto_positions(est[STEP_TIME_S][rows], est[PEAK_MEMORY_BYTES][rows], index[rows])]

    def _closest_rows(self, est) -> np.ndarray:
        """The valid plan that misses memory by the least (the answer when nothing fits)."""
        rows = np.flatnonzero(est[VALID] & ~est[FITS])
        return rows[np.argmin(est[MEMORY_MISS_GIB][rows])][None] if len(rows) else np.zeros(0, np.int64)

    def _sample_rows(self, est, index) -> np.ndarray:
        key = _hash(index, self.opts.seed)
        cat = np.where(est[FITS], 0, np.where(est[VALID], 1, 2))
        out = []
        for c in range(3):
            rows = np.flatnonzero((cat == c) & (key <= self.sample_bar[c]))
            if len(rows) > self.opts.sample:
                rows = rows[np.argpartition(key[rows], self.opts.sample - 1)[: self.opts.sample]]
            out.append(rows)
        return np.concatenate(out)

    def prune(self) -> None:
        """Keep what the final results can still need: per trainer the `pool` fastest fitting, the
        Pareto front, and per category the `sample` smallest hash keys."""
        if not self.pool:
            return
        df = pd.concat(self.pool, ignore_index=True).drop_duplicates("plan_index")
        fit = df[df[FITS]]
        keep = set(_ranked(fit).groupby("trainer", sort=False).head(self.opts.pool)["plan_index"])
        front = fit.iloc[
            pareto_positions(
                fit[STEP_TIME_S].to_numpy(), fit[PEAK_MEMORY_BYTES].to_numpy(), fit["plan_index"].to_numpy()
            )
        ]
        keep |= set(front["plan_index"])
        keep |= set(_ranked(fit).groupby(list(LAYOUT_KEY), sort=False).head(self.opts.per_layout)["plan_index"])
        cat = np.where(df[FITS], 0, np.where(df[VALID], 1, 2))
        for c in range(3):
            part = df[cat == c].nsmallest(self.opts.sample, "sample_key", keep="first")
            keep |= set(part["plan_index"])
        near = df[df[VALID] & ~df[FITS]]
        if len(near):
            keep.add(near.sort_values([MEMORY_MISS_GIB, "plan_index"])["plan_index"].iloc[0])
        self.pool = [df[df["plan_index"].isin(keep)]]
        self.held = self.kept = len(self.pool[0])
        for t, mine in fit.groupby("trainer", sort=False):
            if len(mine) >= self.opts.pool:
                self.pool_bar[int(t)] = float(mine[RANK_TIME_S].nsmallest(self.opts.pool).iloc[-1])
        for c in range(3):
            keys = df.loc[cat == c, "sample_key"]
            if len(keys) >= self.opts.sample:
                self.sample_bar[c] = np.uint64(keys.nsmallest(self.opts.sample).iloc[-1])

    def result(self, layouts) -> Streamed:
        self.prune()
        df = self._priced(self.pool[0], layouts) if self.pool else pd.DataFrame()
        if df.empty:
            return Streamed(df, df, df, df, self.evaluated, self.valid, self.fit, self._labels(), layouts)
        fits, valid = df[FITS].to_numpy(bool), df[VALID].to_numpy(bool)
        fit = df[fits]  # the wide frame is filtered once; the sample and the nearest miss by position
        ranked = _ranked(fit)
        pool = pd.concat(
            [
                ranked.groupby("trainer", sort=False).head(self.opts.pool),
                ranked.groupby(list(LAYOUT_KEY), sort=False).head(self.opts.per_layout),
            ]
        )
        pool = _ranked(pool.drop_duplicates("plan_index"))
        pareto = fit.iloc[
            pareto_positions(
                fit[STEP_TIME_S].to_numpy(), fit[PEAK_MEMORY_BYTES].to_numpy(), fit["plan_index"].to_numpy()
            )
        ]
        cat = np.where(fits, 0, np.where(valid, 1, 2))
        key = df["sample_key"].to_numpy()
        # per category the `sample` smallest keys (the first of equal ones), as nsmallest keeps them
        picked = [
            rows[np.argsort(key[rows], kind="stable")[: self.opts.sample]]
            for rows in (np.flatnonzero(cat == c) for c in range(3))
        ]
        sample = df.take(np.concatenate(picked))
        missed = np.flatnonzero(valid & ~fits)
        order = np.lexsort((df["plan_index"].to_numpy()[missed], df[MEMORY_MISS_GIB].to_numpy()[missed]))
        near = df.take(missed[order[:1]])
        return Streamed(
            pool.reset_index(drop=True),
            pareto.sort_values(STEP_TIME_S).reset_index(drop=True),
            sample.sort_values("plan_index").reset_index(drop=True),
            near.reset_index(drop=True),
            self.evaluated,
            self.valid,
            self.fit,
            self._labels(),
            layouts,
        )

    def _priced(self, light: pd.DataFrame, layouts) -> pd.DataFrame:
        """The kept rows with every estimate column (autopar.search.results.frame): priced again in
        full, to the same figures the search ranked them by."""
        if light.empty:
            return pd.DataFrame()
        table = PlanTable({c: light[c].to_numpy() for c in PLAN_COLUMNS if c in light.columns}, layouts)
        df = frame(table, estimate_fitting(table, self.q, self.opts.headroom_gib), self.q.model.num_layers)
        df["sample_key"] = light["sample_key"].to_numpy()
        if FIT_MASK in light:
            df[FIT_MASK] = light[FIT_MASK].to_numpy()
        return df

    def _labels(self) -> dict:
        """Plans each rejection reason rejects ('memory', a model rule, '<trainer>:<kind>')."""
        rules = all_rules()
        out: Counter = Counter()
        for (code, trainer), n in self.pairs.items():
            if code >> MEMORY_BIT & 1:
                out["memory"] += n
            for i, r in enumerate(rules):
                if code >> i & 1:
                    out[rule_label(r, trainer)] += n
        return dict(out.most_common())


def stream_table(q: Question, table: PlanTable, opts: StreamOptions, write: Callable | None = None) -> Streamed:
    """`stream` over the rows of a table that holds its trainers as rows (Optuna's structures, every
    completion of each): chunk by chunk, each plan priced on the light columns with its own trainer,
    kept as the walk keeps them, and `write([(chunk, est)])` persisting each chunk; the rows kept
    are priced in full at the end."""
    if not len(table):  # no structure had a plan: an empty plans file, and empty frames with every column
        est = estimate_fitting(table, q, opts.headroom_gib)
        if write is not None:
            write([(table, est)])
        df = frame(table, est, q.model.num_layers)
        return Streamed(df, df, df, df, layouts=table.layouts)
    keeper = _Keeper(opts, q)
    index = np.asarray(table.columns["plan_index"])
    for start in range(0, len(table), opts.chunk):
        chunk = table.take(np.arange(start, min(start + opts.chunk, len(table))))
        est = estimate_fitting(chunk, q, opts.headroom_gib, search=True)
        keeper.add(chunk, est, index[start : start + len(chunk)])
        if write is not None:
            write([(chunk, est)])
    return keeper.result(table.layouts)


def _ranked(df: pd.DataFrame) -> pd.DataFrame:
    """Fastest first (by the question's rank_by), in the one ranking order (RANK_KEYS)."""
    return rank_order(df)


def _smallest(rows: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """The rows of the k smallest values, and every row tied with the k-th (ties are broken later)."""
    if len(rows) <= k:
        return rows
    v = values[rows]
    kth = np.partition(v, k - 1)[k - 1]
    return rows[v <= kth]


def _hash(index: np.ndarray, seed: int) -> np.ndarray:
    """A uniform pseudo-random key per plan place (splitmix64), the same in any chunking."""
    with np.errstate(over="ignore"):
        z = np.asarray(index, dtype=np.uint64) + np.uint64(seed * 0x9E3779B97F4A7C15 % (1 << 64))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


def stream(
    q: Question,
    enumerator: Enumerator,
    opts: StreamOptions,
    write: Callable | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Streamed:
    """Price every plan of the walk, chunk by chunk: each chunk of the folded walk (one row per plan
    of every trainer) is priced once per performance profile and checked per trainer;
    `write([(table, est), ...])` persists each chunk, every trainer's share (a plans.parquet row
    group), as it is priced."""
    keeper = _Keeper(opts, q)
    trainers = [ALL_TRAINERS[c] for c in enumerator.trainer_codes]
    t_est = t_rest = 0.0
    for start, stop, table in enumerator.folded_chunks(max(1, opts.chunk // len(trainers))):
        if len(table):
            t0 = time.perf_counter()
            ests = estimate_per_trainer(
                table,
                q.model,
                q.cluster,
                tuple(trainers),
                num_gpus=q.num_gpus,
                seq_len=q.seq_len,
                headroom_gib=opts.headroom_gib,
                recipes=q.recipe_trainers,
                routing_imbalance=q.routing_imbalance,
            )
            t_est += time.perf_counter() - t0
            t1 = time.perf_counter()
            # which trainers fit each plan, kept with the rows so the answer's "runs on" needs no
            # pricing again (autopar.search.run.runs_on)
            mask = np.zeros(len(table), dtype=np.int64)
            for code, est in zip(enumerator.trainer_codes, ests):
                mask |= est[FITS].astype(np.int64) << int(code)
            parts = []
            for j, (code, est) in enumerate(zip(enumerator.trainer_codes, ests)):
                set_rank_time(est, q.rank_by)
                est[FIT_MASK] = mask
                index = table.columns["plan_index"] + j
                mine = table.with_columns(trainer=code, plan_index=index)
                keeper.add(mine, est, index)
                parts.append((mine, est))
            if write is not None:
                write(parts)
            t_rest += time.perf_counter() - t1
        if progress:
            progress("evaluating plans", stop, enumerator.total)
    out = keeper.result(enumerator.layouts)
    out.timings = {"evaluate_s": t_est, "keep_and_write_s": t_rest}
    return out
