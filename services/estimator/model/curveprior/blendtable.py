"""The learned blend of the curve prior and the fitted curve (pure): a weight between the two readings and a band
sized on runs of families neither reading was fitted on, per phase of the run when bins are given.

Both readings are totals since the start; the blend works in a = log(total / elapsed) (0: finishing now), the
scale on which "within ±20%" is judged: a = w · a_prior + (1 - w) · a_fit, w per bin of the fraction of the run
the two readings' geometric mean says is seen (one bin by default: weights and biases learned per phase on three
families missed more often on the fourth, `docs/estimator.md`). With a `lean` (fifth round of issue 31), w is per
reading: the cell's share, its logit moved by learned coefficients of the fitted curve's doubt (its band's width
over the prior's), of how far ahead the readings put the end and (sixth round) of the curve's `novelty` (how far
the fitted reading lies outside the prior's band: a curve unlike the fit's training families leans on the prior)
(`shares`). The band is [a + low · s,
a + high · s], s the prior's own half-width, the readings' disagreement and the fitted curve's half-width weighed
by the table's `spread` (where the prior is unsure, on a curve unlike what it was fine-tuned on, or the two
disagree, it is wide; a table saved without a spread: the prior's half-width plus half the disagreement):
`low`/`high` are the 10% and 90% quantiles of the out-of-family residuals over s, every family weighing the same
(coverage per family, not pooled), or (`by_cells`, sixth round) the pair that puts the most families' coverage at
each cut inside 75-85% (`bandfit`). A spread's fifth coefficient floors each side of s at that share of the prior's
own width on that side: where the readings agree on a time neither is sure of (early in a run), the band keeps
the prior's doubt. `fit_table` learns it from rows of held-out families (`ownnested`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from services.estimator.model.curveprior import bandfit
from services.estimator.model.curveprior.bandfit import weighted_quantile
from services.estimator.model.curveprior.net import LOG_HORIZON  # a top beyond 50x the time so far: "may never"

TABLE = Path(__file__).with_name("blend.json")
FORMAT_VERSION = 1  # cells [weight, low, high]
EDGES: tuple[float, ...] = ()  # bins of the fraction of the run seen (none: per-phase cells did not carry over)
WEIGHTS = (0.25, 0.375, 0.5, 0.625, 0.75)  # the prior's share tried: neither reading is ever dropped
MIN_SCALE = 0.05  # the band's half-width floor (log units): a band of two sure readings that agree
MIN_ROWS = 60  # a bin with fewer rows takes the cell of all
# The band's scale: (prior's half-width, the two medians' distance, the fitted curve's half-width) coefficients.
SPREAD = (1.0, 0.5, 0.0)  # a table saved without one: the prior's half-width plus half the readings' distance
# What a table is fitted with unless told otherwise (the fourth round's choice over eleven families): three times the
# readings' distance, its quantiles sided. Since the fifth round the served table's form is chosen when it is built,
# leave-one-family-out on the readings it is fitted on (`services.estimator.ownchoice.table_for`).
FIT_SPREAD = (0.0, 3.0, 0.0, 0.0)
WITHIN = 0.2
# The lean: the prior's share per reading, its logit moved by LEAN[0] per e-fold the fitted curve's band is wider
# than the prior's (a fit unsure of itself) and by LEAN[1] per unit of log time the readings put the end beyond
# e times the time so far (a fit extrapolating far). None: one share for every reading, as before. The grid a
# table may choose from when it is fitted with one (`fit_table`'s `leans`); (0, 0) first, so a tie keeps the share.
NO_LEAN = (0.0, 0.0)
LEANS = tuple((doubt, reach) for doubt in (0.0, 0.5, 1.0, 2.0) for reach in (0.0, -0.5, 0.5, -1.0, 1.0))
# Since the sixth round a lean may take a third coefficient: per unit of the curve's novelty (`novelty`: how far the
# two readings lie apart in units of the prior's own half-width, on a log scale), so a curve whose fitted reading
# leaves the prior's band, one unlike what the fit was trained on, can lean on the prior. The grid a table may
# choose it from (`services.estimator.ownchoice`): the reach's coefficients that earned weight, with novelty's.
NOVEL_LEANS = tuple((0.0, reach, novel) for reach in (0.0, -0.5, -1.0) for novel in (0.0, 0.25, 0.5, 1.0, -0.5))


@dataclass(frozen=True)
class Cell:
    """One phase's weight of the prior and band quantiles (in units of the readings' half-width)."""

    weight: float = 0.5
    low: float = -1.0
    high: float = 1.0


@dataclass(frozen=True)
class BlendTable:
    edges: tuple[float, ...]
    cells: tuple[Cell, ...]
    spread: tuple[float, ...] = SPREAD
    lean: tuple[float, ...] = NO_LEAN

    def cell(self, fraction: float) -> Cell:
        if len(self.cells) != len(self.edges) + 1:
            return Cell()
        return self.cells[int(np.searchsorted(self.edges, fraction, side="right"))]


class Reading(NamedTuple):
    """A reading as log(total / elapsed): its median, 10% and 90%."""

    mid: float
    low: float
    high: float


def reading(total: float, low: float, high: float, *, elapsed: float) -> Reading:
    def log_ratio(v: float) -> float:
        return math.log(max(v, elapsed) / elapsed)

    return Reading(log_ratio(total), log_ratio(low), log_ratio(high))


def phase(prior: Reading, fitted: Reading) -> float:
    """The fraction of the run seen, as the two medians' geometric mean says."""
    return math.exp(-(prior.mid + fitted.mid) / 2)


