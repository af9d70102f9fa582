"""Fit the performance profiles to published runs (`autopar validate --fit`), towards the physics.

Every constant the table marks `fitted` (autopar/spec/data/constants.toml: what it means, its prior,
its documented range and their sources) is a parameter of the base profile (Megatron-Core); another
trainer's profile fits its own copy only of the constants its trainer's mechanisms change (`OWN`:
its kernels' fusion, its host overhead, how it overlaps data-parallel communication) and shares the
rest with its parent. A profile with no row in the training set keeps its parent's values: that is
the leave-one-source-out prediction for a source alone in its family.

The fit is a maximum a posteriori estimate: each case's residual is log(predicted / published
throughput) / SIGMA_OBS under a robust (pseudo-Huber) loss, each parameter's is (value - prior) /
sigma with sigma a quarter of its range (the range spans +-2 sigma around a central prior), every
parameter bounded to its range
(scipy.optimize.least_squares, trust-region reflective). The cases are priced once
(autopar.calibration.case_batch); the fit re-assembles the step only, so it takes well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from autopar.calibration.case_batch import CaseBatch, case_profile
from autopar.calibration.run_cases import RunCase
from autopar.cost.profiles import lineage, pinned, profiles, resolve
from autopar.spec.constants import constant_table
from autopar.spec.hardware import CostConstants

BASE = "megatron"
FIELDS = tuple(f.name for f in fields(CostConstants))
#: the constants the base profile fits: every one the table marks `fitted`
FITTED = tuple(n for n in FIELDS if constant_table()[n].kind == "fitted")
#: per profile, the constants its own trainer's mechanisms change (the rest are its parent's)
OWN: dict[str, tuple[str, ...]] = {
    "torchtitan": (
        "attention_efficiency",
        "fp8_gemm_efficiency",
        "elementwise_traffic_factor",
        "layer_overhead_us",
        "host_launch_us",
        "dp_overlap",
    ),
    "deepspeed": ("elementwise_traffic_factor", "layer_overhead_us", "dp_overlap", "pp_overlap"),
    "nanotron": ("layer_overhead_us", "dp_overlap"),
    "automodel": ("elementwise_traffic_factor", "layer_overhead_us"),
    "meta": ("layer_overhead_us", "dp_overlap"),
}
#: the model's typical relative error on one published run, against which a constant's distance
#: from its prior is weighed (about the cross-validated error the model reaches)
SIGMA_OBS = 0.10
#: a fitted value this close to a bound (as a fraction of the range) counts as on it
ON_BOUND = 1e-3


@dataclass(frozen=True)
class FittedConstant:
    profile: str
    name: str
    prior: float
    low: float
    high: float
    value: float
    source: str

    @property
    def shift(self) -> float:
        return self.value - self.prior

    @property
    def on_bound(self) -> bool:
        span = self.high - self.low
        return min(self.value - self.low, self.high - self.value) <= ON_BOUND * span


@dataclass
class ProfileFit:
    constants: dict[str, CostConstants]  # profile name -> fitted constants
    parameters: list[FittedConstant]
    residuals: np.ndarray  # per fitted case (dropless measurements left out), relative error after the fit
    initial_residuals: np.ndarray  # with every constant at its prior
    success: bool
    message: str

    def own(self) -> dict[str, dict[str, float]]:
        """profile -> the constants it fitted itself (what profiles.toml lists)."""
        out: dict[str, dict[str, float]] = {}
        for p in self.parameters:
            out.setdefault(p.profile, {})[p.name] = p.value
        return out


def _parameters(present: set[str]) -> list[tuple[str, str]]:
    params = [(BASE, n) for n in FITTED]
    for prof, names in OWN.items():
        if present & _descendants(prof):
            params += [(prof, n) for n in names]
    return [(p, n) for p, n in params if not pinned(p, n)]


def _descendants(prof: str) -> set[str]:
    out = {prof}
    for name, p in profiles().items():
        q = p.parent
        while q:
            if q == prof:
                out.add(name)
            q = profiles()[q].parent
    return out


def _table(values: dict[tuple[str, str], float]) -> tuple[np.ndarray, dict[str, CostConstants]]:
    """(profiles x constants) array and the constants per profile, with `values` for the fitted
    parameters and the shipped facts and priors for the rest (facts are kept; fitted constants of a
    profile that fits none of its own come from its parent)."""
    listed = {name: {k: v for k, v in zip(FIELDS, _facts(name)) if v is not None} for name in profiles()}
    for (prof, n), v in values.items():
        listed[prof][n] = v
    parents = {name: p.parent for name, p in profiles().items()}
    consts = {}
    for name, p in profiles().items():
        if not p.parent and name != BASE:  # not in the hierarchy (the built-in model): as shipped
            consts[name] = p.constants
        else:
            consts[name] = resolve(name, listed, parents)
    table = np.array([[getattr(consts[n], f) for f in FIELDS] for n in profiles()])
    return table, consts


def _facts(name: str) -> list[float | None]:
    """The constants of a profile that are not fitted ones (its kernel facts, link and memory
    constants) as shipped; None where the profile's value is a fitted one."""
    c = profiles()[name].constants
    return [getattr(c, f) if f not in FITTED else None for f in FIELDS]


