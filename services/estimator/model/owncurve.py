"""An ETA for a job that declares a target and nothing else: its own metric curve, its live progress rate, and
an interval learned across many real curves (pure, no I/O; the live tracker and the harness call the same code).

The prefix of the curve is read on scale-free axes: the value as the fraction of the way left from the first
value to the target, time as a fraction of the training time so far (the progress rate, re-estimated with decay
as the pace changes, extrapolates the job's steps back to the training's start). Its features (the way left at a
quarter, half, three quarters and now, the local power-law exponent, the crossing of a power law `a + b·x^-c`
fitted on the declining part, and how late the first point came) go to a small quantile network learned on a
corpus of real curves (`owncurve.json`, written by `python -m bench.search.calibrate`), which gives the 10%, 50%
and 90% quantiles of the training time still to go (the mean of a small ensemble), widened by conformal pads
learned on seeds each network did not see, one pair per phase of the run. Early
on, or on a curve that is still flat, that band is wide: it says how little is known.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import numpy as np

from services.estimator.model.curves import crossing

CALIBRATION = Path(__file__).with_name("owncurve.json")
MIN_POINTS = 2  # fewer metric points give no estimate
MIN_FIT = 5  # points a power law is fitted on
HALF_LIFE = 0.25  # the rate's marks halve their weight every quarter of the elapsed time
SMOOTH = 3  # the last value is the mean of the last few (a printed loss is noisy)
PLAIN, TAIL = "plain", "tail"  # the power law's fit: every residual alike, or each over its way left to the target
POWER_FITS = (PLAIN, TAIL)
MAX_OVER_ELAPSED = 50.0  # no estimate puts the end beyond this many times the time elapsed
# Uncalibrated band (no calibration file) around log(total training time): wide, it says how little is known.
DEFAULT_BAND = (-1.0, 1.0)

Series: TypeAlias = Sequence[float] | np.ndarray  # a curve's times or values, as read or as an array
Marks: TypeAlias = Sequence[float | None] | np.ndarray | None  # its progress, None where a point has none


@dataclass(frozen=True)
class OwnEstimate:
    """Total duration since the start (s), its 10-90% band, how it was made, the run fraction seen."""

    total_s: float
    low_s: float
    high_s: float
    kind: str
    fraction: float


@dataclass(frozen=True)
class Prefix:
    """What a curve prefix says: its features (scale-free), the training's origin and the training time so far
    (s; progress extrapolated back to zero, so a slow start-up is not read as slow training), the power law's
    total (s since start, inf when it does not reach the target)."""

    features: tuple[float, ...]
    origin: float
    span: float
    power_total: float


def oriented(values: Series, target: float, mode: str) -> tuple[np.ndarray, float]:
    """Values and target turned so that lower is better."""
    if mode not in ("min", "max"):
        raise ValueError("mode must be 'min' or 'max'")
    y = np.asarray(values, float)
    return (y, float(target)) if mode == "min" else (-y, -float(target))


def progress_rate(ts: np.ndarray, xs: np.ndarray, *, elapsed: float) -> float | None:
    """Progress per second, a weighted least-squares slope whose weights halve every HALF_LIFE of the elapsed
    time back from the last mark."""
    if len(ts) < 2 or np.ptp(ts) <= 0:
        return xs[-1] / ts[-1] if len(ts) and ts[-1] > 0 and xs[-1] > 0 else None
    w = np.power(0.5, (ts[-1] - ts) / max(HALF_LIFE * elapsed, 1e-9))
    mt, mx = np.average(ts, weights=w), np.average(xs, weights=w)
    var = np.average((ts - mt) ** 2, weights=w)
    slope = np.average((ts - mt) * (xs - mx), weights=w) / var if var > 0 else 0.0
    return float(slope) if slope > 0 else None


def fit_start(y: np.ndarray) -> int:
    """Index where the curve's decline starts (a flat beginning, before the loss moves, is not a power law)."""
    drop = y[0] - float(np.min(y))
    if drop <= 0:
        return 0
    moved = np.nonzero(y <= y[0] - 0.1 * drop)[0]
    return max(0, int(moved[0]) - 1) if len(moved) else 0


