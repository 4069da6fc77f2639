"""The blend table's form chosen on nested readings, inside each outer fold (offline, numpy):
`python -m services.estimator.ownchoice`.

A form is the prior shares a table may take, the leans it may take (`blendtable.LEANS`: a share per reading from
the fitted curve's doubt and reach; `NOVEL_LEANS`: from the reach and the curve's novelty), the band's `spread`
(with or without a floor at the prior's own width) and whether its quantiles are sized per family and cut.
`choose` picks one on the readings of some families only, leave-one-family-out among them (`score`): each family
read by a table fitted on the others, the median's form first by within ±20% (at the evaluation's cuts, every
family weighing the same: what transfers to a family unlike the largest ones), then the band's by each family's
10-90% coverage at each cut against the goal's 75-85% (the mean distance outside it, in points; then the cells
inside), then the band's quantiles pooled or per family and cut, the same way. The family split (`ownfamily`)
scores each family by a table whose form was chosen without it (`table_for`), and the shipped table's form is
chosen on all of them (`ownbuild.build_table`). Nothing here reads the never-seen split.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable
from services.estimator.model.curveprior.bandfit import GOAL, cut_of
from services.estimator.model.curveprior.net import LOG_HORIZON
from services.estimator.ownnested import Readings

WIDE_WEIGHTS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
FLOORS = (0.25, 0.5, 1.0)  # the band's floor, a share of the prior's own width on each side


@dataclass(frozen=True)
class Form:
    """What a table may be fitted with: the prior shares and leans tried, and the band's spread."""

    weights: tuple[float, ...] = blendtable.WEIGHTS
    leans: tuple[tuple[float, ...], ...] = (blendtable.NO_LEAN,)
    spread: tuple[float, ...] = blendtable.FIT_SPREAD
    by_cells: bool = False  # the band's quantiles per family and cut (`bandfit.cell_band`), not pooled


MEDIANS = (
    Form(),
    Form(weights=WIDE_WEIGHTS),
    Form(leans=blendtable.LEANS),
    Form(weights=WIDE_WEIGHTS, leans=blendtable.LEANS),
    Form(leans=blendtable.NOVEL_LEANS),
    Form(weights=WIDE_WEIGHTS, leans=blendtable.NOVEL_LEANS),
)
SPREADS: tuple[tuple[float, ...], ...] = (
    (1.0, 0.5, 0.0),  # the first table's symmetric band
    *((0.0, apart, 0.0, reach) for apart in (2.0, 3.0, 4.0) for reach in (0.0, 1.0, 2.0)),
    (0.5, 3.0, 0.0, 0.0),
    (0.0, 3.0, 0.5, 0.0),
    (0.0, 2.0, 0.5, 0.0),
    # sixth round: a floor from the prior's own spread (its fifth coefficient), the distance weighing less
    *((0.0, apart, 0.0, reach, floor) for apart in (1.0, 2.0, 3.0) for reach in (0.0, 1.0) for floor in FLOORS),
)


@dataclass(frozen=True)
class Score:
    """A form's nested figures: within ±20% per cut (pooled), coverage per family and cut, the mean distance
    of those coverages outside GOAL (points), how many lie inside, the prior share each fold chose, and within
    ±20% over the cuts with every family weighing the same."""

    within: dict[float, float]
    coverage: dict[str, dict[float, float]]
    distance: float
    inside: int
    weights: tuple[float, ...]
    family_within: float = 0.0  # within ±20% at the cuts, each family weighing the same


