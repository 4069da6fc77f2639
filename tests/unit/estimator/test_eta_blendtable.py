"""The learned blend of the curve prior and the fitted curve (issue 31): a weight per phase of the run, a band
sized on families neither part saw (each family weighing the same), and the nested family split."""

import math

import numpy as np
import pytest

from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable as bt
from services.estimator.model.curveprior.estimate import blended
from services.estimator.model.owncurve import OwnEstimate


def rows(n, *, seed, prior_noise, fit_noise, family="a"):
    """n readings of one family: the truth's log(total / elapsed) and two readings off by their own noise."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0.2, 2.0, n)
    prior_mid = truth + rng.normal(0, prior_noise, n)
    fit_mid = truth + rng.normal(0, fit_noise, n)
    prior = np.stack([prior_mid, prior_mid - 0.5, prior_mid + 0.5], axis=1)
    fitted = np.stack([fit_mid, fit_mid - 0.1, fit_mid + 0.1], axis=1)
    return prior, fitted, truth, [family] * n


def test_the_table_leans_on_the_reading_that_misses_less_in_each_phase_but_drops_neither():
    edges = (0.5,)
    prior, fitted, truth, groups = rows(2000, seed=1, prior_noise=0.02, fit_noise=0.6)
    table = bt.fit_table(prior, fitted, truth, groups, edges=edges)
    assert [c.weight for c in table.cells] == [max(bt.WEIGHTS)] * 2
    prior, fitted, truth, groups = rows(2000, seed=2, prior_noise=0.6, fit_noise=0.02)
    table = bt.fit_table(prior, fitted, truth, groups, edges=edges)
    assert [c.weight for c in table.cells] == [min(bt.WEIGHTS)] * 2
    assert min(bt.WEIGHTS) > 0 and max(bt.WEIGHTS) < 1


def test_the_median_lies_between_the_readings_and_the_band_widens_with_their_doubt():
    table = bt.BlendTable((), (bt.Cell(0.5, -1.0, 1.0),))
    sure = bt.combine(bt.Reading(1.0, 0.9, 1.1), bt.Reading(1.2, 1.1, 1.3), table)
    unsure = bt.combine(bt.Reading(1.0, 0.2, 3.0), bt.Reading(1.2, 1.1, 1.3), table)
    apart = bt.combine(bt.Reading(0.4, 0.3, 0.5), bt.Reading(2.0, 1.9, 2.1), table)
    assert sure.mid == pytest.approx(1.1) and 0.4 < apart.mid < 2.0
    assert sure.high - sure.low < unsure.high - unsure.low and sure.high - sure.low < apart.high - apart.low


def test_the_band_covers_every_family_alike_not_the_largest_alone():
    small = rows(300, seed=4, prior_noise=0.6, fit_noise=0.6, family="wild")
    large = rows(3000, seed=5, prior_noise=0.05, fit_noise=0.05, family="tame")
    prior, fitted, truth = (np.concatenate([small[i], large[i]]) for i in range(3))
    groups = small[3] + large[3]
    table = bt.fit_table(prior, fitted, truth, groups, edges=(), spread=bt.SPREAD)
    covered = {}
    for p, f, t, g in zip(prior, fitted, truth, groups):
        got = bt.combine(bt.Reading(*p), bt.Reading(*f), table)
        covered.setdefault(g, []).append(got.low <= t <= got.high)
    pooled_by_rows = np.mean([c for v in covered.values() for c in v])
    assert np.mean(covered["wild"]) > 0.5  # pooled by rows, the wild family's 300 would barely move the band
    assert abs(np.mean([np.mean(v) for v in covered.values()]) - 0.8) < 0.05 < abs(pooled_by_rows - 0.8)


def test_the_band_widens_with_the_readings_disagreement_and_each_ones_doubt_as_its_spread_weighs_them():
    prior, fitted = bt.Reading(1.0, 0.5, 1.5), bt.Reading(2.0, 1.8, 2.2)
    assert bt.scale(prior, fitted) == pytest.approx(0.5 + 0.5)  # a table without a spread: as before
    assert bt.scale(prior, fitted, (1.0, 1.0, 1.0)) == pytest.approx(0.5 + 1.0 + 0.2)
    unsure_fit = bt.Reading(2.0, 1.0, 3.0)
    cell = (bt.Cell(0.5, -1.0, 1.0),)
    for spread, wider in (((1.0, 0.5, 0.0), False), ((1.0, 0.5, 1.0), True)):
        table = bt.BlendTable((), cell, spread)
        sure, unsure = bt.combine(prior, fitted, table), bt.combine(prior, unsure_fit, table)
        assert ((unsure.high - unsure.low) > (sure.high - sure.low) + 1e-9) is wider


def test_a_spread_is_fitted_in_its_own_units_and_round_trips(tmp_path):
    prior, fitted, truth, groups = rows(2000, seed=7, prior_noise=0.3, fit_noise=0.3)
    narrow = bt.fit_table(prior, fitted, truth, groups, spread=(1.0, 0.5, 0.0))
    assert narrow.spread == (1.0, 0.5, 0.0)
    wide = bt.fit_table(prior, fitted, truth, groups, spread=(2.0, 1.0, 0.0))
    assert wide.cells[0].high == pytest.approx(narrow.cells[0].high / 2, rel=0.02)  # the same band, twice the unit
    bt.save(wide, tmp_path / "b.json")
    loaded = bt.load(tmp_path / "b.json")
    assert loaded is not None and loaded.spread == wide.spread == (2.0, 1.0, 0.0)
    assert loaded.cells[0].high == pytest.approx(wide.cells[0].high, abs=1e-4)


def test_a_sided_band_reaches_towards_the_reading_the_blend_did_not_follow():
    reaching = (0.0, 3.0, 0.0, 2.0)  # the third round's form (the shipped one reaches 0: its quantiles alone sided)
    table = bt.BlendTable((), (bt.Cell(0.25, -0.1, 0.1),), reaching)
    assert len(bt.FIT_SPREAD) == 4
    later = bt.combine(bt.Reading(2.0, 1.5, 2.5), bt.Reading(1.0, 0.9, 1.1), table)  # the prior says later
    earlier = bt.combine(bt.Reading(0.5, 0.3, 0.7), bt.Reading(1.5, 1.4, 1.6), table)  # the prior says sooner
    assert later.high - later.mid > later.mid - later.low > 0
    assert earlier.mid - earlier.low > earlier.high - earlier.mid > 0
    agree = bt.combine(bt.Reading(1.0, 0.2, 3.0), bt.Reading(1.0, 0.9, 1.1), table)
    assert agree.high - agree.low == pytest.approx(0.2 * bt.MIN_SCALE)  # agreeing readings: the floor
    former = bt.BlendTable((), (bt.Cell(0.25, -0.1, 0.1),), bt.SPREAD)
    both = bt.combine(bt.Reading(2.0, 1.5, 2.5), bt.Reading(1.0, 0.9, 1.1), former)
    assert both.high - both.mid == pytest.approx(both.mid - both.low)  # a table of three: symmetric, as before


def test_a_band_far_apart_readings_stretch_stops_at_the_priors_horizon():
    table = bt.BlendTable((), (bt.Cell(0.375, -0.75, 1.39),), bt.FIT_SPREAD)
    got = bt.combine(bt.Reading(math.log(50), 1.0, math.log(50)), bt.Reading(1.5, 1.2, 1.8), table)
    assert got.high == pytest.approx(math.log(50)) and got.low <= got.mid < got.high  # not 10^10 times the time


def test_a_sided_band_is_sized_on_each_sides_residuals():
    rng = np.random.default_rng(11)
    n = 4000
    truth = rng.uniform(0.2, 2.0, n)
    prior_mid = truth + rng.normal(0.3, 0.3, n)  # the prior late by about as much as the fit is early
    fit_mid = truth - np.abs(rng.normal(0.0, 0.2, n))
    prior = np.stack([prior_mid, prior_mid - 0.4, prior_mid + 0.4], axis=1)
    fitted = np.stack([fit_mid, fit_mid - 0.1, fit_mid + 0.1], axis=1)
    table = bt.fit_table(prior, fitted, truth, ["a"] * n)
    assert table.spread == bt.FIT_SPREAD
    inside = [
        (got := bt.combine(bt.Reading(*p), bt.Reading(*f), table)).low <= t <= got.high
        for p, f, t in zip(prior, fitted, truth)
    ]
    assert abs(np.mean(inside) - 0.8) < 0.03


def test_the_blend_never_ends_before_now_and_its_band_holds_the_median():
    table = bt.BlendTable((0.5,), (bt.Cell(0.5, -9.0, -8.0), bt.Cell(0.5, -9.0, -8.0)))
    got = blended(
        OwnEstimate(40.0, 20.0, 120.0, "curve-prior", 0.25),
        OwnEstimate(20.0, 15.0, 25.0, "curve-learned", 0.5),
        elapsed=10.0,
        table=table,
    )
    assert got.low_s == pytest.approx(10.0) and got.low_s <= got.total_s <= got.high_s
    assert got.kind == "curve-prior+fit"


def test_the_blend_follows_the_table_of_its_phase():
    early, late = bt.Cell(1.0, -0.1, 0.1), bt.Cell(0.0, -0.1, 0.1)
    table = bt.BlendTable((0.5,), (early, late))
    prior, fitted = OwnEstimate(400.0, 300.0, 500.0, "curve-prior", 0.0), OwnEstimate(800.0, 700.0, 900.0, "x", 0)
    assert blended(prior, fitted, elapsed=10.0, table=table).total_s == pytest.approx(400.0)  # 2% seen: the prior
    prior, fitted = OwnEstimate(12.0, 11.0, 13.0, "curve-prior", 0.0), OwnEstimate(14.0, 13.0, 15.0, "x", 0)
    assert blended(prior, fitted, elapsed=10.0, table=table).total_s == pytest.approx(14.0)  # 77% seen: the fit


def test_the_table_round_trips_and_a_hostile_file_is_no_table(tmp_path):
    table = bt.BlendTable((0.3,), (bt.Cell(0.25, -1.5, 2.0), bt.Cell(0.75, -0.8, 0.9)))
    bt.save(table, tmp_path / "b.json", rows=12)
    assert bt.load(tmp_path / "b.json") == table
    for text in (
        '{"version": 1, "edges": [0.3], "cells": [[0.5, -1, 1]]}',  # one cell short
        '{"version": 1, "edges": [], "cells": [[0.5, -1, NaN]]}',
        '{"version": 1, "edges": [], "cells": [[0.5, -1]]}',
        '{"version": 1, "edges": [], "cells": [[1.5, -1, 1]]}',  # a weight beyond one
        '{"version": 1, "edges": [0.6, 0.3], "cells": [[0.5, -1, 1], [0.5, -1, 1], [0.5, -1, 1]]}',
        '{"version": 9, "edges": [], "cells": [[0.5, -1, 1]]}',
        '{"version": 1, "edges": [], "cells": [[0.5, -1, 1]], "spread": [1, -1, 0]}',  # a negative width
        '{"version": 1, "edges": [], "cells": [[0.5, -1, 1]], "spread": [1, 0.5]}',
        '{"version": 1, "edges": [], "cells": [[0.5, -1, 1]], "spread": [1, 0.5, 0, 1, 1, 1]}',
        '{"version": 1, "edges": [], "cells": [[0.5, -1, 1]], "spread": [1, 0.5, Infinity]}',
        '{"version": 1, "edges": [], "cells": [[0.5, -1, 1]], "spread": [0, 0, 0]}',
        '{"version": 1, "edges": [], "cells": [[0.5, -1, 1]], "spread": "wide"}',
        "[]",
        "not json",
    ):
        (tmp_path / "h.json").write_text(text)
        assert bt.load(tmp_path / "h.json") is None
    assert bt.load(tmp_path / "missing.json") is None
    (tmp_path / "old.json").write_text('{"version": 1, "edges": [], "cells": [[0.25, -0.7, 0.9]]}')
    assert bt.load(tmp_path / "old.json") == bt.BlendTable((), (bt.Cell(0.25, -0.7, 0.9),), bt.SPREAD)


@pytest.mark.skipif(bt.load() is None, reason="the shipped blend table is not in this checkout")
def test_the_shipped_table_is_served_by_the_tracker():
    from services.estimator import tracker

    assert tracker.blend_table() == bt.load()
    assert all(0.0 <= c.weight <= 1.0 and c.low < 0.0 < c.high for c in bt.load().cells)


def test_the_table_that_scores_a_family_never_read_it(monkeypatch):
    """Nested: each family's blend table is fitted on the other families' readings, by parts built without them."""
    pytest.importorskip("torch")
    from services.estimator import ownchoice, ownfamily, ownnested
    from services.estimator.model import owntrain
    from services.estimator.model.curveprior import net as priornet, train

    if not priornet.PRETRAINED.exists():
        pytest.skip("the pre-trained prior is not in this checkout")

    def runs(group, scale, **extra):
        points = [
            {"t": 0.1 * i, "step": 10 * i, "loss": scale / i**0.7, "val_loss": scale / i**0.5} for i in range(1, 31)
        ]
        for p in points:
            p["val_acc"] = 1 - p["val_loss"] / (2 * scale)
        return [
            {"run": f"{group}-{s}", "group": group, "params": {"seed": s}, "points": points, **extra} for s in range(5)
        ]

    corpus = runs("digits-mlp", 2.0) + runs("x", 3.0, family="conv-adam") + runs("y", 1.0, family="gru")
    monkeypatch.setattr(owncorpus, "load_corpus", lambda paths: corpus)
    monkeypatch.setattr(train, "finetune_samples", lambda base, x, y, **kw: base)
    fitted_on, tables_from = [], []
    real_fit, real_table = owntrain.fit_net, ownchoice.table_for

    def fit_net(x, y, **kw):
        fitted_on.append(len(y))
        return real_fit(x, y, steps=20)

    def table_for(readings, **kw):  # the served table's form and fit, both on the other families' readings
        tables_from.append(set(readings.families))
        return real_table(readings, **kw)

    made, real_samples = [], ownnested.curve_samples

    def curve_samples(runs, *a, **kw):  # the evaluation's own samples, read here rather than made again
        made.append((runs, real_samples(runs, *a, **kw)))
        return made[-1][1]

    monkeypatch.setattr(owntrain, "fit_net", fit_net)
    monkeypatch.setattr(ownchoice, "table_for", table_for)
    monkeypatch.setattr(ownnested, "curve_samples", curve_samples)
    report = ownfamily.run_family_evaluation(("unused",))
    [(runs, samples)] = made
    assert runs == corpus  # the samples of every family's runs
    assert report["families"] == ["conv-adam", "digits", "gru"]
    assert tables_from == [{"digits", "gru"}, {"conv-adam", "gru"}, {"conv-adam", "digits"}]
    # The fitted curve as shipped (four networks cross-fitted by seed) fitted on the other families' samples only.
    sizes = {(f, s): len(v.fit[s][1]) for f, v in samples.items() for s in v.fit}
    assert sorted({s for _, s in sizes}) == [0, 1, 2, 3]
    assert fitted_on == [
        sum(n for (f, s), n in sizes.items() if f != held and s != seed)
        for held in report["families"]
        for seed in range(4)
    ]
    assert math.isfinite(report["methods"][report["headline_method"]]["loss"]["all"]["50%"]["within_20pct"])


def test_the_shipped_fitted_curve_and_a_folds_are_one_recipe(monkeypatch, tmp_path):
    """`owncurve.json` (bench.search.calibrate) and a fold's fitted curve (`ownnested`) are the same function of
    their runs, and a family's cached samples read back as computed."""
    pytest.importorskip("torch")
    from services.estimator import ownnested
    from services.estimator.model import owntrain
    from services.estimator.model.owncurve import quantile_net

    def runs(group, scale, **extra):
        points = [{"t": 0.1 * i, "step": 10 * i, "loss": scale / i**0.7} for i in range(1, 31)]
        for p in points:
            p["val_loss"], p["val_acc"] = p["loss"] * 1.1, 1 - p["loss"] / (3 * scale)
        return [
            {"run": f"{group}-{s}", "group": group, "params": {"seed": s}, "points": points, **extra} for s in range(5)
        ]

    corpus = [{**r, "family": owncorpus.family(r)} for r in runs("digits-mlp", 2.0) + runs("x", 3.0, family="gru")]
    real_fit = owntrain.fit_net
    monkeypatch.setattr(owntrain, "fit_net", lambda x, y, **kw: real_fit(x, y, steps=10, **kw))
    computed = ownnested.curve_samples(corpus, tmp_path)
    cached = ownnested.curve_samples(corpus, tmp_path)
    for fam, got in computed.items():
        assert sorted(cached[fam].fit) == sorted(got.fit) and cached[fam].pad_cases == got.pad_cases
        for s in got.fit:
            assert np.array_equal(cached[fam].fit[s][0], got.fit[s][0])
            assert np.array_equal(cached[fam].pad[s][1], got.pad[s][1])
    shipped = ownnested.shipped_curve(cached, runs=corpus)
    assert shipped == owntrain.calibrate(corpus, list(owncorpus.METRICS))
    assert shipped["runs"] == 10 and shipped["groups"] == ["digits-mlp", "x"] and len(shipped["nets"]) == 4
    without = ownnested.fold_curve(cached, held="gru", runs=corpus[:5])
    assert without == owntrain.calibrate(corpus[:5], list(owncorpus.METRICS)) and without["groups"] == ["digits-mlp"]
    x = np.random.default_rng(0).normal(size=(7, len(shipped["features"])))
    assert np.allclose(owntrain.quantile_rows(x, shipped["nets"][0]), [quantile_net(r, shipped["nets"][0]) for r in x])


