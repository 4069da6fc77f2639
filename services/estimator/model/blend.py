"""Blend history and live estimates by fraction of the run seen; calibrated 10-90% bands.

A calibration table maps (benchmark or "*", fraction bucket) to component weights, a bias
(median log(true / blended total duration)) and the 10% and 90% quantiles of that log ratio
around the bias, all learned out-of-fold.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

# "curve_loose": the curve when its families disagree on the crossing (online.CURVE_LOOSE_SPREAD).
# "median_rate": the history's median work over the live rate, not conditioned on the progress passed: the
# baseline the issue names ("median work / live throughput"); each cell is shrunk toward it (`lam`).
BASELINE = "median_rate"
# "eval_units": an unseen benchmark's work in multiples of its own first evaluation's (evalunits.py) over the rate.
EVAL_UNITS = "eval_units"
# "curve_prior": an unseen benchmark's total read off its own metric curve by the learned curve prior (curveprior/).
CURVE_PRIOR = "curve_prior"
COMPONENTS = ("history", "throughput", "curve", "curve_loose", BASELINE, EVAL_UNITS, CURVE_PRIOR)
# Shrinkage toward the baseline a cell may take, chosen by cross-fitting on the calibration samples.
SHRINK_STEPS = (0.0, 0.25, 0.5, 0.75, 1.0)
# What a cell is shrunk toward: the baseline; on a benchmark never trained on (no history work, so no
# baseline) its own curve, tight or loose, whichever the job has, else its work in its own evaluations' units.
ANCHORS = (BASELINE,)
OWN_POOL_ANCHORS = ("curve", "curve_loose", EVAL_UNITS)
# Fraction-of-run buckets: estimates change character fast early on, and again near the end, where the
# fraction is capped at 1 and a run past what its kind needs reads as done: one bucket from 0.8 to 1 gave runs
# at 0.83 the bias of those at 0.99 (on v3.1 held-out submitters, rnnt at 80% of a run came out 33% long).
BUCKET_EDGES = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97)
# A table keeps the edges it was fitted with; one saved without them was fitted with these.
LEGACY_EDGES = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8)
EDGES_KEY = "#edges"
MIN_SAMPLES = 12  # fewer calibration points than this fall back to the "*" key
# A log-variance floor keeps one lucky component from taking every weight.
VAR_FLOOR = 1e-4
DEFAULT_Q = (-0.35, 0.35)
# Uncalibrated band of an own-pool key (a benchmark never trained on, no held-out benchmarks to learn from).
DEFAULT_Q_UNSEEN = (-1.0, 1.0)
# Correlations of component errors are kept below this: a near-singular covariance would give wild weights.
MAX_CORRELATION = 0.95
# Robust: centred log errors are clipped at this many robust standard deviations before correlating.
CLIP_SD = 3.0


# Keys in angle brackets (the history's "<unseen>") are pools of their own: their samples come from benchmarks
# held out of the model, which say nothing of the seen ones in "*", and their weights are not shrunk toward "*".
def own_pool(key: str) -> bool:
    """Whether `key` is a pool of its own (`<unseen>`), not a benchmark shrunk toward "*"."""
    return key.startswith("<")


def bucket(fraction: float, edges: Sequence[float] = BUCKET_EDGES) -> int:
    """Index of the fraction-of-run bucket."""
    return bisect.bisect_right(edges, max(0.0, fraction))


def default_weights(fraction: float, available: set[str], *, unseen: bool = False) -> dict[str, float]:
    """Uncalibrated weights: trust history early, the live throughput later; on an unseen benchmark the
    history's work is a guess, so its own curve leads."""
    live = min(1.0, fraction / 0.2)
    raw = {"history": 1.0 - 0.8 * live, "throughput": 0.8 * live + 0.1, "curve": 0.3 * live, "curve_loose": 0.1 * live}
    if unseen:
        raw = {"history": 0.1, "throughput": 0.1, "curve": 1.0, "curve_loose": 0.5, EVAL_UNITS: 0.7}
    return _normalise({k: v for k, v in raw.items() if k in available})


def _normalise(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items()} if total > 0 else {}


class Blended(NamedTuple):
    """A blend's total, 10-90% band and method, and the combination of components it weighed (its key in an
    own-pool cell's "sbias")."""

    total: float
    low: float
    high: float
    method: str
    subset: str


def blend(
    components: Mapping[str, float | None], *, fraction: float, key: str, table: dict | None
) -> tuple[float, float, float, str]:
    """(total, low, high, method) from total-duration components (seconds)."""
    total, low, high, method, _ = blend_subset(components, fraction=fraction, key=key, table=table)
    return total, low, high, method


