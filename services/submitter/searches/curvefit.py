"""Where a partial learning curve is going: saturating fits of the best-so-far value against scaled progress, their
projection at the end and an interval from their residuals and disagreement (pure numpy, no I/O)."""

import math
from dataclasses import dataclass

import numpy as np

# The shape parameter of each family on a grid; level and amplitude are then a closed-form least-squares solve.
GRIDS = {"power": np.geomspace(0.05, 4.0, 24), "exp": np.geomspace(0.2, 30.0, 24)}
MIN_POINTS = 4


@dataclass(frozen=True)
class Projection:
    """The projected value at progress 1 (lower is better): central, and an optimistic (low) bound."""

    value: float
    low: float
    high: float
    sigma: float


def _basis(family: str, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    if family == "power":
        return np.power(x[None, :], -grid[:, None])
    return np.exp(-grid[:, None] * x[None, :])


def fit_family(family: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(value at x=1, rmse) of y = c + a·f_g(x), a ≥ 0, best over the family's grid of shapes g."""
    grid = GRIDS[family]
    u = _basis(family, x, grid)  # (G, n)
    um, ym = u.mean(axis=1), y.mean()
    du, dy = u - um[:, None], y - ym
    var = (du * du).sum(axis=1)
    a = np.where(var > 0, (du * dy[None, :]).sum(axis=1) / np.where(var > 0, var, 1.0), 0.0)
    a = np.maximum(a, 0.0)  # a curve that gets worse with progress is flat here
    c = ym - a * um
    residual = y[None, :] - (c[:, None] + a[:, None] * u)
    rmse = np.sqrt((residual**2).mean(axis=1))
    best = int(np.argmin(rmse))
    at_end = c[best] + a[best] * _basis(family, np.ones(1), grid[best : best + 1])[0, 0]
    return float(at_end), float(rmse[best])


def best_so_far(values: list[float]) -> list[float]:
    return list(np.minimum.accumulate(np.asarray(values, float)))


def project(
    steps: list[float], values: list[float], *, horizon: float, z: float = 2.0, reach: float = 0.5, tail: float = 0.67
) -> Projection | None:
    """Project the best-so-far curve to `horizon` (values lower-is-better). The optimistic bound widens with the
    distance still to go: z residual sigmas plus `reach` times the improvement seen so far, scaled by 1 - progress."""
    x = np.asarray(steps, float) / horizon
    y = np.asarray(best_so_far(values), float)
    keep = x > 0
    x, y = x[keep], y[keep]
    if len(x) < MIN_POINTS:
        return None
    start = min(len(x) - MIN_POINTS, int(len(x) * (1 - tail)))
    x, y = x[start:], y[start:]
    progress = float(min(1.0, x[-1]))
    fitted, errors = zip(*(fit_family(f, x, y) for f in GRIDS))
    last = float(y[-1])
    ends = [min(last, e) for e in fitted]  # the best so far can only get better
    central = float(np.median(ends))
    sigma = max(errors) * math.sqrt(len(x) / max(1, len(x) - 3))
    seen = float(y[0] - y[-1]) + float(np.ptp(ends))
    low = min(ends) - z * sigma - reach * (1 - progress) * seen
    return Projection(value=central, low=min(low, last), high=last, sigma=sigma)
