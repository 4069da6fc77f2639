"""Synthetic learning curves for the prior's pre-training (pure numpy, seeded; never reads a recorded run).

A curve is a shape of Domhan et al.'s families (pow3/pow4, exponential, log-power/MMF, Janoschek/Weibull, ilog2)
or a mixture of two, run along an effective progress that a learning-rate schedule (constant, warm-up, step
decay, cosine, one-cycle, linear or exponential decay) drives, sometimes after a flat start, sometimes held on a
plateau and then dropping suddenly; a schedule's high rate also holds the loss up (a step decay drops it). It is
printed at irregular steps whose cadence may change mid-run, timed by a pace that changes, after a start-up; the
printed value carries noise of one model (`noise.printed_series`: Gaussian, heavy-tailed or multiplicative, white
or autocorrelated, its scale following the loss or not), sometimes a running mean or an EMA of it, an accuracy in
steps of one evaluation example. Losses (mode min) fall toward 0, accuracies (mode max) rise toward 1. The target
is the level the printed series had reached at some point of the run (sometimes below its median there), a level
a little below the plateau the clean curve saturates at (met by noise alone, if ever), or, one case in eight,
beyond what the curve ever reaches. The truth is the first crossing of the noisy *printed* series: a target met
only by noise on a plateau is a first-passage time, and the network learns it as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from services.estimator.model.curveprior.noise import printed_series, quantised

FINE = 512  # points of the schedule's integral
UNREACHABLE = 0.12  # share of cases whose target the curve never meets
NOISY_PLATEAU = 0.1  # share of cases whose target lies just below the plateau: a first passage, if ever


@dataclass(frozen=True)
class Sample:
    """One synthetic job: its printed points (t since start, step or None, value), target, mode, the moment of
    the cut, and the time of the first crossing (inf: never)."""

    ts: np.ndarray
    xs: np.ndarray | None
    values: np.ndarray
    target: float
    mode: str
    elapsed: float
    truth: float


def _loguniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def shape(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """A decreasing curve from 1 (x = 0) toward 0 of one family, at progress x (its own scale)."""
    family = rng.integers(0, 6)
    alpha = _loguniform(rng, 0.3, 3.0)
    if family == 0:  # pow3 / pow4: (1 + x)^-alpha
        return (1.0 + x) ** -alpha
    if family == 1:  # exponential
        return np.exp(-x)
    if family == 2:  # log-power / MMF: 1 / (1 + x^alpha)
        return 1.0 / (1.0 + x**alpha)
    if family == 3:  # Janoschek / Weibull: exp(-x^alpha)
        return np.exp(-(x**alpha))
    if family == 4:  # ilog2: slow, 1 / log(x + e)
        return 1.0 / np.log(x * alpha + math.e)
    return 1.0 / (1.0 + x) ** (alpha * 0.5) * np.exp(-x * 0.1)  # a power law with an exponential cut-off


SCHEDULES = ("constant", "warmup", "step", "cosine", "warmup-cosine", "one-cycle", "linear", "exponential")


def schedule(rng: np.random.Generator, u: np.ndarray, kind: str | None = None) -> np.ndarray:
    """The learning rate over the run's fraction u (max 1): constant, warm-up, 1-3 step decays, cosine, warm-up and
    cosine, one-cycle (up to a peak, then annealed far below the start), linear or exponential decay."""
    if kind is None:
        kind = str(rng.choice(SCHEDULES, p=[0.25, 0.1, 0.2, 0.12, 0.08, 0.1, 0.08, 0.07]))
    lr = np.ones_like(u)
    if kind == "step":
        for edge in np.sort(rng.uniform(0.2, 0.9, size=rng.integers(1, 4))):
            lr = np.where(u >= edge, lr * _loguniform(rng, 0.05, 0.5), lr)
    if kind in ("cosine", "warmup-cosine"):
        lr = 0.5 * (1 + np.cos(math.pi * u)) + 1e-3
    if kind in ("warmup", "warmup-cosine"):
        lr = lr * np.minimum(1.0, u / rng.uniform(0.02, 0.2))
    if kind == "one-cycle":
        peak, top = rng.uniform(0.1, 0.45), _loguniform(rng, 3.0, 25.0)
        rise = 1.0 + (top - 1.0) * 0.5 * (1 - np.cos(math.pi * np.minimum(u / peak, 1.0)))
        fall = top * (0.5 * (1 + np.cos(math.pi * (u - peak) / (1 - peak))) + 1e-4)
        lr = np.where(u < peak, rise, fall)
    if kind == "linear":
        lr = np.maximum(1.0 - u * rng.uniform(0.7, 1.0), 1e-3)
    if kind == "exponential":
        lr = np.exp(-u * rng.uniform(1.0, 6.0))
    return np.maximum(lr, 1e-4)


def drops(rng: np.random.Generator, u: np.ndarray) -> np.ndarray:
    """Sudden drops after plateaus (an attention model finding its task, a grokking phase): the share of the curve
    still standing at each fraction of the run, 1 before the first drop; 1-2 drops, each quick (0.3-5% of the run)
    and taking 30-90% of what stood."""
    standing = np.ones_like(u)
    for at in np.sort(rng.uniform(0.05, 0.75, size=rng.integers(1, 3))):
        width, depth = _loguniform(rng, 0.003, 0.05), rng.uniform(0.3, 0.9)
        standing = standing * (1.0 - depth / (1.0 + np.exp(-(u - at) / width)))
    return standing


def clean_curve(rng: np.random.Generator, u: np.ndarray) -> np.ndarray:
    """The noiseless oriented value (lower is better, floor 0, 1 at the start) at the run's fractions u."""
    lr = schedule(rng, u)
    progress = np.concatenate([[0.0], np.cumsum((lr[1:] + lr[:-1]) / 2 * np.diff(u))])
    progress = progress / max(progress[-1], 1e-12) * _loguniform(rng, 0.3, 300.0)
    if rng.random() < 0.15:  # a flat start before the metric moves
        progress = np.maximum(progress - rng.uniform(0.05, 0.3) * progress[-1], 0.0)
    s = shape(rng, progress)
    if rng.random() < 0.3:  # a mixture: two phases at different scales
        weight = rng.uniform(0.2, 0.8)
        s = weight * s + (1 - weight) * shape(rng, progress * _loguniform(rng, 0.01, 100.0))
    if rng.random() < 0.2:  # a plateau, then a sudden drop: what a slow shape leaves, the drops take quickly
        slow = rng.uniform(0.0, 0.5)
        s = drops(rng, u) * (1 - slow + slow * s)
    plateau = _loguniform(rng, 1e-3, 0.9)
    excess = _loguniform(rng, 0.01, 0.3) * lr / lr.max() if rng.random() < 0.5 else 0.0  # a high rate holds it up
    return plateau + (1 - plateau) * s + excess * (1 - plateau)