def _robust(r: np.ndarray) -> np.ndarray:
    """Pseudo-Huber residuals (least squares on them is scipy's soft_l1 loss): a run the model misses
    by far more than SIGMA_OBS (a mechanism it lacks) pulls the constants linearly, not
    quadratically, so a few such runs cannot drag a physical constant to its bound."""
    return np.sign(r) * np.sqrt(2.0 * (np.sqrt(1.0 + r * r) - 1.0))


def prior_constants() -> dict[str, CostConstants]:
    """Every profile's constants with each fitted one at its prior (for that profile, where the
    table gives the profile its own), the kernel facts as shipped: the physics-only model."""
    params = _parameters(set(profiles()))
    specs = [constant_table()[n].for_profile(prof, lineage(prof)) for prof, n in params]
    return _table({p: s.prior for p, s in zip(params, specs)})[1]


def fit_profiles(cases: list[RunCase], batch: CaseBatch | None = None) -> ProfileFit:
    """Fit the base constants and each present profile's own ones to the cases. A dropless second
    measurement of a row is not fitted: it is what the real router's imbalance is read from
    (autopar.spec.routing), given the fit."""
    from scipy.optimize import least_squares

    if batch is not None and any(c.dropless for c in cases):
        batch = None
    cases = [c for c in cases if not c.dropless]
    batch = batch or CaseBatch.of(cases)
    params = _parameters({case_profile(c) for c in cases})
    specs = [constant_table()[n].for_profile(prof, lineage(prof)) for prof, n in params]
    prior = np.array([s.prior for s in specs])
    lo = np.array([s.low for s in specs])
    hi = np.array([s.high for s in specs])
    sigma = (hi - lo) / 4.0

    def table_at(v: np.ndarray) -> np.ndarray:
        return _table({p: float(x) for p, x in zip(params, v)})[0]

    def residual(v: np.ndarray) -> np.ndarray:
        err = batch.predicted(table_at(v))[1]
        return np.concatenate([_robust(np.log1p(np.maximum(err, -0.99)) / SIGMA_OBS), (v - prior) / sigma])

    sol = least_squares(residual, prior, bounds=(lo, hi), method="trf", x_scale=sigma, diff_step=1e-4)
    fitted = {p: float(x) for p, x in zip(params, sol.x)}
    _, consts = _table(fitted)
    return ProfileFit(
        constants=consts,
        parameters=[
            FittedConstant(prof, n, s.prior, s.low, s.high, fitted[(prof, n)], s.source)
            for (prof, n), s in zip(params, specs)
        ],
        residuals=batch.predicted(table_at(sol.x))[1],
        initial_residuals=batch.predicted(table_at(prior))[1],
        success=bool(sol.success),
        message=str(sol.message),
    )