def blend_subset(components: Mapping[str, float | None], *, fraction: float, key: str, table: dict | None) -> Blended:
    """`blend`, with the combination of components it weighed: what fitting the table needs of each row."""
    cell = find_cell(table, key, fraction)
    if cell is not None and "ws" not in cell and components.get("curve_loose") is not None:
        # A table fitted before the loose curve was calibrated apart knows every curve as "curve".
        components = {**components, "curve": components["curve_loose"], "curve_loose": None}
    available = {k for k, v in components.items() if v is not None and v > 0 and math.isfinite(v)}
    if not available:
        return Blended(math.nan, math.nan, math.nan, "none", "")
    available -= implausible(components, available, cell, key=key)
    subset = _subset_key(available & set(cell.get("cbias", {}) if cell is not None else ()))
    bias, (q_lo, q_hi) = _bias_band(cell, subset, key=key)
    # Per-benchmark weights overfit the few submitters behind them: they are shrunk halfway
    # to the weights pooled over every benchmark. Biases and bands stay per benchmark.
    pooled = find_cell(table, "*", fraction)
    weights = None
    if cell is not None and own_pool(key):
        weights = _cell_weights(cell, available)
    elif pooled is not None and cell is not None:
        own, pool = _cell_weights(cell, available), _cell_weights(pooled, available)
        weights = _normalise({k: 0.5 * own.get(k, 0.0) + 0.5 * pool.get(k, 0.0) for k in available})
    if not weights:
        weights = default_weights(fraction, available, unseen=own_pool(key))
    biases = cell.get("cbias", {}) if cell is not None else {}
    if cell is not None and cell.get("lam", 0.0) > 0:
        weights = _shrunk(weights, cell["lam"], anchor(available, biases, key=key))
    present = {k: v for k, v in components.items() if v is not None}  # every weighted one is `available`
    log_total = sum(w * (math.log(present[k]) - biases.get(k, 0.0)) for k, w in weights.items())
    total = math.exp(log_total + bias)
    method = "+".join(k for k, _ in sorted(weights.items(), key=lambda kv: -kv[1]) if weights[k] >= 0.05)
    return Blended(total, total * math.exp(q_lo), total * math.exp(q_hi), method, subset)


def _bias_band(cell: dict | None, subset: str, *, key: str) -> tuple[float, tuple[float, float]]:
    """The cell's remaining bias and 10/90% band; in an own pool, those of the combination of components at hand
    (`subset`) when the cell has them ("sbias"): a component a few rows have (evaluation units) must not move the
    others'."""
    if cell is None:
        return 0.0, DEFAULT_Q_UNSEEN if own_pool(key) else DEFAULT_Q
    own = cell.get("sbias", {}).get(subset) if own_pool(key) else None
    if own is not None:
        return float(own[0]), (float(own[1]), float(own[2]))
    q_lo, q_hi = cell["q"]
    return cell.get("bias", 0.0), (q_lo, q_hi)


def implausible(components: Mapping[str, float | None], available: set[str], cell: dict | None, *, key: str) -> set:
    """Components of an own-pool estimate (a benchmark never trained on) too far from the job's own anchor to blend.

    A cell's weights were fitted on errors clipped at CLIP_SD robust standard deviations of each component
    (`cscale`): a component whose debiased log distance to the anchor (its own curve, else its evaluations' units)
    exceeds CLIP_SD times the two components' scales together is a guess the fit never saw and the job's own
    evidence contradicts (a history trained on other benchmarks, hundreds of times off); no weight stands for it.
    Cells saved without `cscale` keep every component."""
    scales = cell.get("cscale") if cell is not None and own_pool(key) else None
    if not scales:
        return set()
    biases = cell.get("cbias", {}) if cell is not None else {}
    name = anchor(available, biases, key=key)
    if name is None or name not in scales:
        return set()
    logs = {k: math.log(v) - biases.get(k, 0.0) for k, v in components.items() if k in available and v is not None}
    return {
        k
        for k in logs
        if k != name and k in scales and abs(logs[k] - logs[name]) > CLIP_SD * (scales[k] + scales[name])
    }


def anchor(available: set[str], biases: dict, *, key: str) -> str | None:
    """The component a cell of `key` is shrunk toward, when the job has it and the cell calibrated it."""
    names = OWN_POOL_ANCHORS if own_pool(key) else ANCHORS
    return next((n for n in names if n in available and n in biases), None)


def _shrunk(weights: dict[str, float], lam: float, name: str | None) -> dict[str, float]:
    """The weights moved a share `lam` of the way to component `name` alone."""
    if name is None:
        return weights
    out = {k: (1 - lam) * w for k, w in weights.items()}
    out[name] = out.get(name, 0.0) + lam
    return out


def _cell_weights(cell: dict, available: set[str]) -> dict[str, float]:
    """The cell's weights for the components at hand: its minimum-variance ones for that subset when it has
    them (tables fitted before they existed have only one set, renormalised)."""
    subset = cell.get("ws", {}).get(_subset_key(available & set(cell.get("cbias", {}))))
    if subset is not None:
        return dict(subset)
    return _normalise({k: cell["w"].get(k, 0.0) for k in available})


