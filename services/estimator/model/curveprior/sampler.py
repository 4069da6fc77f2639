"""Synthetic learning curves for the prior's pre-training (pure numpy, seeded; never reads a recorded run).

A curve is a shape of Domhan et al.'s families (pow3/pow4, exponential, log-power/MMF, Janoschek/Weibull, ilog2)
or a mixture of two, run along an effective progress that a learning-rate schedule (constant, warm-up, step
decay, cosine) drives, sometimes after a flat start; a schedule's high rate also holds the loss up (a step decay
drops it). It is printed at irregular steps, timed by a pace that changes, after a start-up; the printed value
carries Gaussian, heavy-tailed or multiplicative noise, and one script in three prints a running mean or an EMA.
Losses (mode min) fall toward 0, accuracies (mode max) rise toward 1. The target is the level the printed series
had reached at some point of the run (sometimes below its median there: a plateau crossed by noise alone), or,
one case in eight, beyond what the curve ever reaches. The truth is the first crossing of the noisy *printed*
series: a target met only by noise on a plateau is a first-passage time, and the network learns it as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FINE = 512  # points of the schedule's integral
UNREACHABLE = 0.12  # share of cases whose target the curve never meets


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


def schedule(rng: np.random.Generator, u: np.ndarray) -> np.ndarray:
    """The learning rate over the run's fraction u (max 1): constant, warm-up, step decay, cosine or both."""
    kind = rng.choice(["constant", "warmup", "step", "cosine", "warmup-cosine"], p=[0.35, 0.15, 0.2, 0.2, 0.1])
    lr = np.ones_like(u)
    if kind in ("step",):
        for edge in np.sort(rng.uniform(0.2, 0.9, size=rng.integers(1, 4))):
            lr = np.where(u >= edge, lr * _loguniform(rng, 0.05, 0.5), lr)
    if kind in ("cosine", "warmup-cosine"):
        lr = 0.5 * (1 + np.cos(math.pi * u)) + 1e-3
    if kind in ("warmup", "warmup-cosine"):
        lr = lr * np.minimum(1.0, u / rng.uniform(0.02, 0.2))
    return np.maximum(lr, 1e-4)


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
    plateau = _loguniform(rng, 1e-3, 0.9)
    excess = _loguniform(rng, 0.01, 0.3) * lr if rng.random() < 0.5 else 0.0  # a high rate holds the loss up
    return plateau + (1 - plateau) * s + excess * (1 - plateau)


def printed_series(rng: np.random.Generator, clean: np.ndarray, *, mode: str) -> np.ndarray:
    """The printed value: noise of one model, sometimes smoothed by a running mean or an EMA, as scripts print."""
    n = len(clean)
    smoothed = rng.random() < 0.35
    sigma = _loguniform(rng, 0.003, 0.6 if smoothed else 0.25)
    kind = rng.choice(["gauss", "heavy", "multiplicative"], p=[0.35, 0.25, 0.4])
    eps = rng.standard_t(3, size=n) / math.sqrt(3) if kind == "heavy" else rng.standard_normal(n)
    if kind == "multiplicative" and mode == "min":
        noisy = clean * np.exp(sigma * eps)
    else:  # additive, scaled by the way the curve travels (an accuracy's noise does not shrink with its error)
        noisy = clean + sigma * eps * (clean if mode == "min" else 0.1)
    if smoothed:
        noisy = (
            _running_mean(noisy, int(rng.integers(2, 21)))
            if rng.random() < 0.5
            else _ema(noisy, rng.uniform(0.5, 0.98))
        )
    return noisy


def _running_mean(values: np.ndarray, k: int) -> np.ndarray:
    """The mean of the last k values (fewer at the start)."""
    total = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(1, len(values) + 1)
    low = np.maximum(index - k, 0)
    return (total[index] - total[low]) / (index - low)


def _ema(values: np.ndarray, beta: float) -> np.ndarray:
    out = np.empty_like(values)
    acc = values[0]
    for i, v in enumerate(values):
        acc = beta * acc + (1 - beta) * v
        out[i] = acc
    return out


def timeline(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(run fraction, step, time since start) of n printed points: regular, jittered, random or denser early;
    a pace that changes once to thrice, after a start-up."""
    how = rng.integers(0, 3)
    if how == 0:
        u = (np.arange(1, n + 1) + rng.uniform(-0.3, 0.3, n) * (rng.random() < 0.5)) / n
    elif how == 1:
        u = np.sort(rng.uniform(0.0, 1.0, n))
    else:
        u = np.sort(rng.uniform(0.0, 1.0, n) ** rng.uniform(1.0, 2.5))
    u = np.clip(u, 1e-4, 1.0)
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


def sample(rng: np.random.Generator, *, cuts: int = 4) -> list[Sample]:
    """Up to `cuts` synthetic jobs (one curve, one target, several moments) in either mode."""
    n = int(rng.integers(20, 201))
    u, steps, ts = timeline(rng, n)
    mode = "max" if rng.random() < 0.3 else "min"
    oriented = clean_curve(rng, u)
    scale = _loguniform(rng, 0.02, 20.0) if mode == "min" else rng.uniform(0.3, 0.97)
    printed = printed_series(rng, oriented * scale, mode=mode)
    if mode == "max":
        printed = np.clip(printed, 0.0, 1.0)
    if rng.random() < UNREACHABLE:
        goal = float(np.min(oriented) * scale) * rng.uniform(0.2, 0.9) - 3 * float(np.std(np.diff(printed)))
        hit = len(printed) if goal < np.min(printed) else int(np.argmax(printed <= goal))
    else:
        at = int(np.searchsorted(u, rng.uniform(0.15, 1.0)))
        window = printed[max(0, at - 2) : at + 3]
        goal = float(np.quantile(window, 0.5 if rng.random() < 0.7 else rng.uniform(0.0, 0.5)))
        hit = int(np.argmax(printed <= goal))
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
