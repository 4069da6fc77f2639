"""Learning-curve families fitted to metric vs progress, and where each crosses a target.

Values are oriented so that higher is better (a "min" metric is negated by the caller);
progress is scaled to [0, 1] by the largest progress seen, which keeps fits well posed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


def _power(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return c - a * np.power(x, -b)


def _exp(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return c - a * np.exp(-b * x)


def _optimus(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    # Optimus (Peng et al., EuroSys'18): loss = 1 / (a*k + b) + c, here for "higher is better".
    return c - 1.0 / (a * x + b)


def _log(x: np.ndarray, a: float, b: float) -> np.ndarray:
    return a + b * np.log(x)


@dataclass(frozen=True)
class Family:
    """A curve family: function, initial guess, bounds and analytic target crossing."""

    name: str
    func: object
    p0: tuple
    lower: tuple
    upper: tuple


FAMILIES = {
    "power": Family("power", _power, (0.5, 0.5, 1.0), (1e-9, 1e-3, -np.inf), (np.inf, 5.0, np.inf)),
    "exp": Family("exp", _exp, (1.0, 2.0, 1.0), (1e-9, 1e-3, -np.inf), (np.inf, 50.0, np.inf)),
    "optimus": Family("optimus", _optimus, (5.0, 1.0, 1.0), (1e-6, 1e-6, -np.inf), (1e6, 1e6, np.inf)),
    "log": Family("log", _log, (0.5, 0.1), (-np.inf, 0.0), (np.inf, np.inf)),
}


def crossing(name: str, params: Iterable[float], target: float) -> float:
    """Scaled progress at which the fitted curve reaches `target` (inf if never)."""
    p = list(params)
    try:
        if name == "log":
            a, b = p
            return math.exp((target - a) / b) if b > 1e-12 else math.inf
        a, b, c = p
        if c <= target:
            return math.inf
        if name == "power":
            return (a / (c - target)) ** (1.0 / b)
        if name == "exp":
            ratio = (c - target) / a
            return max(0.0, -math.log(ratio) / b) if ratio < 1 else 0.0
        if name == "optimus":
            return max(0.0, (1.0 / (c - target) - b) / a)
    except (OverflowError, ValueError, ZeroDivisionError):
        return math.inf
    return math.inf


@dataclass(frozen=True)
class Fit:
    """A fitted family: parameters and root-mean-square residual on the points."""

    name: str
    params: tuple
    rmse: float


# Grids of the one non-linear parameter; the others are solved in closed form, so a fit costs
# one small least-squares solve per grid value instead of an iterative optimiser (~20 ms).
_GRIDS = {
    "power": np.geomspace(0.05, 5.0, 12),
    "exp": np.geomspace(0.1, 50.0, 12),
    "optimus": np.geomspace(0.01, 10.0, 12),
}


def _basis(name: str, x: np.ndarray, g: float) -> np.ndarray:
    if name == "power":
        return np.power(x, -g)
    if name == "exp":
        return np.exp(-g * x)
    return 1.0 / (x + g)  # optimus: c - k / (x + d) == c - 1 / (a x + b), a = 1/k, b = d/k


def fit_family(name: str, x: np.ndarray, y: np.ndarray) -> Fit | None:
    """Least-squares fit of one family (grid over the shape, exact for the rest)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if name == "log":
        design = np.column_stack([np.ones_like(x), np.log(x)])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        if coef[1] < 0:
            coef = np.array([float(np.mean(y)), 0.0])
        rmse = float(np.sqrt(np.mean((design @ coef - y) ** 2)))
        return Fit("log", (float(coef[0]), float(coef[1])), rmse)
    grid = _GRIDS[name]
    best = _best_on_grid(name, x, y, grid)
    if best is not None:
        # Refine between the neighbours of the best coarse value.
        i = int(np.searchsorted(grid, best[1]))
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
        fine = _best_on_grid(name, x, y, np.geomspace(lo, hi, 9))
        best = fine if fine is not None and fine[0] < best[0] else best
    if best is None:
        return None
    rmse, g, c, k = best
    if name == "optimus":
        return Fit(name, (1.0 / k, g / k, c), rmse)
    return Fit(name, (k, g, c), rmse)


def _best_on_grid(name: str, x: np.ndarray, y: np.ndarray, grid: Iterable[float]) -> tuple | None:
    best = None
    for g in grid:
        design = np.column_stack([np.ones_like(x), -_basis(name, x, g)])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        c, k = float(coef[0]), float(coef[1])
        if k <= 0:  # the curve must improve with progress
            continue
        rmse = float(np.sqrt(np.mean((design @ coef - y) ** 2)))
        if best is None or rmse < best[0]:
            best = (rmse, float(g), c, k)
    return best


def fit_all(
    x: npt.ArrayLike, y: npt.ArrayLike, *, warm: dict | None = None, families: Iterable[str] = tuple(FAMILIES)
) -> dict[str, Fit]:
    """Fit every family with more points than parameters (`warm` is accepted, unused)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    fits = {}
    for name in families:
        if len(x) < len(FAMILIES[name].p0) + 1:
            continue
        fit = fit_family(name, x, y)
        if fit is not None and all(math.isfinite(v) for v in fit.params):
            fits[name] = fit
    return fits


def predict_crossing(
    x: npt.ArrayLike, y: npt.ArrayLike, target: float, *, warm: dict | None = None
) -> tuple[float, dict]:
    """Median over families of the progress (in x units) at which y reaches target.

    Learning curves are often sigmoid (flat, then falling, then flat); only the recent half of
    the points is fitted, where the saturating families hold. Returns (crossing, fits);
    crossing is inf when most families never reach the target.
    """
    cross, _, fits = predict_crossing_spread(x, y, target, warm=warm)
    return cross, fits


def predict_crossing_spread(
    x: npt.ArrayLike, y: npt.ArrayLike, target: float, *, warm: dict | None = None
) -> tuple[float, float, dict]:
    """`predict_crossing` and how far the families disagree: log(latest / earliest crossing), inf when one
    of them never reaches the target (the fit's own uncertainty about where the curve meets it)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) == 0:
        return math.inf, math.inf, {}
    keep = max(MIN_TAIL, len(x) // 2)
    x, y = x[-keep:], y[-keep:]
    scale = float(np.max(x)) or 1.0
    fits = fit_all(x / scale, y, warm=warm)
    hits = [crossing(f.name, f.params, target) for f in fits.values()]
    # A crossing behind the last point contradicts the data when the target is not met yet.
    if y[-1] < target:
        hits = [h if h > 1.0 else math.inf for h in hits]
    if not hits:
        return math.inf, math.inf, fits
    # A family that never reaches the target counts as "very late", not as missing.
    mid = float(np.median(hits))
    low, high = min(hits), max(hits)
    spread = math.log(high / low) if math.isfinite(high) and low > 0 else math.inf
    return (mid * scale if math.isfinite(mid) else math.inf), spread, fits


MIN_TAIL = 5
