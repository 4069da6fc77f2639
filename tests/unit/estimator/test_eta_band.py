"""The own-job blend's band and share on a curve unlike the training families (issue 31, sixth round): a novelty
known when serving, the prior's share leaning with it, a floor on the band from the prior's own spread, and the
band's quantiles sized per family and cut."""

import math

import numpy as np
import pytest

from services.estimator import ownchoice
from services.estimator.model.curveprior import bandfit, blendtable as bt
from services.estimator.model.curveprior.estimate import blended
from services.estimator.model.owncurve import OwnEstimate


def test_a_floor_keeps_the_band_as_wide_as_the_priors_doubt_where_the_readings_agree():
    """Early in a run the two readings can agree on a time neither is sure of: a band sized by their distance
    alone is a few percent wide (the e2e replay's early estimates: 90% over 10% of the time left 1.2)."""
    prior, fitted = bt.Reading(1.6, 0.9, 2.8), bt.Reading(1.6, 1.5, 1.7)
    cell = bt.Cell(0.25, -1.1, 2.0)
    bare = bt.combine(prior, fitted, bt.BlendTable((), (cell,), (0.0, 3.0, 0.0, 0.0), (0.0, -1.0)))
    floored = bt.combine(prior, fitted, bt.BlendTable((), (cell,), (0.0, 3.0, 0.0, 0.0, 0.5), (0.0, -1.0)))

    def left(a):  # the time still to come at elapsed 1
        return math.exp(a) - 1

    assert left(bare.high) / left(bare.low) < 1.5
    assert floored.low == pytest.approx(1.6 - 1.1 * 0.5 * 0.7) and floored.high == pytest.approx(1.6 + 2.0 * 0.5 * 1.2)
    assert left(floored.high) / left(floored.low) >= 3
    apart = bt.combine(
        bt.Reading(1.0, 0.9, 1.1), bt.Reading(0.8, 0.7, 0.9), bt.BlendTable((), (cell,), (0, 3, 0, 0, 1))
    )
    assert apart.high - apart.low == pytest.approx(3.1 * 3 * 0.2)  # readings apart: the distance, not the floor
    served = ownchoice.served(
        bt.BlendTable((), (cell,), (0.0, 3.0, 0.0, 0.0, 0.5), (0.0, -1.0)), np.array([prior]), np.array([fitted])
    )
    assert served[0] == pytest.approx(floored)  # the choice scores the band the tracker serves


def test_the_tracker_serves_the_floored_band_in_seconds():
    table = bt.BlendTable((), (bt.Cell(0.25, -1.1, 2.0),), (0.0, 3.0, 0.0, 0.0, 0.5))
    prior = OwnEstimate(50.0, 25.0, 160.0, "curve-prior", 0.2)
    fitted = OwnEstimate(50.0, 45.0, 55.0, "own-curve", 0.2)
    got = blended(prior, fitted, elapsed=10.0, table=table)
    assert (got.high_s - 10) / (got.low_s - 10) >= 3 and got.low_s < got.total_s < got.high_s


