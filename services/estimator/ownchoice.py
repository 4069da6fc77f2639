"""The blend table's form chosen on the nested readings (offline): `python -m services.estimator.ownchoice`.

Each candidate (the band's `spread`, the prior shares tried) is scored leave-one-family-out on the readings
`ownnested` makes (each family read by parts built without it): each family by a table fitted on the other
families' readings only, at the evaluation's cuts (`owncorpus.CUTS`): within ±20% pooled, and each family's 10-90%
coverage at each cut against the goal's 75-85% (the mean distance outside it, in points, and the cells inside).
Nothing here reads the never-seen split.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable
from services.estimator.model.curveprior.net import LOG_HORIZON
from services.estimator.ownnested import Readings

GOAL = (0.75, 0.85)
WIDE_WEIGHTS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)


@dataclass(frozen=True)
class Score:
    """A candidate's nested figures: within ±20% per cut (pooled), coverage per family and cut, the mean distance
    of those coverages outside GOAL (points), how many lie inside, and the prior share each fold chose."""

    within: dict[float, float]
    coverage: dict[str, dict[float, float]]
    distance: float
    inside: int
    weights: tuple[float, ...]


def served(table: blendtable.BlendTable, prior: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """`blendtable.combine` of every row at once: (n, 3) mid, low, high as log(total / elapsed)."""
    phases = np.exp(-(prior[:, 0] + fitted[:, 0]) / 2)
    cells = [table.cell(float(f)) for f in phases]
    w, lo, hi = (np.array([getattr(c, k) for c in cells]) for k in ("weight", "low", "high"))
    mid = np.maximum(w * prior[:, 0] + (1 - w) * fitted[:, 0], 0.0)
    down, up = blendtable.units(prior, fitted, mid, table.spread)
    low = mid + lo * np.where(lo < 0, down, up)
    high = np.minimum(mid + hi * np.where(hi > 0, up, down), np.maximum(LOG_HORIZON, mid))
    return np.stack([mid, np.maximum(low, 0.0), np.maximum(high, mid)], axis=1)


def cut_of(truth: np.ndarray) -> np.ndarray:
    """The cut a reading was made at: its truth is log(total / elapsed) with elapsed = cut · total."""
    return np.round(np.exp(-truth), 2)


def score(
    readings: Readings,
    *,
    spread: tuple[float, ...],
    weights: Sequence[float] = blendtable.WEIGHTS,
    cuts: Sequence[float] = owncorpus.CUTS,
) -> Score:
    families = np.asarray(readings.families)
    cut = cut_of(readings.truth)
    hit = np.zeros(len(cut), bool)
    inside = np.zeros(len(cut), bool)
    chosen = []
    for held in sorted(set(readings.families)):
        mine, others = families == held, families != held
        table = blendtable.fit_table(
            readings.prior[others],
            readings.fitted[others],
            readings.truth[others],
            list(families[others]),
            spread=spread,
            weights=weights,
        )
        chosen.append(table.cells[0].weight)
        got = served(table, readings.prior[mine], readings.fitted[mine])
        truth = readings.truth[mine]
        hit[mine] = np.abs(np.exp(got[:, 0] - truth) - 1) <= blendtable.WITHIN
        inside[mine] = (got[:, 1] <= truth) & (truth <= got[:, 2])
    within = {c: float(hit[cut == c].mean()) for c in cuts if np.any(cut == c)}
    coverage: dict[str, dict[float, float]] = {}
    for fam in sorted(set(readings.families)):
        for c in cuts:
            m = (families == fam) & (cut == c)
            if m.any():
                coverage.setdefault(fam, {})[c] = float(inside[m].mean())
    cells = [v for by_cut in coverage.values() for v in by_cut.values()]
    distance = float(np.mean([max(GOAL[0] - v, v - GOAL[1], 0.0) for v in cells])) * 100
    n_inside = sum(GOAL[0] <= v <= GOAL[1] for v in cells)
    return Score(within, coverage, distance, n_inside, tuple(chosen))


def candidates() -> list[tuple[tuple[float, ...], Sequence[float]]]:
    """The band's forms tried (the former symmetric one, sided ones on the prior's width, the readings' distance
    and the reach towards the reading not followed) with the table's prior shares, and the shipped form with a wider
    grid of shares (the share is chosen by within ±20%, which the band does not move)."""
    spreads: list[tuple[float, ...]] = [(1.0, 0.5, 0.0)]
    spreads += [
        (own, apart, 0.0, reach)
        for own, apart, reach in itertools.product((0.0, 0.5), (1.0, 2.0, 3.0, 4.0), (0.0, 1.0, 2.0, 3.0))
    ]
    return [(s, blendtable.WEIGHTS) for s in spreads] + [(blendtable.FIT_SPREAD, WIDE_WEIGHTS)]


def main(argv: list[str] | None = None) -> None:
    """Print every candidate's nested figures, best coverage first."""
    import torch

    from services.estimator import ownnested
    from services.estimator.model.curveprior.net import PRETRAINED, load as load_prior

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--cache", type=Path, help="ownnested's fold cache (`make eta-prior`)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    runs = owncorpus.load_corpus(owncorpus.TRAINED)
    pretrained = load_prior(PRETRAINED)
    if pretrained is None:
        raise SystemExit(f"cannot read the pre-trained prior {PRETRAINED}")
    readings = ownnested.nested_readings(
        runs,
        pretrained=pretrained,
        samples=ownnested.curve_samples(runs, args.cache),
        encoded=ownnested.prior_samples(runs, args.cache),
        cache_dir=args.cache,
    )
    scored = [(s, w, score(readings, spread=s, weights=w)) for s, w in candidates()]
    for s, w, got in sorted(scored, key=lambda r: (r[2].distance, -sum(r[2].within.values()))):
        within = " / ".join(f"{got.within.get(c, float('nan')) * 100:.1f}" for c in owncorpus.CUTS)
        print(
            f"spread {s} shares {w[0]}-{w[-1]}: distance {got.distance:.2f}, {got.inside} cells inside, "
            f"within ±20% {within}%, chosen {sorted(set(got.weights))}"
        )


if __name__ == "__main__":
    main()
