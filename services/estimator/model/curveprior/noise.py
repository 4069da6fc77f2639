"""What a training script prints of its metric (pure numpy, seeded): the clean curve with noise of one model, as
scripts print it.

Noise is Gaussian, heavy-tailed (Student t, 2-5 degrees of freedom: per-batch losses) or multiplicative, white or
autocorrelated (AR(1): a validation loss drifting from one evaluation to the next), and heteroscedastic: its scale
follows the clean value to a power (0: it does not shrink as the loss falls, so a plateau near the target is
crossed by noise; 1: it shrinks with the loss; above 1: faster). One script in three prints a running mean or an
EMA of it; an accuracy on a finite evaluation set is printed in steps of one example.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import lfilter

KINDS = ("gauss", "heavy", "multiplicative")


def _loguniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def innovations(rng: np.random.Generator, n: int, *, kind: str, rho: float = 0.0) -> np.ndarray:
    """Unit-scale noise of `kind`, AR(1) with coefficient `rho` (0: white), stationary variance about 1."""
    if kind == "heavy":
        dof = int(rng.integers(2, 6))
        eps = rng.standard_t(dof, size=n) / math.sqrt(3.0)  # dof 2 has no variance: scaled as dof 3's
    else:
        eps = rng.standard_normal(n)
    if rho <= 0:
        return eps
    return lfilter([math.sqrt(1.0 - rho * rho)], [1.0, -rho], eps)


def heteroscedastic(clean: np.ndarray, *, power: float) -> np.ndarray:
    """The noise's scale along the curve: (clean / clean at the start) to `power` (0: constant)."""
    ref = max(float(clean[0]), 1e-12)
    return (np.maximum(clean, 1e-12) / ref) ** power


def printed_series(rng: np.random.Generator, clean: np.ndarray, *, mode: str) -> np.ndarray:
    """The printed value of the (unnormalised, lower is better for `min`, an error for `max`) clean curve: noise of
    one model, sometimes smoothed by a running mean or an EMA, as scripts print."""
    n = len(clean)
    smoothed = rng.random() < 0.35
    sigma = _loguniform(rng, 0.003, 0.6 if smoothed else 0.3)
    kind = str(rng.choice(KINDS, p=[0.35, 0.3, 0.35]))
    rho = rng.uniform(0.3, 0.95) if rng.random() < 0.25 else 0.0
    eps = innovations(rng, n, kind=kind, rho=rho)
    if kind == "multiplicative" and mode == "min":
        return _smooth(rng, clean * np.exp(sigma * eps), smoothed)
    power = rng.uniform(-0.3, 1.5) if mode == "min" else rng.uniform(0.0, 1.0)
    level = float(clean[0]) if mode == "min" else 0.1
    noisy = clean + sigma * level * heteroscedastic(clean, power=power) * eps
    return _smooth(rng, noisy, smoothed)


def _smooth(rng: np.random.Generator, noisy: np.ndarray, smoothed: bool) -> np.ndarray:
    if not smoothed:
        return noisy
    if rng.random() < 0.5:
        return running_mean(noisy, int(rng.integers(2, 21)))
    return ema(noisy, rng.uniform(0.5, 0.98))


def quantised(rng: np.random.Generator, accuracy: np.ndarray) -> np.ndarray:
    """An accuracy on an evaluation set of 50 to 5,000 examples: a multiple of one example."""
    size = round(_loguniform(rng, 50.0, 5000.0))
    return np.round(accuracy * size) / size


def running_mean(values: np.ndarray, k: int) -> np.ndarray:
    """The mean of the last k values (fewer at the start)."""
    total = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(1, len(values) + 1)
    low = np.maximum(index - k, 0)
    return (total[index] - total[low]) / (index - low)


def ema(values: np.ndarray, beta: float) -> np.ndarray:
    """The exponential moving average a script prints, started at the first value."""
    out, _ = lfilter([1.0 - beta], [1.0, -beta], values, zi=[beta * values[0]])
    return np.asarray(out)