def power_crossing(xs: np.ndarray, y: np.ndarray, target: float, *, power_fit: str = PLAIN) -> float:
    """Progress at which `a + b·x^-c`, fitted on the declining part of the curve, reaches the target (inf when
    the fit flattens above it). `power_fit`: PLAIN weighs every residual alike, so the high early values decide
    the fit and the tail, where the crossing is, hardly counts; TAIL weighs each by the inverse of its way left
    to the target (a relative error), so a deep target is extrapolated from the tail."""
    if power_fit not in POWER_FITS:
        raise ValueError(f"power_fit must be one of {POWER_FITS}, not {power_fit!r}")
    start = fit_start(y)
    x, v = xs[start:], y[start:]
    if len(x) < MIN_FIT or x[0] <= 0:
        return math.inf
    scale = float(x[-1])
    weights = None
    if power_fit == TAIL:
        way = v - target
        weights = 1.0 / np.maximum(way, FLOOR * max(float(way[0]), float(np.max(way)))) ** 2
    params = fit_power(x / scale, -v, weights=weights)  # the family is "higher is better"
    if params is None:
        return math.inf
    hit = crossing("power", params, -target)
    return hit * scale if math.isfinite(hit) else math.inf


POWER_GRID = np.geomspace(0.05, 5.0, 12)  # the power family's shapes, as `curves.fit_family` tries them
# the finer shapes between each coarse shape's neighbours, where the best coarse one is refined
_FINE_GRIDS = tuple(
    np.geomspace(POWER_GRID[max(i - 1, 0)], POWER_GRID[min(i + 1, len(POWER_GRID) - 1)], 9)
    for i in range(len(POWER_GRID))
)


def fit_power(x: np.ndarray, y: np.ndarray, *, weights: np.ndarray | None = None) -> tuple[float, float, float] | None:
    """`curves.fit_family("power", x, y)`'s parameters (a, b, c of `c - a·x^-b`), every value of the shape's grid
    solved at once (the same coarse grid and refinement; its least squares in closed form, not one `lstsq` per
    value): the fit every prefix's features and every fold's samples make, several times faster. `weights`: of
    each point's squared residual (None: all alike, as `fit_family`)."""
    best = _power_on_grid(x, y, POWER_GRID, weights)
    if best is None:
        return None
    i = int(np.searchsorted(POWER_GRID, best[1]))
    fine = _power_on_grid(x, y, _FINE_GRIDS[i], weights)
    rmse, b, c, a = fine if fine is not None and fine[0] < best[0] else best
    return a, b, c


