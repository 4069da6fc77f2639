"""Fitting the blend's calibration table (`fit_table`), and how far each cell is shrunk toward one component
(`blend.ANCHORS`), by cross-fitting.

The covariance weights of a cell are fitted and judged on the same calibration samples; nothing there says
whether they beat the plain baseline on runs they were not fitted on. Here the samples are split in two by
run; weights and biases fitted on one half blend the other, for each shrinkage step, and the step with the
fewest misses (log error beyond ±20%) over both halves wins, a tie going to the baseline.
"""

from __future__ import annotations

import math
import zlib
from typing import NamedTuple

import numpy as np

from services.estimator.model import blend as B

# log(truth / estimate) within these bounds is an estimate within ±20% of the truth.
HIT = (math.log(1 / 1.2), math.log(1 / 0.8))
# Fewer held-out rows than this in a cell (both halves together) keep the cell's own weights (lam 0).
MIN_HELD = 40
# Rows a combination of components needs in an own-pool cell for a bias and band of its own (else the cell's).
MIN_SUBSET_ROWS = 2 * B.MIN_SAMPLES


def fit_table(samples: list[dict], *, q_low: float = 0.10, q_high: float = 0.90) -> dict:
    """Learn weights and band quantiles from out-of-fold samples.

    Each sample: {"key", "fraction", "truth", "components": {name: total seconds}, "run" (optional)}.
    Weights are minimum-variance under the components' error covariance, shrunk toward the baseline
    as far as cross-fitting says it does not hurt (`lam`); the band quantiles are those of
    log(truth / blended) in the same cell (split-conformal style).
    """
    groups = B.group_samples(samples)
    table = B.fit_weights(groups)
    for (key, b), lam in choose_shrinkage(samples, table).items():
        table[key][b]["lam"] = lam
    for (key, b), rows in groups.items():
        cell = table.get(key, {}).get(b)
        if cell is None:
            continue
        resid, subsets = [], []
        for r in rows:
            done = B.blend_subset(r["components"], fraction=r["fraction"], key=key, table=table)
            if math.isfinite(done.total):
                resid.append(math.log(r["truth"] / done.total))
                subsets.append(done.subset)
        if len(resid) >= B.MIN_SAMPLES:
            # What bias is left after blending is removed too; the band is the spread around it.
            cell["bias"], cell["q"] = _bias_band(resid, q_low, q_high)
            if B.own_pool(key):
                cell["sbias"] = _subset_bias_bands(resid, subsets, q_low, q_high)
    return table


def _bias_band(resid: list[float], q_low: float, q_high: float) -> tuple[float, tuple[float, float]]:
    """Median of the log residuals and the 10/90% quantiles around it."""
    bias = float(np.median(resid))
    q = np.quantile(np.asarray(resid) - bias, [q_low, q_high])
    return bias, (float(q[0]), float(q[1]))


def _subset_bias_bands(resid: list[float], subsets: list[str], q_low: float, q_high: float) -> dict:
    """[bias, q_low, q_high] of each combination of components with enough rows of its own (an own pool's cell:
    the combinations there differ by factors, and one shared bias moved every row when a component joined)."""
    by: dict[str, list[float]] = {}
    for res, subset in zip(resid, subsets):
        by.setdefault(subset, []).append(res)
    out = {}
    for subset, values in by.items():
        if len(values) >= MIN_SUBSET_ROWS:
            bias, (lo, hi) = _bias_band(values, q_low, q_high)
            out[subset] = [bias, lo, hi]
    return out


def _half(sample: dict) -> int:
    # A sample of a benchmark held out of the history model ("group": its benchmark) is split by benchmark:
    # what an unseen benchmark's estimate looks like is judged on benchmarks the weights never saw.
    return zlib.crc32(repr(sample.get("group", sample.get("run", sample["truth"]))).encode()) % 2