def cadence(rng: np.random.Generator, n: int) -> np.ndarray:
    """n printed fractions of the run: regular, jittered, random, denser early, or a cadence that changes at a
    point of the run (printing every 10 steps, then every 50)."""
    how = rng.integers(0, 4)
    if how == 0:
        u = (np.arange(1, n + 1) + rng.uniform(-0.3, 0.3, n) * (rng.random() < 0.5)) / n
    elif how == 1:
        u = np.sort(rng.uniform(0.0, 1.0, n))
    elif how == 2:
        u = np.sort(rng.uniform(0.0, 1.0, n) ** rng.uniform(1.0, 2.5))
    else:
        edge, ratio = rng.uniform(0.1, 0.8), _loguniform(rng, 0.1, 10.0)  # points per unit of run after / before
        before = max(2, round(n * edge / (edge + ratio * (1 - edge))))
        u = np.concatenate([np.linspace(0.0, edge, before + 1)[1:], np.linspace(edge, 1.0, max(n - before, 1) + 1)[1:]])
    return np.clip(u, 1e-4, 1.0)


def timeline(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(run fraction, step, time since start) of n printed points (`cadence`); a pace that changes once to
    thrice, after a start-up."""
    u = cadence(rng, n)
    steps = np.maximum(np.round(u * _loguniform(rng, 100.0, 1e5)), 1.0)
    keep = np.concatenate([[True], np.diff(steps) > 0])
    u, steps = u[keep], steps[keep]
    speed = np.ones_like(u)
    for edge in rng.uniform(0.0, 1.0, size=rng.integers(0, 4)):
        speed = np.where(u >= edge, speed * _loguniform(rng, 0.4, 2.5), speed)
    du = np.diff(np.concatenate([[0.0], u]))
    total = _loguniform(rng, 5.0, 1e4)
    startup = _loguniform(rng, 1e-3, 0.3) * total if rng.random() < 0.6 else 0.0
    ts = startup + total * np.cumsum(du / speed)
    return u, steps, ts


def goal_and_hit(rng: np.random.Generator, u: np.ndarray, clean: np.ndarray, printed: np.ndarray) -> tuple[float, int]:
    """The target (lower is better) and the index of the first printed point at or below it (len: never)."""
    draw = rng.random()
    tail = slice(int(len(clean) * 0.7), None)
    jitter = float(np.std(printed[tail] - clean[tail]))
    if draw < UNREACHABLE:
        goal = float(np.min(clean)) * rng.uniform(0.2, 0.9) - 3 * float(np.std(np.diff(printed)))
    elif draw < UNREACHABLE + NOISY_PLATEAU and np.ptp(clean[tail]) < jitter:
        # just below a plateau the clean curve has reached (still falling, it would meet the target after the run
        # ended, which is no "never"): the noise's excursions meet it, or nothing does
        goal = float(np.min(clean[tail])) - rng.uniform(0.0, 2.5) * jitter
    else:
        at = int(np.searchsorted(u, rng.uniform(0.15, 1.0)))
        window = printed[max(0, at - 2) : at + 3]
        goal = float(np.quantile(window, 0.5 if rng.random() < 0.7 else rng.uniform(0.0, 0.5)))
    below = printed <= goal
    return goal, int(np.argmax(below)) if below.any() else len(printed)


def sample(rng: np.random.Generator, *, cuts: int = 4) -> list[Sample]:
    """Up to `cuts` synthetic jobs (one curve, one target, several moments) in either mode."""
    n = int(rng.integers(20, 201)) if rng.random() < 0.8 else round(_loguniform(rng, 8.0, 600.0))
    u, steps, ts = timeline(rng, n)
    mode = "max" if rng.random() < 0.3 else "min"
    oriented = clean_curve(rng, u)
    scale = _loguniform(rng, 0.02, 20.0) if mode == "min" else rng.uniform(0.3, 0.97)
    printed = printed_series(rng, oriented * scale, mode=mode)
    if mode == "max":  # an error rate: its accuracy is printed in [0, 1], often in steps of one example
        printed = np.clip(printed, 0.0, 1.0)
        printed = quantised(rng, printed) if rng.random() < 0.4 else printed
    goal, hit = goal_and_hit(rng, u, oriented * scale, printed)
    if hit < 3:
        return []
    truth = float(ts[hit]) if hit < len(printed) else math.inf
    end = truth if math.isfinite(truth) else float(ts[-1])
    values = 1.0 - printed if mode == "max" else printed
    target = 1.0 - goal if mode == "max" else goal
    with_steps = rng.random() < 0.6
    out = []
    for _ in range(cuts):
        elapsed = end * (rng.uniform(0.03, 0.99) if rng.random() < 0.7 else _loguniform(rng, 0.02, 1.0))
        seen = int(np.searchsorted(ts, elapsed, side="right"))
        if seen < 2 or seen > hit:
            continue
        out.append(
            Sample(ts[:seen], steps[:seen] if with_steps else None, values[:seen], target, mode, float(elapsed), truth)
        )
    return out