def line_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The least-squares slope of `y` on `x` (`np.polyfit(x, y, 1)[0]` in closed form: this runs at every cut of
    every sample a fold is built on)."""
    dx = x - x.mean()
    return float(dx @ (y - y.mean()) / (dx @ dx))


def _power_on_grid(
    x: np.ndarray, y: np.ndarray, grid: np.ndarray, weights: np.ndarray | None = None
) -> tuple[float, float, float, float] | None:
    """(rmse, shape, c, a) of the best least-squares `c - a·x^-shape` over `grid` with a > 0 (the first of equals),
    or None when no shape gives an improving curve; the squares weighed by `weights` when given."""
    basis = -np.power(x[None, :], -grid[:, None])
    if weights is None:
        centred, dy = basis - basis.mean(axis=1, keepdims=True), y - y.mean()
        with np.errstate(divide="ignore", invalid="ignore"):
            a = (centred @ dy) / np.einsum("ij,ij->i", centred, centred)
        c = y.mean() - a * basis.mean(axis=1)
        residual = c[:, None] + a[:, None] * basis - y
        rmse = np.where(a > 0, np.sqrt(np.mean(residual * residual, axis=1)), np.inf)
    else:
        share = weights / weights.sum()
        mean_basis, mean_y = basis @ share, float(y @ share)
        centred, dy = basis - mean_basis[:, None], y - mean_y
        with np.errstate(divide="ignore", invalid="ignore"):
            a = ((centred * share) @ dy) / np.einsum("ij,ij,j->i", centred, centred, share)
        c = mean_y - a * mean_basis
        residual = c[:, None] + a[:, None] * basis - y
        rmse = np.where(a > 0, np.sqrt((residual * residual) @ share), np.inf)
    i = int(np.argmin(rmse))
    return (float(rmse[i]), float(grid[i]), float(c[i]), float(a[i])) if np.isfinite(rmse[i]) else None


FEATURES = (
    "z10",
    "z25",
    "z50",
    "z75",
    "z90",
    "zlast",
    "way",
    "slope",
    "power",
    "power_ok",
    "first",
    "linear",
    "drift",
    "noise",
    "depth",
    "depth_start",
    "depth_slope",
    "depth_pace",
    "depth_ok",
)
FLOOR = 1e-3  # normalised gaps below this are the target's noise
SEEN_EDGES = (0.15, 0.25, 0.4, 0.6)  # bins of the fraction of the training seen, each with its own pads


def training_clock(
    ts: Series, xs: Marks, y: np.ndarray, *, elapsed: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float, float] | None:
    """(times, progress, values, rate, origin, span) of a prefix on the training's own clock: the job's progress
    rate extrapolated back to progress 0 (its origin; a slow start-up is not training) and the training time so
    far; the clock itself when a point has no progress. None when there is too little to read."""
    ts = np.asarray(ts, float)
    clock = xs is None or any(x is None for x in xs)
    x = ts if clock else np.asarray(xs, float)
    if not clock and (np.any(np.diff(x) <= 0) or x[0] <= 0):
        keep = np.concatenate([[True], np.diff(x) > 0]) & (x > 0)  # a restarted or repeated step: keep rises
        ts, x, y = ts[keep], x[keep], y[keep]
        if len(y) < MIN_POINTS:
            return None
    rate = 1.0 if clock else progress_rate(ts, x, elapsed=elapsed)
    if rate is None:
        return None
    origin = 0.0 if clock else min(max(ts[0] - x[0] / rate, 0.0), ts[0])
    span = elapsed - origin
    return None if span <= 0 else (ts, x, y, rate, origin, span)


def read_prefix(
    ts: Series, xs: Marks, values: Series, *, target: float, mode: str, elapsed: float, power_fit: str = PLAIN
) -> Prefix | None:
    """Features of the curve seen by `elapsed` (points: t since start, progress or None, value), or None when
    there is too little to read. The value axis is normalised by the way from the first value to the target
    (z: 1 at the start, 0 at the target), the time axis by the training time so far (tau: 0 to 1); the power
    law's crossing by `power_fit` (`power_crossing`)."""
    y, goal = oriented(values, target, mode)
    if len(y) < MIN_POINTS or elapsed <= 0 or y[0] <= goal:
        return None
    read = training_clock(ts, xs, y, elapsed=elapsed)
    if read is None:
        return None
    ts, x, y, rate, origin, span = read
    tau = (ts - origin) / span
    z = (y - goal) / (y[0] - goal)
    envelope = np.minimum.accumulate(z)
    gaps = [math.log(max(float(np.interp(q, tau, envelope)), FLOOR)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)]
    last = float(np.mean(z[-SMOOTH:]))
    if last > 1.0:  # moving away from the target: nothing to extrapolate
        return None
    late = tau >= 0.5
    slope = 0.0
    if late.sum() >= 2 and np.ptp(tau[late]) > 0:  # d log(gap) / d log(time): the power law's exponent, locally
        slope = line_slope(np.log(tau[late]), np.log(np.maximum(z[late], FLOOR)))
    linear, drift = _recent_pace(tau, z, last)
    cross = power_crossing(x, y, goal, power_fit=power_fit)
    power_total = ts[-1] + max(cross - x[-1], 0.0) / rate if math.isfinite(cross) else math.inf
    power = (
        min(max((power_total - origin) / span, 1.0), MAX_OVER_ELAPSED)
        if math.isfinite(power_total)
        else MAX_OVER_ELAPSED
    )
    features = (
        *gaps,
        math.log(max(last, FLOOR)),
        min(max(1 - last, -1.0), 1.0),
        min(max(slope, -5.0), 5.0),
        math.log(power),
        float(math.isfinite(power_total)),
        float(min(tau[0], 1.0)),
        linear,
        drift,
        _noise(z),
        *_depth(tau, y, goal, mode=mode),
    )
    return Prefix(features, origin, span, power_total)


