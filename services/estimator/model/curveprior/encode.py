"""A curve prefix as the prior network's fixed input vector, and its truth as a bin of the Riemann output (pure).

Values are normalised robustly per curve (z: 1 at the median of the first points, 0 at the target, lower is
better whatever the mode), times by the training time so far (tau: 0 at the training's origin, 1 now; the origin
is the job's progress extrapolated back to zero, `owncurve.training_clock`). The truth is r = log(training time
at the first crossing / training time so far), cut into BINS equal bins over [0, log HORIZON], and one more bin
for "not within HORIZON times the time so far" (never, or too far to matter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from services.estimator.model.owncurve import MIN_POINTS, Marks, Series, line_slope, oriented, training_clock

GRID = 16  # cells of tau the prefix is averaged into
HORIZON = 50.0  # the crossing is placed within this many times the training time so far, or "beyond"
BINS = 48
EDGES = np.linspace(0.0, math.log(HORIZON), BINS + 1)
FLOOR = 1e-3  # normalised gaps below this are the target's noise
HEAD = 3  # the reference value is the median of the first few points (one lucky first print is no scale)
N_INPUTS = 3 * GRID + 12


@dataclass(frozen=True)
class Encoded:
    """The input vector, the training's origin (s since start) and the training time so far (s)."""

    x: np.ndarray
    origin: float
    span: float


def encode(ts: Series, xs: Marks, values: Series, *, target: float, mode: str, elapsed: float) -> Encoded | None:
    """The prefix seen by `elapsed` (t since start, progress or None, value) as the network's input; None when it
    holds too little (fewer than MIN_POINTS, already at the target, moving away from it)."""
    y, goal = oriented(values, target, mode)
    if len(y) < MIN_POINTS or elapsed <= 0 or not np.all(np.isfinite(y)):
        return None
    read = training_clock(ts, xs, y, elapsed=elapsed)
    if read is None:
        return None
    ts, _, y, _, origin, span = read
    ref = float(np.median(y[:HEAD]))
    if ref <= goal or y[-1] <= goal:
        return None
    z = (y - goal) / (ref - goal)
    tau = np.clip((ts - origin) / span, 0.0, 1.0)
    cells = _cells(tau, z)
    lz = np.log(np.maximum(z, FLOOR))
    last = float(np.mean(z[-HEAD:]))
    if last > 1.0:  # moving away from the target: nothing to extrapolate (as `owncurve.read_prefix`)
        return None
    late = tau >= 0.5
    slope = 0.0
    if late.sum() >= 2 and np.ptp(tau[late]) > 0:
        slope = line_slope(np.log(np.maximum(tau[late], 1e-3)), lz[late])
    noise = math.log(max(float(np.median(np.abs(np.diff(z, 2)))), 1e-4)) if len(z) >= 4 else math.log(0.1)
    depth_now, depth_start, depth_ok = _depth(y, goal, mode=mode, ref=ref)
    scalars = [
        math.log(max(last, FLOOR)),
        min(max(last, -1.0), 3.0),
        min(max(slope, -5.0), 5.0),
        noise,
        math.log(len(z)),
        float(tau[0]),
        depth_now,
        depth_start,
        depth_ok,
        float(mode == "max"),
        float(xs is None or any(x is None for x in xs)),
        math.log(max(float(np.min(z)), FLOOR)),
    ]
    vector = np.concatenate([cells, np.asarray(scalars)])
    return Encoded(np.nan_to_num(vector, nan=0.0, posinf=5.0, neginf=-5.0), float(origin), float(span))


def _cells(tau: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Per cell of tau: the mean z of its points (clipped), the log of it, and whether the cell had a point (an
    empty cell carries the previous cell's value; before the first point, the first value)."""
    index = np.minimum((tau * GRID).astype(int), GRID - 1)
    sums = np.bincount(index, weights=np.clip(z, -1.0, 3.0), minlength=GRID)
    counts = np.bincount(index, minlength=GRID)
    mean = np.full(GRID, np.nan)
    seen = counts > 0
    mean[seen] = sums[seen] / counts[seen]
    first = mean[np.argmax(seen)]
    filled = np.empty(GRID)
    current = first
    for k in range(GRID):
        current = mean[k] if seen[k] else current
        filled[k] = current
    return np.concatenate([filled, np.log(np.maximum(filled, FLOOR)), seen.astype(float)])


def _depth(y: np.ndarray, goal: float, *, mode: str, ref: float) -> tuple[float, float, float]:
    """(log of the value left over the target's from the metric's natural floor, now and at the start; 1), zeros
    when the metric has none: 0 for a loss (positive values), 1 for a fraction maximised."""
    floor = 0.0 if mode == "min" else -1.0  # oriented: a maximised fraction v is -v, its floor -1
    left = y - floor
    if goal - floor <= 0 or np.any(left <= 0) or (mode == "max" and np.any(y > 0)):
        return 0.0, 0.0, 0.0
    now = math.log(float(np.mean(left[-HEAD:])) / (goal - floor))
    start = math.log((ref - floor) / (goal - floor))
    return min(max(now, 0.0), 5.0), min(max(start, 0.0), 5.0), 1.0


def truth_bin(ratio: float) -> int:
    """The output bin of the truth: training time at the crossing over training time so far (inf: never)."""
    if not math.isfinite(ratio) or ratio >= HORIZON:
        return BINS
    r = math.log(max(ratio, 1.0))
    return min(int(np.searchsorted(EDGES, r, side="right")) - 1, BINS - 1)
