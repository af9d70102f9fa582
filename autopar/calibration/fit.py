"""Fit the cost model's constants to this machine's trial measurements (`autopar calibrate`):
bounded least squares on log ratios (scipy.optimize.least_squares). The published runs are fitted
by autopar.calibration.profile_fit, towards each constant's prior."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from autopar.spec.hardware import CostConstants


@dataclass
class FitResult:
    constants: CostConstants
    names: list[str]
    residuals: np.ndarray  # fitted (predicted / measured - 1) per case
    initial_residuals: np.ndarray
    success: bool
    message: str


def fit_constants(
    errors_for: Callable[[CostConstants], np.ndarray],
    start: CostConstants,
    names: Sequence[str],
    bounds: dict[str, tuple[float, float]],
    tol: float = 1e-8,
) -> FitResult:
    """Move the named constants (within their ranges, autopar.calibration.calibrate.bounds) to minimise
    sum(log(1 + error)^2), where `errors_for(constants)` returns each case's relative error; `tol`:
    scipy's ftol and xtol (its default, 1e-8, unless the caller settles for less)."""
    from scipy.optimize import least_squares

    names = list(names)
    lo = np.array([bounds[n][0] for n in names])
    hi = np.array([bounds[n][1] for n in names])
    x0 = np.clip(np.array([getattr(start, n) for n in names], dtype=float), lo, hi)
    scale = np.maximum(hi - lo, 1e-9)

    def constants_at(z):
        return replace(start, **{n: float(v) for n, v in zip(names, lo + z * scale)})

    def residual(z):
        return np.log1p(np.asarray(errors_for(constants_at(z)), dtype=float))

    sol = least_squares(
        residual, (x0 - lo) / scale, bounds=(0.0, 1.0), method="trf", diff_step=1e-3, ftol=tol, xtol=tol
    )
    best = constants_at(sol.x)
    return FitResult(
        constants=best,
        names=names,
        residuals=np.expm1(residual(sol.x)),
        initial_residuals=np.expm1(residual((x0 - lo) / scale)),
        success=bool(sol.success),
        message=str(sol.message),
    )