def _recent_pace(tau: np.ndarray, z: np.ndarray, last: float) -> tuple[float, float]:
    """(log of the time to the target at the recent straight-line pace, over the time so far; the recent fall of
    log z per unit of tau): what the last third of the prefix says, beside the power law's whole-curve view."""
    recent = tau >= 2 / 3
    if recent.sum() < 2 or np.ptp(tau[recent]) <= 0:
        return math.log(MAX_OVER_ELAPSED), 0.0
    fall = -line_slope(tau[recent], z[recent])
    linear = math.log(min(1 + max(last, 0.0) / fall, MAX_OVER_ELAPSED)) if fall > 0 else math.log(MAX_OVER_ELAPSED)
    drift = -line_slope(tau[recent], np.log(np.maximum(z[recent], FLOOR)))
    return linear, min(max(drift, -10.0), 10.0)


def _depth(tau: np.ndarray, y: np.ndarray, goal: float, *, mode: str) -> tuple[float, float, float, float, float]:
    """(log of the value left over the target's, now and at the start, measured from the metric's natural floor:
    0 for a loss, 1 for a fraction maximised; the late log-log slope of that value; the log of the time to the
    target at that slope, over the time so far; 1) or zeros when the metric has no such floor. The way-left axis
    reads 90% done alike whether the loss must still halve or fall by a hundredth; a loss that must still fall
    threefold on its slow tail is far from done."""
    floor = 0.0 if mode == "min" else -1.0  # oriented: a maximised fraction v is -v, its floor -1
    left = y - floor
    if goal - floor <= 0 or np.any(left <= 0) or (mode == "max" and np.any(y > 0)):
        return 0.0, 0.0, 0.0, 0.0, 0.0
    now, start = (math.log(float(np.mean(left[-SMOOTH:])) / (goal - floor)), math.log(float(left[0]) / (goal - floor)))
    late = tau >= 0.5
    slope = 0.0
    if late.sum() >= 2 and np.ptp(tau[late]) > 0:
        slope = line_slope(np.log(tau[late]), np.log(left[late]))
    pace = min(max(now, 0.0) / -slope, math.log(MAX_OVER_ELAPSED)) if slope < 0 else math.log(MAX_OVER_ELAPSED)
    return min(max(now, 0.0), 5.0), min(max(start, 0.0), 5.0), min(max(slope, -5.0), 5.0), pace, 1.0


def _noise(z: np.ndarray) -> float:
    """Log of the point-to-point jitter of the curve (a running mean prints smooth, a per-batch loss jumps): how
    soon a noisy value may touch the target before its trend does."""
    if len(z) < 4:
        return math.log(0.1)
    return math.log(max(float(np.median(np.abs(np.diff(z, 2)))), 1e-4))


