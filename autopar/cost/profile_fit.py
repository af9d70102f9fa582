"""Fit the performance profiles to published runs (`autopar validate --fit`).

The profiles share one physics: the Megatron-Core profile is the base, fitted on every row; another
trainer's profile is the base times exp(delta) for the constants where trainers really differ
(their kernels, their overheads, how they overlap data-parallel communication), each delta pulled
towards 0 by a ridge penalty. A profile with no row of its own in the training set keeps the base:
that is the leave-one-source-out prediction for a source that is alone in its family. Bounded least
squares on log(predicted / published throughput) (scipy.optimize.least_squares, with the Jacobian's
sparsity: a row depends on the base and its own profile's deltas only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from autopar.cost.profiles import profile_of, profiles
from autopar.cost.run_cases import RunCase
from autopar.cost.validation import predict
from autopar.spec.hardware import CostConstants

BASE = "megatron"
#: base constants and their physically sensible bounds
BASE_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.4, 0.95),
    "fp8_gemm_efficiency": (0.3, 0.95),
    "gemm_half_efficiency_dim": (1.0, 2048.0),
    "attention_efficiency": (0.2, 1.0),
    "attention_half_seq": (0.0, 8192.0),
    "elementwise_traffic_factor": (0.0, 40.0),
    "layer_overhead_us": (0.0, 3000.0),
    "expert_gemm_efficiency": (0.2, 1.0),
    "expert_gemm_half_dim": (1.0, 8192.0),
    "moe_layer_overhead_us": (0.0, 20000.0),
    "ep_a2a_efficiency": (0.05, 1.0),
    "deepep_efficiency": (0.05, 1.0),
    "ep_overlap": (0.0, 1.0),
    "moe_routing_imbalance": (1.0, 3.0),
    "tp_overlap": (0.0, 0.98),
    "dp_overlap": (0.0, 1.0),
}
#: per-profile deviations from the parent profile: the constants a trainer's own kernels and engine
#: change (parents before children)
_OWN = ("gemm_efficiency", "attention_efficiency", "layer_overhead_us", "dp_overlap")
DELTAS: dict[str, tuple[str, ...]] = {
    "torchtitan": _OWN + ("fp8_gemm_efficiency", "elementwise_traffic_factor"),
    "deepspeed": _OWN,
    "nanotron": _OWN,
    "meta": _OWN,
}
DELTA_BOUND = 1.5  # |log deviation| at most: a factor of e^1.5 = 4.5
RIDGE = 0.5  # penalty weight of a log deviation, against one row's log error


@dataclass
class ProfileFit:
    constants: dict[str, CostConstants]  # profile name -> fitted constants
    base_names: list[str]
    deltas: dict[str, dict[str, float]]  # profile -> constant -> log deviation
    residuals: np.ndarray  # per training case, relative throughput error after the fit
    initial_residuals: np.ndarray
    success: bool
    message: str


def _clip(name: str, value: float) -> float:
    if name.endswith(("_efficiency", "_overlap")):
        return float(min(max(value, 1e-6), 1.0))
    return float(max(value, 0.0))


def fit_profiles(
    cases: list[RunCase],
    start: dict[str, CostConstants] | None = None,
    base_bounds: dict[str, tuple[float, float]] | None = None,
) -> ProfileFit:
    """Fit the base constants and each profile's deviations to the cases."""
    from scipy.optimize import least_squares
    from scipy.sparse import lil_matrix

    start = start or {name: p.constants for name, p in profiles().items()}
    bounds = base_bounds or BASE_BOUNDS
    names = list(bounds)
    case_profile = [c.profile or profile_of(c.plan.trainer).name for c in cases]
    present = set(case_profile)
    delta_keys = [(p, n) for p, ns in DELTAS.items() if p in present for n in ns]
    lo = np.array([bounds[n][0] for n in names] + [-DELTA_BOUND] * len(delta_keys))
    hi = np.array([bounds[n][1] for n in names] + [DELTA_BOUND] * len(delta_keys))
    scale = np.maximum(hi - lo, 1e-9)
    x0 = np.array([np.clip(getattr(start[BASE], n), *bounds[n]) for n in names] + [0.0] * len(delta_keys))

    def constants_at(z: np.ndarray) -> dict[str, CostConstants]:
        v = lo + z * scale
        out = {BASE: replace(start[BASE], **{n: float(x) for n, x in zip(names, v)})}
        for prof, p in profiles().items():  # parents are listed before their children
            if prof == BASE:
                continue
            if not p.parent:  # not in the hierarchy (the built-in model: priced by `autopar probe`)
                out[prof] = start[prof]
                continue
            parent = out[p.parent] if p.parent in out else out[BASE]
            fixed = {n: getattr(p.constants, n) for n in ("attention_mma_sync", "attention_block", "attention_flash")}
            own = {
                n: _clip(n, getattr(parent, n) * np.exp(v[len(names) + i]))
                for i, (pp, n) in enumerate(delta_keys)
                if pp == prof
            }
            out[prof] = replace(parent, **fixed, **own)
        return out

    def residual(z: np.ndarray) -> np.ndarray:
        k = constants_at(z)
        errs = np.array([predict(c, k)[1] for c in cases])
        penalty = RIDGE * (lo[len(names) :] + z[len(names) :] * scale[len(names) :])
        return np.concatenate([np.log1p(np.maximum(errs, -0.99)), penalty])

    sparsity = lil_matrix((len(cases) + len(delta_keys), len(names) + len(delta_keys)), dtype=int)
    for i, prof in enumerate(case_profile):
        sparsity[i, : len(names)] = 1
        chain = _ancestry(prof)
        for j, (pp, _) in enumerate(delta_keys):
            if pp in chain:
                sparsity[i, len(names) + j] = 1
    for j in range(len(delta_keys)):
        sparsity[len(cases) + j, len(names) + j] = 1
    z0 = (x0 - lo) / scale
    sol = least_squares(
        residual, z0, bounds=(0.0, 1.0), method="trf", diff_step=1e-3, jac_sparsity=sparsity, x_scale="jac", max_nfev=60
    )
    fitted = constants_at(sol.x)
    v = lo + sol.x * scale
    deltas: dict[str, dict[str, float]] = {}
    for i, (p, n) in enumerate(delta_keys):
        deltas.setdefault(p, {})[n] = float(v[len(names) + i])
    errs = np.array([predict(c, fitted)[1] for c in cases])
    errs0 = np.array([predict(c, constants_at(z0))[1] for c in cases])
    return ProfileFit(
        constants=fitted,
        base_names=names,
        deltas=deltas,
        residuals=errs,
        initial_residuals=errs0,
        success=bool(sol.success),
        message=str(sol.message),
    )


def _ancestry(prof: str) -> set[str]:
    """A profile and its parents."""
    out, p = set(), prof
    while p and p not in out:
        out.add(p)
        p = profiles()[p].parent if p in profiles() else ""
    return out


def fitter(base_bounds: dict[str, tuple[float, float]] | None = None) -> Callable[[list[RunCase]], dict]:
    """A fit function for leave-one-source-out (autopar.cost.validation): cases -> constants."""
    return lambda cases: fit_profiles(cases, base_bounds=base_bounds).constants