def scale(prior: Reading, fitted: Reading, spread: Sequence[float] = SPREAD) -> float:
    """The band's unit (log units): the prior's half-width, the two medians' distance and the fitted curve's
    half-width, weighed by `spread` (by default the prior's half-width plus half the distance)."""
    own, apart, fit = spread
    return max(
        own * (prior.high - prior.low) / 2 + apart * abs(prior.mid - fitted.mid) + fit * (fitted.high - fitted.low) / 2,
        MIN_SCALE,
    )


def units(
    prior: np.ndarray, fitted: np.ndarray, mid: np.ndarray, spread: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """The band's unit below and above `mid` for rows of readings ((n, 3) arrays of mid, low, high). A spread of
    three: one unit both ways (`scale`). A spread of four, (own, apart, fit, reach), is sided: each side takes the
    readings' own widths on that side, the readings' distance, and `reach` times how far each reading's median lies
    beyond `mid` on that side (the band reaches towards the reading the blend did not follow). A fifth, `floor`:
    each side at least that share of the prior's own width on that side (early in a run, where the two readings
    agree on a time neither is sure of, the band stays as wide as the prior's doubt)."""
    d = np.abs(prior[:, 0] - fitted[:, 0])
    if len(spread) == 3:
        own, apart, fit = spread
        s = np.maximum(
            own * (prior[:, 2] - prior[:, 1]) / 2 + apart * d + fit * (fitted[:, 2] - fitted[:, 1]) / 2, MIN_SCALE
        )
        return s, s
    own, apart, fit, reach, *floor = spread
    down = (
        own * (prior[:, 0] - prior[:, 1])
        + apart * d
        + fit * (fitted[:, 0] - fitted[:, 1])
        + reach * (np.maximum(mid - prior[:, 0], 0) + np.maximum(mid - fitted[:, 0], 0))
    )
    up = (
        own * (prior[:, 2] - prior[:, 0])
        + apart * d
        + fit * (fitted[:, 2] - fitted[:, 0])
        + reach * (np.maximum(prior[:, 0] - mid, 0) + np.maximum(fitted[:, 0] - mid, 0))
    )
    if floor:  # a fifth coefficient: neither side narrower than that share of the prior's own on that side
        down = np.maximum(down, floor[0] * (prior[:, 0] - prior[:, 1]))
        up = np.maximum(up, floor[0] * (prior[:, 2] - prior[:, 0]))
    return np.maximum(down, MIN_SCALE), np.maximum(up, MIN_SCALE)


def phases(prior: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """`phase` of rows of readings ((n, 3) arrays)."""
    return np.exp(-(prior[:, 0] + fitted[:, 0]) / 2)


def novelty(prior: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """How unlike the curves the fitted reading was trained on a curve looks, known when serving: the log of the
    two medians' distance over the prior's own half-width (0: the fit lies at the edge of the prior's band;
    positive: outside it), clipped to [-3, 3]."""
    apart = np.maximum(np.abs(prior[:, 0] - fitted[:, 0]), MIN_SCALE)
    return np.clip(np.log(apart / np.maximum((prior[:, 2] - prior[:, 1]) / 2, MIN_SCALE)), -3.0, 3.0)


def shares(prior: np.ndarray, fitted: np.ndarray, base: float | np.ndarray, lean: Sequence[float]) -> np.ndarray:
    """The prior's share of each row of readings: `base`, its logit moved by the `lean` (`LEANS`, `NOVEL_LEANS`)."""
    if not any(lean):
        return np.broadcast_to(np.asarray(base, float), (len(prior),))
    doubt = np.log(
        np.maximum(fitted[:, 2] - fitted[:, 1], MIN_SCALE) / np.maximum(prior[:, 2] - prior[:, 1], MIN_SCALE)
    )
    reach = np.clip((prior[:, 0] + fitted[:, 0]) / 2, 0.0, LOG_HORIZON) - 1.0
    b = np.clip(np.asarray(base, float), 1e-3, 1 - 1e-3)
    logit = np.log(b / (1 - b)) + lean[0] * np.clip(doubt, -3.0, 3.0) + lean[1] * reach
    if len(lean) > 2 and lean[2]:
        logit = logit + lean[2] * novelty(prior, fitted)
    return 1.0 / (1.0 + np.exp(-logit))


def combine(prior: Reading, fitted: Reading, table: BlendTable) -> Reading:
    """The blended median and 10-90% band, all as log(total / elapsed) (never below 0: not before now)."""
    cell = table.cell(phase(prior, fitted))
    w = float(shares(np.array([prior]), np.array([fitted]), cell.weight, table.lean)[0])
    mid = max(w * prior.mid + (1 - w) * fitted.mid, 0.0)
    down, up = (float(v[0]) for v in units(np.array([prior]), np.array([fitted]), np.array([mid]), table.spread))
    low = mid + cell.low * (down if cell.low < 0 else up)
    high = min(mid + cell.high * (up if cell.high > 0 else down), max(LOG_HORIZON, mid))
    return Reading(mid, max(low, 0.0), max(high, mid))


def fit_table(
    prior: np.ndarray,
    fitted: np.ndarray,
    truth: np.ndarray,
    groups: Sequence[str],
    *,
    edges: Sequence[float] = EDGES,
    spread: tuple[float, ...] = FIT_SPREAD,
    weights: Sequence[float] = WEIGHTS,
    leans: Sequence[tuple[float, ...]] = (NO_LEAN,),
    by_cells: bool = False,
) -> BlendTable:
    """The table from rows of held-out families: `prior` and `fitted` (n, 3) readings (mid, low, high as
    log(total / elapsed)), `truth` log(true total / elapsed), `groups` each row's family (each weighs the same);
    the prior's share from `weights` and its lean from `leans` (one for the table: the first phase's choice), the
    band's quantiles per phase (`edges`) in the `units` of `spread`: the residuals' 10% and 90% (every family
    weighing the same), or with `by_cells` the pair that puts the most families' coverage at each cut inside the
    goal (`bandfit.cell_band`)."""
    weight = family_weights(groups)
    bins = np.searchsorted(edges, phases(prior, fitted), side="right")
    _, lean = best_share(prior, fitted, truth, weight, weights, leans)
    names = np.asarray(groups)
    whole = _cell(prior, fitted, truth, weight, weights, spread, lean, names if by_cells else None)
    if not edges:  # one cell: the whole
        return BlendTable((), (whole,), tuple(spread), lean)
    cells = []
    for b in range(len(edges) + 1):
        m = bins == b
        cells.append(
            _cell(prior[m], fitted[m], truth[m], weight[m], weights, spread, lean, names[m] if by_cells else None)
            if m.sum() >= MIN_ROWS
            else whole
        )
    return BlendTable(tuple(edges), tuple(cells), tuple(spread), lean)


def family_weights(groups: Sequence[str]) -> np.ndarray:
    names, index, counts = np.unique(np.asarray(groups), return_inverse=True, return_counts=True)
    return 1.0 / (counts[index] * len(names))


def best_share(
    prior: np.ndarray,
    fitted: np.ndarray,
    truth: np.ndarray,
    weight: np.ndarray,
    weights: Sequence[float],
    leans: Sequence[tuple[float, ...]] = (NO_LEAN,),
) -> tuple[float, tuple[float, ...]]:
    """The prior's share and lean whose blend is within ±20% of the most (family-weighed) rows; the first of
    equals (the grids' order)."""
    best: tuple[float, float, tuple[float, ...]] | None = None
    for lean in leans:
        for w in weights:
            pred = np.maximum(blend_mid(prior, fitted, shares(prior, fitted, w, lean)), 0.0)
            score = float(np.sum(weight * (np.abs(np.exp(pred - truth) - 1) <= WITHIN)))
            if best is None or score > best[0] + 1e-9:
                best = (score, w, tuple(lean))
    assert best is not None
    return best[1], best[2]


def blend_mid(prior: np.ndarray, fitted: np.ndarray, share: np.ndarray) -> np.ndarray:
    return share * prior[:, 0] + (1 - share) * fitted[:, 0]


def _cell(
    prior: np.ndarray,
    fitted: np.ndarray,
    truth: np.ndarray,
    weight: np.ndarray,
    weights: Sequence[float],
    spread: Sequence[float],
    lean: tuple[float, ...] = NO_LEAN,
    groups: np.ndarray | None = None,
) -> Cell:
    """The share whose blend (with `lean`) is within ±20% of the most (family-weighed) rows, and its band's
    quantiles (of the residuals, each over the unit of its side). No bias is learned: one learned on other
    families moved the held-out one's median the wrong way as often as not."""
    w, _ = best_share(prior, fitted, truth, weight, weights, (lean,))
    pred = np.maximum(blend_mid(prior, fitted, shares(prior, fitted, w, lean)), 0.0)
    down, up = units(prior, fitted, pred, spread)
    residual = truth - pred
    z = np.where(residual < 0, residual / down, residual / up)
    if groups is not None:
        return Cell(w, *bandfit.cell_band(z, weight, groups=groups, truth=truth))
    return Cell(w, weighted_quantile(z, weight, 0.1), weighted_quantile(z, weight, 0.9))


def save(table: BlendTable, path: Path = TABLE, **meta: object) -> None:
    cells = [[round(c.weight, 4), round(c.low, 4), round(c.high, 4)] for c in table.cells]
    raw = {"version": FORMAT_VERSION, "edges": list(table.edges), "cells": cells, "spread": list(table.spread)}
    if any(table.lean):
        raw["lean"] = list(table.lean)
    path.write_text(json.dumps(raw | meta) + "\n")


def load(path: Path = TABLE) -> BlendTable | None:
    """The shipped table; None when missing, unreadable or of another format (the former blend applies)."""
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != FORMAT_VERSION:
            return None
        edges = tuple(float(e) for e in raw["edges"])
        values = [[float(v) for v in c] for c in raw["cells"]]
        spread = tuple(float(v) for v in raw.get("spread", SPREAD))
        lean = tuple(float(v) for v in raw.get("lean", NO_LEAN))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    ok = (
        len(values) == len(edges) + 1
        and list(edges) == sorted(edges)
        and all(len(c) == 3 and all(math.isfinite(v) for v in c) and 0 <= c[0] <= 1 and c[1] <= c[2] for c in values)
        and len(spread) in (3, 4, 5)
        and all(math.isfinite(v) and 0 <= v <= 10 for v in spread)
        and sum(spread) > 0
        and len(lean) in (2, 3)
        and all(math.isfinite(v) and abs(v) <= 10 for v in lean)
    )
    return BlendTable(edges, tuple(Cell(*c) for c in values), spread, lean) if ok else None