def past_rise(ts: Series, xs: Marks, values: Series, *, mode: str) -> tuple[Series, Marks, Series]:
    """The prefix from its worst value on when it first rose clearly away from the target (an average started
    from zero, a loss that climbs through a warm-up): the rise is no part of the decline to extrapolate, and
    against its low first value the falling curve would read as moving away from the target, or as past it. A
    rise counts when the worst value is among the first half of the points and it rose above the first by more
    than half of what it has fallen since (a noisy start's jitter does not; a curve still rising has not turned)."""
    y, _ = oriented(values, 0.0, mode)
    if len(y) < 2 * MIN_POINTS:
        return ts, xs, values
    peak = int(np.argmax(y[: (len(y) + 1) // 2]))
    rise, fall = float(y[peak] - y[0]), float(y[peak] - np.min(y[peak:]))
    if peak == 0 or fall <= 0 or not rise > 0.5 * fall:
        return ts, xs, values
    return ts[peak:], None if xs is None else xs[peak:], values[peak:]


def reached(values: Series, *, target: float, mode: str) -> bool:
    y, goal = oriented(list(values)[-1:], target, mode)
    return len(y) > 0 and y[-1] <= goal


def own_estimate(
    ts: Series, xs: Marks, values: Series, *, target: float, mode: str, elapsed: float, calibration: dict | None
) -> OwnEstimate | None:
    """Total duration and 10-90% band (seconds since the start) from the curve seen by `elapsed`."""
    if len(values) and reached(values, target=target, mode=mode):
        return OwnEstimate(elapsed, elapsed, elapsed, "reached", 1.0)
    fit = calibration.get("power_fit", PLAIN) if calibration else PLAIN
    if fit not in POWER_FITS:  # a calibration learned on features this code cannot read
        calibration, fit = None, PLAIN
    prefix = read_prefix(ts, xs, values, target=target, mode=mode, elapsed=elapsed, power_fit=fit)
    if prefix is None:
        return None
    if calibration and calibration.get("nets") and calibration.get("features") == list(FEATURES):
        q10, q50, q90 = learned_quantiles(prefix.features, calibration)
        kind = "curve-learned"
    else:  # no calibration: the power law's own total, or the way covered, with a wide band
        q50 = (
            prefix.features[FEATURES.index("power")]
            if prefix.features[FEATURES.index("power_ok")]
            else -math.log(max(prefix.features[FEATURES.index("way")], 1 / MAX_OVER_ELAPSED))
        )
        q10, q90, kind = q50 + DEFAULT_BAND[0], q50 + DEFAULT_BAND[1], "curve"
    q10, q50, q90 = (min(max(q, 0.0), math.log(MAX_OVER_ELAPSED)) for q in (q10, min(max(q50, q10), q90), q90))
    total, low, high = (prefix.origin + prefix.span * math.exp(q) for q in (q50, q10, q90))
    return OwnEstimate(
        max(total, elapsed),
        max(min(low, total), elapsed),
        max(high, total),
        kind,
        min(1.0, elapsed / max(total, elapsed)),
    )


def learned_quantiles(features: Sequence[float], calibration: dict) -> tuple[float, float, float]:
    """(10%, 50%, 90%) of log(training time to target / training time so far): the mean of the ensemble's
    quantiles, widened by the conformal pads of the bin of the fraction of the training the median says is seen
    (early in a run the network misses by more than late: one pad for all would over-cover the end)."""
    q10, q50, q90 = np.mean([quantile_net(features, net) for net in calibration["nets"]], axis=0)
    edges, pads = calibration.get("pad_edges", ()), calibration.get("pads", ())
    low, high = pads[bisect.bisect_right(edges, math.exp(-q50))] if len(pads) == len(edges) + 1 else (0.0, 0.0)
    return float(q10 - low), float(q50), float(q90 + high)


def quantile_net(features: Sequence[float], net: dict) -> tuple[float, float, float]:
    """(10%, 50%, 90%) quantiles of log(training time to target / training time so far): a small MLP trained
    with the pinball loss on the corpus (weights in the calibration file)."""
    x = (np.asarray(features, float) - np.asarray(net["mean"])) / np.asarray(net["std"])
    for i, (w, b) in enumerate(net["layers"]):
        x = np.asarray(w) @ x + np.asarray(b)
        if i < len(net["layers"]) - 1:
            x = np.maximum(x, 0.0)
    mid, down, up = (float(v) for v in x)
    return mid - _softplus(down), mid, mid + _softplus(up)


def _softplus(v: float) -> float:
    return v + math.log1p(math.exp(-v)) if v > 0 else math.log1p(math.exp(v))


def load_calibration(path: Path = CALIBRATION) -> dict | None:
    """The shipped calibration; None when it is missing or unreadable (the default bands apply)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return table if isinstance(table, dict) else None