def test_the_tables_form_is_chosen_on_families_each_table_never_read(monkeypatch):
    """`ownchoice` scores a family by a table fitted on the others' readings, serving each row as the tracker does."""
    from services.estimator import ownchoice
    from services.estimator.ownnested import Readings

    rng = np.random.default_rng(3)
    parts = []
    for fam, noise in (("a", 0.1), ("b", 0.3), ("c", 0.6)):
        truth = -np.log(rng.choice(owncorpus.CUTS, 300))
        prior = np.stack([truth + rng.normal(0, noise, 300), truth - 0.5, truth + 0.5], axis=1)
        fitted = np.stack([truth + rng.normal(0, noise, 300), truth - 0.3, truth + 0.3], axis=1)
        parts.append(Readings([fam] * 300, prior, fitted, truth))
    readings = Readings(
        [f for p in parts for f in p.families],
        np.concatenate([p.prior for p in parts]),
        np.concatenate([p.fitted for p in parts]),
        np.concatenate([p.truth for p in parts]),
    )
    table = bt.fit_table(readings.prior, readings.fitted, readings.truth, readings.families)
    got = ownchoice.served(table, readings.prior, readings.fitted)
    for i in range(0, 900, 37):
        assert got[i] == pytest.approx(
            bt.combine(bt.Reading(*readings.prior[i]), bt.Reading(*readings.fitted[i]), table)
        )
    fitted_on = []
    real = bt.fit_table
    monkeypatch.setattr(bt, "fit_table", lambda *a, **kw: fitted_on.append(set(a[3])) or real(*a, **kw))
    score = ownchoice.score(readings, ownchoice.Form(spread=(0.0, 3.0, 0.0, 2.0)))
    assert fitted_on == [{"b", "c"}, {"a", "c"}, {"a", "b"}]
    assert set(score.coverage) == {"a", "b", "c"} and set(score.within) == set(owncorpus.CUTS)
    cells = [v for by_cut in score.coverage.values() for v in by_cut.values()]
    assert score.inside == sum(0.75 <= v <= 0.85 for v in cells) and score.distance >= 0