def _subset_key(names: Iterable[str]) -> str:
    return "+".join(sorted(names))


def find_cell(table: dict | None, key: str, fraction: float) -> dict | None:
    if not table:
        return None
    b = str(bucket(fraction, table.get(EDGES_KEY, LEGACY_EDGES)))
    for k in (key,) if own_pool(key) else (key, "*"):
        cell = table.get(k, {}).get(b)
        if cell is not None:
            return cell
    return None


def group_samples(samples: list[dict]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in samples:
        for key in (s["key"],) if own_pool(s["key"]) else (s["key"], "*"):
            groups.setdefault((key, str(bucket(s["fraction"]))), []).append(s)
    return groups


def fit_weights(groups: dict[tuple[str, str], list[dict]]) -> dict:
    """Per cell: each component's bias, its weights for every subset of components; no shrinkage, no band."""
    table: dict[str, Any] = {}  # cells by key, and the bucket edges under EDGES_KEY
    for (key, b), rows in groups.items():
        if len(rows) < MIN_SAMPLES:
            continue
        weights, biases, scales, centred = {}, {}, {}, {}
        for name in COMPONENTS:
            errs = np.array(
                [math.log(r["components"][name] / r["truth"]) if r["components"].get(name) else np.nan for r in rows]
            )
            present = errs[np.isfinite(errs)]
            # A component seen in few of the cell's rows (a loose curve) still gets its own figures when
            # there are enough of them; weights come from its covariance with the others.
            if len(present) >= max(MIN_SAMPLES, len(rows) // 8):
                # Each component's systematic error (e.g. eval phases that slow the end of a
                # run) is removed first; the weight is its robust inverse variance around that.
                biases[name] = float(np.median(present))
                scales[name] = 1.4826 * float(np.median(np.abs(present - biases[name])))
                weights[name] = 1.0 / (scales[name] ** 2 + VAR_FLOOR)
                sd = max(scales[name], math.sqrt(VAR_FLOOR))
                centred[name] = np.clip(errs - biases[name], -CLIP_SD * sd, CLIP_SD * sd)
        table.setdefault(key, {})[b] = {
            "w": _normalise(weights),
            "cbias": biases,
            "cscale": {k: max(v, math.sqrt(VAR_FLOOR)) for k, v in scales.items()},
            "ws": subset_weights(scales, centred),
            "q": DEFAULT_Q,
            "bias": 0.0,
        }
    table[EDGES_KEY] = list(BUCKET_EDGES)
    return table


def subset_weights(scales: dict[str, float], centred: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Minimum-variance weights (non-negative, summing to one) of every subset of the components.

    Component errors are correlated (the throughput and the history share the history's work), so
    inverse variances alone over-weigh a second opinion that repeats the first one's error. The
    covariance is the robust scales with the correlation of the clipped centred errors of the rows
    where both components exist."""
    names = sorted(scales)
    cov = np.diag([scales[n] ** 2 + VAR_FLOOR for n in names])
    for i, j in itertools.combinations(range(len(names)), 2):
        a, b = centred[names[i]], centred[names[j]]
        both = np.isfinite(a) & np.isfinite(b)
        if both.sum() < MIN_SAMPLES:
            continue
        a, b = a[both], b[both]
        denom = math.sqrt(float(np.mean(a * a) * np.mean(b * b)))
        if denom > 0:
            r = float(np.clip(np.mean(a * b) / denom, -MAX_CORRELATION, MAX_CORRELATION))
            cov[i, j] = cov[j, i] = r * math.sqrt(cov[i, i] * cov[j, j])
    out = {}
    for size in range(1, len(names) + 1):
        for subset in itertools.combinations(range(len(names)), size):
            out[_subset_key(names[i] for i in subset)] = _min_variance(cov, names, subset)
    return out


def _min_variance(cov: np.ndarray, names: list[str], subset: tuple[int, ...]) -> dict[str, float]:
    """Weights minimising w' C w on `subset` with w >= 0, sum 1 (every face tried: three components at most)."""
    best, best_var = None, math.inf
    for size in range(1, len(subset) + 1):
        for face in itertools.combinations(subset, size):
            sub = cov[np.ix_(face, face)]
            try:
                w = np.linalg.solve(sub, np.ones(len(face)))
            except np.linalg.LinAlgError:
                continue
            if w.sum() <= 0:
                continue
            w = w / w.sum()
            var = float(w @ sub @ w)
            if np.all(w >= 0) and var < best_var:
                best, best_var = dict(zip((names[i] for i in face), w.tolist())), var
    return {k: float(v) for k, v in best.items()} if best else {}
