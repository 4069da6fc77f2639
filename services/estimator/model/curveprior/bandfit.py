"""The blend's band sized per family and cut (pure): the pair of quantiles of the out-of-family residuals (in the
band's units) that puts the most families' 10-90% coverage at each cut of the run inside the goal, not only the
pooled coverage (issue 31, sixth round). The cut is known when fitting (the truth is), never when serving: the
band's units carry what is known then (the readings' distance, the prior's own spread)."""

from __future__ import annotations

import numpy as np

GOAL = (0.75, 0.85)  # the coverage every family should have at every cut
LOW_LEVELS = (0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.16)
HIGH_LEVELS = (0.84, 0.86, 0.88, 0.9, 0.92, 0.94, 0.96)


def cut_of(truth: np.ndarray) -> np.ndarray:
    """The cut a reading was made at: its truth is log(total / elapsed) with elapsed = cut · total."""
    return np.round(np.exp(-truth), 2)


def cell_distance(inside: np.ndarray, cells: np.ndarray, count: np.ndarray) -> tuple[float, int]:
    """The mean distance (points) of each cell's coverage outside GOAL, and how many cells lie inside it."""
    coverage = np.bincount(cells, weights=inside, minlength=len(count)) / count
    off = np.maximum(np.maximum(GOAL[0] - coverage, coverage - GOAL[1]), 0.0)
    return float(off.mean()) * 100, int(np.sum(off == 0))


def weighted_quantile(values: np.ndarray, weight: np.ndarray, level: float) -> float:
    order = np.argsort(values)
    cdf = np.cumsum(weight[order]) / np.sum(weight)
    return float(values[order][min(int(np.searchsorted(cdf, level)), len(values) - 1)])


def cells_of(groups: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (family, cut) cell as an index, and each cell's count of rows."""
    _, family = np.unique(np.asarray(groups, str), return_inverse=True)
    _, cut = np.unique(cut_of(truth), return_inverse=True)
    _, cells, count = np.unique(family.ravel() * (cut.max() + 1) + cut.ravel(), return_inverse=True, return_counts=True)
    return cells.ravel(), count


def cell_band(z: np.ndarray, weight: np.ndarray, *, groups: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(low, high) among the residuals' quantiles at LOW_LEVELS x HIGH_LEVELS (every family weighing the same):
    the pair whose coverage per (family, cut) lies nearest GOAL (the mean distance outside it, then the most
    cells inside, then the first of equals: the narrowest levels first)."""
    cells, count = cells_of(groups, truth)
    lows = [weighted_quantile(z, weight, q) for q in reversed(LOW_LEVELS)]
    highs = [weighted_quantile(z, weight, q) for q in HIGH_LEVELS]
    best: tuple[float, int, float, float] | None = None
    for lo in lows:
        for hi in highs:
            distance, inside = cell_distance(((z >= lo) & (z <= hi)).astype(float), cells, count)
            if best is None or (round(distance, 9), -inside) < (round(best[0], 9), -best[1]):
                best = (distance, inside, lo, hi)
    assert best is not None
    return best[2], best[3]
