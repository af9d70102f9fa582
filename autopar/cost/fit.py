"""Fit the cost model's constants to measurements: bounded least squares on log throughput ratios
(scipy.optimize.least_squares). Used by `autopar validate --fit` (published runs) and
`autopar calibrate` (trial measurements)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from autopar.spec.hardware import CostConstants

#: what `validate --fit` may move, with physically sensible bounds
DEFAULT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.4, 0.95),
    "fp8_gemm_efficiency": (0.3, 0.95),
    "gemm_half_efficiency_dim": (1.0, 4096.0),
    "attention_efficiency": (0.2, 1.0),
    "elementwise_traffic_factor": (0.0, 20.0),
    "layer_overhead_us": (0.0, 5000.0),
    "expert_gemm_efficiency": (0.2, 1.0),
    "tp_overlap": (0.0, 0.95),
}


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
    names: Sequence[str] | None = None,
    bounds: dict[str, tuple[float, float]] | None = None,
) -> FitResult:
    """Move the named constants (within bounds) to minimise sum(log(1 + error)^2), where
    `errors_for(constants)` returns each case's relative throughput error."""
    from scipy.optimize import least_squares

    bounds = bounds or DEFAULT_BOUNDS
    names = list(names or bounds)
    lo = np.array([bounds[n][0] for n in names])
    hi = np.array([bounds[n][1] for n in names])
    x0 = np.clip(np.array([getattr(start, n) for n in names], dtype=float), lo, hi)
    scale = np.maximum(hi - lo, 1e-9)

    def constants_at(z):
        return replace(start, **{n: float(v) for n, v in zip(names, lo + z * scale)})

    def residual(z):
        return np.log1p(np.asarray(errors_for(constants_at(z)), dtype=float))

    sol = least_squares(residual, (x0 - lo) / scale, bounds=(0.0, 1.0), method="trf", diff_step=1e-3)
    best = constants_at(sol.x)
    return FitResult(
        constants=best,
        names=names,
        residuals=np.expm1(residual(sol.x)),
        initial_residuals=np.expm1(residual((x0 - lo) / scale)),
        success=bool(sol.success),
        message=str(sol.message),
    )