def test_a_lean_moves_the_share_to_the_prior_where_the_fitted_curve_doubts_itself():
    """Where the fitted curve's own band is wide its median misses more: a table fitted with the leans leans on the
    prior there, and is within ±20% more often on fresh rows of the same kind than one share for all."""

    def drawn(seed, n=3000):
        rng = np.random.default_rng(seed)
        truth = rng.uniform(0.2, 2.0, n)
        doubt = rng.uniform(0.05, 1.2, n)
        fit_mid, prior_mid = truth + rng.normal(0, doubt), truth + rng.normal(0, 0.25, n)
        prior = np.stack([prior_mid, prior_mid - 0.4, prior_mid + 0.4], axis=1)
        return prior, np.stack([fit_mid, fit_mid - doubt, fit_mid + doubt], axis=1), truth

    from services.estimator import ownchoice

    prior, fitted, truth = drawn(5)
    flat = bt.fit_table(prior, fitted, truth, ["a"] * len(truth))
    leaning = bt.fit_table(prior, fitted, truth, ["a"] * len(truth), leans=bt.LEANS)
    assert flat.lean == bt.NO_LEAN and leaning.lean[0] > 0
    sure = bt.combine(bt.Reading(1.0, 0.6, 1.4), bt.Reading(2.0, 1.9, 2.1), leaning)
    unsure = bt.combine(bt.Reading(1.0, 0.6, 1.4), bt.Reading(2.0, 1.0, 3.0), leaning)
    assert unsure.mid < sure.mid  # the same medians: the unsure fit is followed less

    def within(table, p, f, t):
        return np.mean(np.abs(np.exp(ownchoice.served(table, p, f)[:, 0] - t) - 1) <= bt.WITHIN)

    fresh = drawn(6)
    assert within(leaning, *fresh) > within(flat, *fresh) + 0.03