def choose_shrinkage(samples: list[dict], table: dict) -> dict[tuple[str, str], float]:
    """(key, bucket) -> share of the way to the cell's anchor alone, for every cell of `table`.

    Each trial is judged as it would be served: the remaining bias fitted on one half is the cell's, and in an
    own pool that of each combination of components with MIN_SUBSET_ROWS rows (`_subset_bias_bands`)."""
    losses: dict[tuple[str, str], np.ndarray] = {}
    counts: dict[tuple[str, str], int] = {}
    steps = np.asarray(B.SHRINK_STEPS)
    for half in (0, 1):
        fit = [s for s in samples if _half(s) != half]
        held = [s for s in samples if _half(s) == half]
        fit_groups, held_groups = B.group_samples(fit), B.group_samples(held)
        part = B.fit_weights(fit_groups)
        for cell_key, held_rows in held_groups.items():
            if cell_key not in fit_groups:
                continue
            key = cell_key[0]
            fitted, judged = _logs(fit_groups[cell_key], key, part), _logs(held_rows, key, part)
            if len(fitted.truth) < B.MIN_SAMPLES or not len(judged.truth):
                continue
            loss = np.zeros(len(steps))
            for i, lam in enumerate(steps):
                bias = _trial_bias(fitted.truth - fitted.mix(lam), fitted.subsets, judged.subsets, B.own_pool(key))
                resid = judged.truth - judged.mix(lam) - bias
                loss[i] = float(np.sum((resid < HIT[0]) | (resid > HIT[1])))
            losses[cell_key] = losses.get(cell_key, 0.0) + loss
            counts[cell_key] = counts.get(cell_key, 0) + len(judged.truth)
    out = {}
    for key, cells in table.items():
        if key == B.EDGES_KEY:
            continue
        for b in cells:
            cell_loss = losses.get((key, b))
            if cell_loss is None or counts[(key, b)] < MIN_HELD:
                out[(key, b)] = 0.0
                continue
            best = float(cell_loss.min())
            out[(key, b)] = float(max(lam for lam, v in zip(steps, cell_loss) if v <= best))
    return out


def _trial_bias(resid: np.ndarray, subsets: list[str], held: list[str], per_subset: bool) -> np.ndarray | float:
    """The remaining bias a trial serves each held-out row: the median residual of the fitted half, per combination
    of components with enough rows of its own in an own pool (as `fit_table` serves them)."""
    bias = float(np.median(resid))
    if not per_subset:
        return bias
    by: dict[str, list[float]] = {s: [] for s in set(subsets)}
    for value, s in zip(resid, subsets):
        by[s].append(value)
    own = {s: float(np.median(v)) for s, v in by.items() if len(v) >= MIN_SUBSET_ROWS}
    return np.asarray([own.get(s, bias) for s in held])


class _Logs(NamedTuple):
    """Per row a cell can estimate: log blended total (no shrinkage, no cell bias), log calibrated anchor (the
    blend where the row has none), log truth, and the combination of components blended."""

    blended: np.ndarray
    anchor: np.ndarray
    truth: np.ndarray
    subsets: list[str]

    def mix(self, lam: float) -> np.ndarray:
        return (1 - lam) * self.blended + lam * self.anchor


def _logs(rows: list[dict], key: str, table: dict) -> _Logs:
    lb, la, t, subsets = [], [], [], []
    for r in rows:
        done = B.blend_subset(r["components"], fraction=r["fraction"], key=key, table=table)
        if not math.isfinite(done.total):
            continue
        cell = B.find_cell(table, key, r["fraction"])
        cbias = cell.get("cbias", {}) if cell is not None else {}
        available = {k for k, v in r["components"].items() if v is not None and v > 0 and math.isfinite(v)}
        name = B.anchor(available, cbias, key=key)
        lb.append(math.log(done.total))
        la.append(math.log(r["components"][name]) - cbias[name] if name else math.log(done.total))
        t.append(math.log(r["truth"]))
        subsets.append(done.subset)
    return _Logs(np.asarray(lb), np.asarray(la), np.asarray(t), subsets)
