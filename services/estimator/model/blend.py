"""Blend history and live estimates by fraction of the run seen; calibrated 10-90% bands.

A calibration table maps (benchmark or "*", fraction bucket) to component weights, a bias
(median log(true / blended total duration)) and the 10% and 90% quantiles of that log ratio
around the bias, all learned out-of-fold.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

COMPONENTS = ("history", "throughput", "curve")
# Fraction-of-run buckets: estimates change character fast early on, slowly later.
BUCKET_EDGES = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8)
MIN_SAMPLES = 12  # fewer calibration points than this fall back to the "*" key
# A log-variance floor keeps one lucky component from taking every weight.
VAR_FLOOR = 1e-4
DEFAULT_Q = (-0.35, 0.35)
# Uncalibrated band of an own-pool key (a benchmark never trained on, no held-out benchmarks to learn from).
DEFAULT_Q_UNSEEN = (-1.0, 1.0)


# Keys in angle brackets (the history's "<unseen>") are pools of their own: their samples come from benchmarks
# held out of the model, which say nothing of the seen ones in "*", and their weights are not shrunk toward "*".
def _own_pool(key: str) -> bool:
    return key.startswith("<")


def bucket(fraction: float) -> int:
    """Index of the fraction-of-run bucket."""
    return bisect.bisect_right(BUCKET_EDGES, max(0.0, fraction))


def default_weights(fraction: float, available: set[str], *, unseen: bool = False) -> dict[str, float]:
    """Uncalibrated weights: trust history early, the live throughput later; on an unseen benchmark the
    history's work is a guess, so its own curve leads."""
    live = min(1.0, fraction / 0.2)
    raw = {"history": 1.0 - 0.8 * live, "throughput": 0.8 * live + 0.1, "curve": 0.3 * live}
    if unseen:
        raw = {"history": 0.1, "throughput": 0.1, "curve": 1.0}
    return _normalise({k: v for k, v in raw.items() if k in available})


def _normalise(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items()} if total > 0 else {}


def blend(components: dict[str, float], *, fraction: float, key: str,
          table: dict | None) -> tuple[float, float, float, str]:
    """(total, low, high, method) from total-duration components (seconds)."""
    available = {k for k, v in components.items() if v is not None and v > 0 and math.isfinite(v)}
    if not available:
        return math.nan, math.nan, math.nan, "none"
    cell = _cell(table, key, fraction)
    # Per-benchmark weights overfit the few submitters behind them: they are shrunk halfway
    # to the weights pooled over every benchmark. Biases and bands stay per benchmark.
    pooled = _cell(table, "*", fraction)
    weights = None
    if cell is not None and _own_pool(key):
        weights = _normalise({k: cell["w"].get(k, 0.0) for k in available})
    elif pooled is not None and cell is not None:
        mixed = {k: 0.5 * cell["w"].get(k, 0.0) + 0.5 * pooled["w"].get(k, 0.0) for k in available}
        weights = _normalise(mixed)
    if not weights:
        weights = default_weights(fraction, available, unseen=_own_pool(key))
    biases = cell.get("cbias", {}) if cell is not None else {}
    log_total = sum(w * (math.log(components[k]) - biases.get(k, 0.0)) for k, w in weights.items())
    q_lo, q_hi = cell["q"] if cell is not None else DEFAULT_Q_UNSEEN if _own_pool(key) else DEFAULT_Q
    total = math.exp(log_total + (cell.get("bias", 0.0) if cell is not None else 0.0))
    method = "+".join(k for k, _ in sorted(weights.items(), key=lambda kv: -kv[1]) if weights[k] >= 0.05)
    return total, total * math.exp(q_lo), total * math.exp(q_hi), method


def _cell(table: dict | None, key: str, fraction: float) -> dict | None:
    if not table:
        return None
    b = str(bucket(fraction))
    for k in (key,) if _own_pool(key) else (key, "*"):
        cell = table.get(k, {}).get(b)
        if cell is not None:
            return cell
    return None


def fit_table(samples: list[dict], *, q_low: float = 0.10, q_high: float = 0.90) -> dict:
    """Learn weights and band quantiles from out-of-fold samples.

    Each sample: {"key", "fraction", "truth", "components": {name: total seconds}}.
    Weights are inverse mean squared log errors per component; the band quantiles are those
    of log(truth / blended) in the same cell (split-conformal style).
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in samples:
        for key in (s["key"],) if _own_pool(s["key"]) else (s["key"], "*"):
            groups.setdefault((key, str(bucket(s["fraction"]))), []).append(s)
    table: dict[str, dict] = {}
    for (key, b), rows in groups.items():
        if len(rows) < MIN_SAMPLES:
            continue
        weights, biases = {}, {}
        for name in COMPONENTS:
            errs = np.array([math.log(r["components"][name] / r["truth"]) for r in rows
                             if r["components"].get(name)])
            if len(errs) >= max(MIN_SAMPLES // 2, len(rows) // 4):
                # Each component's systematic error (e.g. eval phases that slow the end of a
                # run) is removed first; the weight is its robust inverse variance around that.
                biases[name] = float(np.median(errs))
                mad = float(np.median(np.abs(errs - biases[name])))
                weights[name] = 1.0 / ((1.4826 * mad) ** 2 + VAR_FLOOR)
        table.setdefault(key, {})[b] = {"w": _normalise(weights), "cbias": biases,
                                        "q": DEFAULT_Q, "bias": 0.0}
    for (key, b), rows in groups.items():
        cell = table.get(key, {}).get(b)
        if cell is None:
            continue
        resid = []
        for r in rows:
            total, _, _, _ = blend(r["components"], fraction=r["fraction"], key=key, table=table)
            if math.isfinite(total):
                resid.append(math.log(r["truth"] / total))
        if len(resid) >= MIN_SAMPLES:
            # What bias is left after blending is removed too; the band is the spread around it.
            cell["bias"] = float(np.median(resid))
            centred = np.asarray(resid) - cell["bias"]
            cell["q"] = tuple(float(v) for v in np.quantile(centred, [q_low, q_high]))
    return table