def served(table: blendtable.BlendTable, prior: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """`blendtable.combine` of every row at once: (n, 3) mid, low, high as log(total / elapsed)."""
    if len(table.cells) != len(table.edges) + 1:
        table = replace(table, edges=(), cells=(blendtable.Cell(),))
    bins = np.searchsorted(table.edges, blendtable.phases(prior, fitted), side="right")
    w, lo, hi = (np.array([getattr(c, k) for c in table.cells])[bins] for k in ("weight", "low", "high"))
    share = blendtable.shares(prior, fitted, w, table.lean)
    mid = np.maximum(blendtable.blend_mid(prior, fitted, share), 0.0)
    down, up = blendtable.units(prior, fitted, mid, table.spread)
    low = mid + lo * np.where(lo < 0, down, up)
    high = np.minimum(mid + hi * np.where(hi > 0, up, down), np.maximum(LOG_HORIZON, mid))
    return np.stack([mid, np.maximum(low, 0.0), np.maximum(high, mid)], axis=1)


class Fitter:
    """Tables fitted on `readings` less some families, the share and lean chosen once per set of families (the
    band's spread does not move them)."""

    def __init__(self, readings: Readings) -> None:
        self.readings = readings
        self.families = np.asarray(readings.families)
        self._shares: dict[tuple, tuple[float, tuple[float, ...]]] = {}

    def fit(self, form: Form, *, without: Sequence[str] = ()) -> blendtable.BlendTable:
        r, keep = self.readings, ~np.isin(self.families, list(without))
        prior, fitted, truth, groups = r.prior[keep], r.fitted[keep], r.truth[keep], list(self.families[keep])
        key = (tuple(sorted(without)), form.weights, form.leans)
        if key not in self._shares:
            weight = blendtable.family_weights(groups)
            self._shares[key] = blendtable.best_share(prior, fitted, truth, weight, form.weights, form.leans)
        w, lean = self._shares[key]
        return blendtable.fit_table(
            prior, fitted, truth, groups, spread=form.spread, weights=(w,), leans=(lean,), by_cells=form.by_cells
        )


def score(
    readings: Readings, form: Form, *, cuts: Sequence[float] = owncorpus.CUTS, fitter: Fitter | None = None
) -> Score:
    """`form` leave-one-family-out on `readings`: each family read by a table fitted on the others only."""
    fitter = fitter or Fitter(readings)
    return score_tables(readings, lambda held: fitter.fit(form, without=(held,)), cuts=cuts)


def score_tables(
    readings: Readings, table_without: Callable[[str], blendtable.BlendTable], *, cuts: Sequence[float]
) -> Score:
    """Each family of `readings` read by `table_without(family)`: within ±20% and coverage, as `Score`."""
    families = np.asarray(readings.families)
    cut = cut_of(readings.truth)
    hit = np.zeros(len(cut), bool)
    inside = np.zeros(len(cut), bool)
    chosen = []
    for held in sorted(set(readings.families)):
        mine = families == held
        table = table_without(held)
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
    at_cuts = np.isin(cut, cuts)
    by_family = [hit[(families == f) & at_cuts].mean() for f in sorted(set(readings.families))]
    return Score(within, coverage, distance, n_inside, tuple(chosen), float(np.mean(by_family)))


def choose(
    readings: Readings,
    *,
    medians: Sequence[Form] = MEDIANS,
    spreads: Sequence[tuple[float, ...]] = SPREADS,
    fitter: Fitter | None = None,
    cells: bool = True,
) -> Form:
    """The form `score` ranks first on `readings` (leave-one-family-out among their families): the median's
    (shares, leans) by within ±20% (`Score.family_within`), then the band's spread by coverage, then whether its
    quantiles are sized per family and cut (`Form.by_cells`, unless `cells` is false) by coverage; the first of
    equals."""
    if len(set(readings.families)) < 2:  # no family to score a form on: the default
        return Form()
    fitter = fitter or Fitter(readings)
    best = max(medians, key=lambda f: round(score(readings, f, fitter=fitter).family_within, 9))
    graded = [(replace(best, spread=s), score(readings, replace(best, spread=s), fitter=fitter)) for s in spreads]
    band = min(graded, key=lambda fs: (round(fs[1].distance, 9), -fs[1].inside))
    if not cells:
        return band[0]
    sized = replace(band[0], by_cells=True)
    got = score(readings, sized, fitter=fitter)
    return sized if (round(got.distance, 9), -got.inside) < (round(band[1].distance, 9), -band[1].inside) else band[0]


def table_for(
    readings: Readings,
    *,
    medians: Sequence[Form] = MEDIANS,
    spreads: Sequence[tuple[float, ...]] = SPREADS,
    cells: bool = True,
) -> tuple[blendtable.BlendTable | None, Form]:
    """The table fitted on `readings` in the form `choose` picks on them (nothing else is read); no table (the
    former blend) when they are too few to fit one."""
    if len(readings.truth) < blendtable.MIN_ROWS:
        return None, Form()
    fitter = Fitter(readings)
    form = choose(readings, medians=medians, spreads=spreads, fitter=fitter, cells=cells)
    return fitter.fit(form), form


def nested_score(readings: Readings, *, cuts: Sequence[float] = owncorpus.CUTS) -> tuple[Score, dict[str, Form]]:
    """Every family read by a table whose form was chosen and fitted on the other families only (`table_for`):
    the choice itself inside each outer fold."""
    families = np.asarray(readings.families)
    tables: dict[str, tuple[blendtable.BlendTable | None, Form]] = {}
    for held in sorted(set(readings.families)):
        tables[held] = table_for(readings.where(families != held))
    fitted = {f: t for f, (t, _) in tables.items() if t is not None}
    if len(fitted) < len(tables):
        raise ValueError("too few readings to fit a table without each family")
    return score_tables(readings, fitted.__getitem__, cuts=cuts), {f: form for f, (_, form) in tables.items()}


def main(argv: list[str] | None = None) -> None:
    """Print each form's figures on all the tuning families' nested readings, and the nested choice's."""
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
    fitter = Fitter(readings)
    for form in [*MEDIANS, *(replace(MEDIANS[0], spread=s) for s in SPREADS)]:
        _print(str(form), score(readings, form, fitter=fitter))
    got, forms = nested_score(readings)
    _print("chosen inside each outer fold", got)
    for fam, form in forms.items():
        print(f"  without {fam}: {form}")


def _print(name: str, got: Score) -> None:
    within = " / ".join(f"{got.within.get(c, float('nan')) * 100:.1f}" for c in owncorpus.CUTS)
    print(
        f"{name}: distance {got.distance:.2f}, {got.inside} cells inside, within ±20% {within}% "
        f"(per family {got.family_within * 100:.1f}%), chosen {sorted(set(got.weights))}",
        flush=True,
    )


if __name__ == "__main__":
    main()