def test_a_lean_round_trips_and_a_hostile_one_is_no_table(tmp_path):
    table = bt.BlendTable((), (bt.Cell(0.5, -1.0, 1.2),), bt.FIT_SPREAD, (1.0, -0.5))
    bt.save(table, tmp_path / "b.json")
    assert bt.load(tmp_path / "b.json") == table
    bt.save(bt.BlendTable((), (bt.Cell(0.5, -1.0, 1.2),), bt.FIT_SPREAD), tmp_path / "flat.json")
    assert "lean" not in (tmp_path / "flat.json").read_text()  # a table without one reads as before
    for lean in ("[1, NaN]", "[1]", "[50, 0]", '"far"', "[1, 2, 3, 4]", "[0, 0, 11]"):
        (tmp_path / "h.json").write_text(f'{{"version": 1, "edges": [], "cells": [[0.5, -1, 1]], "lean": {lean}}}')
        assert bt.load(tmp_path / "h.json") is None


def test_the_choice_serves_every_row_as_the_tracker_does_with_a_lean():
    from services.estimator import ownchoice

    rng = np.random.default_rng(8)
    prior = np.sort(rng.uniform(0.0, 3.0, (200, 3)), axis=1)[:, [1, 0, 2]]
    fitted = np.sort(rng.uniform(0.0, 3.0, (200, 3)), axis=1)[:, [1, 0, 2]]
    table = bt.BlendTable((0.3,), (bt.Cell(0.25, -1.0, 2.0), bt.Cell(0.625, -0.5, 1.0)), bt.FIT_SPREAD, (2.0, -1.0))
    got = ownchoice.served(table, prior, fitted)
    for i in range(200):
        assert got[i] == pytest.approx(bt.combine(bt.Reading(*prior[i]), bt.Reading(*fitted[i]), table))