def novel_rows(seed, n=4000):
    """Rows where the fitted curve is right on curves like its training's and far off on novel ones, where its
    reading leaves the prior's band; the prior is as good on both."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0.2, 2.0, n)
    novel = rng.random(n) < 0.4
    prior_mid = truth + rng.normal(0, 0.15, n)
    fit_mid = truth + np.where(novel, rng.choice([-1, 1], n) * rng.uniform(0.5, 1.2, n), rng.normal(0, 0.05, n))
    prior = np.stack([prior_mid, prior_mid - 0.3, prior_mid + 0.3], axis=1)
    fitted = np.stack([fit_mid, fit_mid - 0.1, fit_mid + 0.1], axis=1)
    return prior, fitted, truth


def test_the_novelty_is_how_far_the_fit_lies_outside_the_priors_band():
    prior = np.array([[1.0, 0.5, 1.5], [1.0, 0.5, 1.5], [1.0, 0.9, 1.1]])
    fitted = np.array([[1.1, 1.0, 1.2], [2.5, 2.4, 2.6], [2.5, 2.4, 2.6]])
    got = bt.novelty(prior, fitted)
    assert got[0] < 0 < got[1] < got[2] and got[1] == pytest.approx(math.log(1.5 / 0.5))
    assert np.all(np.abs(bt.novelty(prior * 1e6, fitted)) <= 3)  # clipped: a hostile reading moves it boundedly


def test_a_curve_unlike_the_training_families_leans_on_the_prior():
    """A table fitted with the novelty's lean gives the prior the larger share where the fitted reading leaves
    the prior's band, and is within ±20% more often on fresh rows than the reach's lean alone."""
    prior, fitted, truth = novel_rows(1)
    groups = ["a"] * len(truth)
    reach = bt.fit_table(prior, fitted, truth, groups, leans=bt.LEANS)
    novel = bt.fit_table(prior, fitted, truth, groups, leans=bt.NOVEL_LEANS)
    assert novel.lean[2] > 0
    close = bt.combine(bt.Reading(1.0, 0.7, 1.3), bt.Reading(1.1, 1.0, 1.2), novel)
    far = bt.combine(bt.Reading(1.0, 0.7, 1.3), bt.Reading(2.0, 1.9, 2.1), novel)
    assert (far.mid - 2.0) / (1.0 - 2.0) > (close.mid - 1.1) / (1.0 - 1.1)  # the prior's share, larger when far

    def within(table, p, f, t):
        return np.mean(np.abs(np.exp(ownchoice.served(table, p, f)[:, 0] - t) - 1) <= bt.WITHIN)

    fresh = novel_rows(2)
    assert within(novel, *fresh) > within(reach, *fresh) + 0.05


def test_a_novel_lean_round_trips(tmp_path):
    table = bt.BlendTable((), (bt.Cell(0.25, -1.0, 1.2),), (0.0, 3.0, 0.0, 1.0, 0.5), (0.0, -0.5, 0.5))
    bt.save(table, tmp_path / "b.json")
    assert bt.load(tmp_path / "b.json") == table


def two_families(seed, n=3000):
    """Two families alike in everything but the spread of their residuals around the readings."""
    rng = np.random.default_rng(seed)
    parts = []
    for fam, noise in (("tame", 0.1), ("wild", 0.2)):
        truth = -np.log(rng.choice((0.1, 0.2, 0.3, 0.5, 0.8), n))
        prior = np.stack([truth + rng.normal(0, noise, n), truth - 0.5, truth + 0.5], axis=1)
        fitted = prior[:, [0, 0, 0]] + rng.normal(0, 0.1, (n, 1)) + np.array([0.0, -0.1, 0.1])
        parts.append((prior, fitted, truth, [fam] * n))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3)) + ([g for p in parts for g in p[3]],)


def test_the_band_sized_per_family_and_cut_puts_more_families_inside_the_goal():
    """Pooled, the 10-90% quantiles over-cover the tame family and under-cover the wild one; sized per family and
    cut, the band puts both nearer 75-85% on fresh rows of the same families."""
    spread = (0.0, 1.0, 0.0, 0.0, 1.0)
    pooled = bt.fit_table(*two_families(3), spread=spread)
    cells = bt.fit_table(*two_families(3), spread=spread, by_cells=True)
    prior, fitted, truth, groups = two_families(4)
    cell, count = bandfit.cells_of(np.asarray(groups), truth)

    def distance(table):
        got = ownchoice.served(table, prior, fitted)
        return bandfit.cell_distance(((got[:, 1] <= truth) & (truth <= got[:, 2])).astype(float), cell, count)

    assert distance(cells)[0] < distance(pooled)[0] - 1 and distance(cells)[1] >= distance(pooled)[1]


def test_the_choice_keeps_the_pooled_band_unless_the_cells_band_covers_better_without_the_family():
    from services.estimator.ownnested import Readings

    prior, fitted, truth, groups = two_families(5, n=400)
    readings = Readings(groups, prior, fitted, truth)
    form = ownchoice.choose(readings, medians=(ownchoice.Form(),), spreads=((0.0, 1.0, 0.0, 0.0, 1.0),))
    scores = {
        by: ownchoice.score(readings, ownchoice.Form(spread=(0.0, 1.0, 0.0, 0.0, 1.0), by_cells=by))
        for by in (False, True)
    }
    better = (scores[True].distance, -scores[True].inside) < (scores[False].distance, -scores[False].inside)
    assert form.by_cells == better