def family_readings(noises=(("a", 0.1), ("b", 0.3), ("c", 0.6), ("d", 0.2)), n=300, seed=3):
    from services.estimator.ownnested import Readings, concat

    rng = np.random.default_rng(seed)
    parts = []
    for fam, noise in noises:
        truth = -np.log(rng.choice(owncorpus.CUTS, n))
        prior = np.stack([truth + rng.normal(0, noise, n), truth - 0.5, truth + 0.5], axis=1)
        fitted = np.stack([truth + rng.normal(0, noise, n), truth - 0.3, truth + 0.3], axis=1)
        parts.append(Readings([fam] * n, prior, fitted, truth))
    return concat(parts)


def test_the_form_that_scores_a_family_is_chosen_without_it(monkeypatch):
    """E1: the band's form and the prior's share are chosen inside each outer fold, on the other families'
    readings only (and, inside that choice, each of them scored by a table fitted without it)."""
    from services.estimator import ownchoice

    readings = family_readings()
    chosen_on, fitted_without = [], []
    real_choose, real_fit = ownchoice.choose, ownchoice.Fitter.fit
    monkeypatch.setattr(ownchoice, "choose", lambda r, **kw: chosen_on.append(set(r.families)) or real_choose(r, **kw))

    def fit(self, form, *, without=()):
        fitted_without.append((frozenset(self.readings.families), tuple(without)))
        return real_fit(self, form, without=without)

    monkeypatch.setattr(ownchoice.Fitter, "fit", fit)
    got, forms = ownchoice.nested_score(readings)
    assert chosen_on == [{"b", "c", "d"}, {"a", "c", "d"}, {"a", "b", "d"}, {"a", "b", "c"}]
    assert set(forms) == {"a", "b", "c", "d"} and all(isinstance(f, ownchoice.Form) for f in forms.values())
    for on, without in fitted_without:  # every table fitted inside a choice read neither the outer family nor its own
        assert len(on) == 3 and (not without or without[0] in on)
    assert set(got.coverage) == {"a", "b", "c", "d"} and set(got.within) == set(owncorpus.CUTS)


def test_a_folds_cache_key_follows_the_fitted_curves_recipe(monkeypatch, tmp_path):
    """E2: a fold cached under one recipe of the fitted curve is not read under another."""
    pytest.importorskip("torch")
    from services.estimator import ownnested
    from services.estimator.model import owntrain

    runs = [{"run": "r-1"}, {"run": "r-2"}]
    key = ownnested.cache_key(runs)
    assert ownnested.cache_key(list(reversed(runs))) == key
    for name, value in (("STEPS", owntrain.STEPS + 1), ("HIDDEN", owntrain.HIDDEN * 2)):
        with monkeypatch.context() as m:
            m.setattr(owntrain, name, value)
            assert ownnested.cache_key(runs) != key
    with monkeypatch.context() as m:
        m.setattr(owncorpus, "CALIBRATION_CUTS", (0.5,))
        assert ownnested.cache_key(runs) != key
    real = ownnested.code_digest
    with monkeypatch.context() as m:
        m.setattr(ownnested, "code_digest", lambda names: real(names[:-1]))  # as if one source file had changed
        assert ownnested.cache_key(runs) != key
    assert ownnested.cache_key(runs) == key
