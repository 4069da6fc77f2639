"""A benchmark never trained on: its work to target in multiples of its own first evaluation's work."""

import math

import pytest
from eta_factories import make_run

from services.estimator.model.blend import EVAL_UNITS
from services.estimator.model.evalunits import EvalUnits, learn
from services.estimator.model.history import HistoryPrior
from services.estimator.model.online import OnlineEstimator


def test_each_training_benchmark_weighs_the_same_in_the_learned_ratio():
    # 30 runs that meet the target at their 2nd evaluation, 3 at their 10th, 3 at their 20th: the median benchmark
    # is the one at 10, not the crowd's 2.
    runs = (
        [make_run(benchmark="unet3d", evals=2, run_id=f"v/o/s/unet3d/{i}") for i in range(30)]
        + [make_run(benchmark="bert", evals=10, run_id=f"v/o/s/bert/{i}") for i in range(3)]
        + [make_run(benchmark="rnnt", evals=20, run_id=f"v/o/s/rnnt/{i}") for i in range(3)]
    )
    units = learn(runs)
    assert units.ratio[1] == pytest.approx(10.0)
    assert units.ratio[0] < units.ratio[1] < units.ratio[2]
    assert units.steps[1] == pytest.approx(9.0)


def test_the_second_evaluation_gives_the_cadence():
    units = EvalUnits(ratio=(4.0, 12.0, 40.0), steps=(3.0, 11.0, 39.0))
    assert units.work(first=1000.0) == (4000.0, 12000.0, 40000.0)
    # Evaluations only from late in the run on (unet3d-like): the work is the first plus k cadences.
    assert units.work(first=1000.0, second=1020.0) == (1060.0, 1220.0, 1780.0)


def unseen_prior(units: EvalUnits) -> HistoryPrior:
    """What the history says of a benchmark it never saw: a duration 100x off, in other benchmarks' units."""
    return HistoryPrior(
        duration_s=1e5,
        duration_low_s=5e4,
        duration_high_s=2e5,
        work=5.0,
        work_low=1.0,
        work_high=25.0,
        benchmark="newbench",
        seen=False,
        eval_units=units,
    )


def replay(est: OnlineEstimator, *, until: float, first_eval: float, every: float, start: float = 10) -> None:
    """One unit of work a second, a mark every 10 s, an evaluation at `first_eval` and every `every` units on."""
    for t in range(int(start), int(until) + 1, 10):
        est.observe(float(t), progress=float(t))
        if t >= first_eval and (t - first_eval) % every == 0:
            est.observe(float(t), progress=float(t), metric_value=0.5)


def test_after_its_first_evaluation_an_unseen_benchmark_is_timed_in_its_own_units():
    units = EvalUnits(ratio=(5.0, 10.0, 20.0), steps=(4.0, 9.0, 19.0))
    est = OnlineEstimator(target=0.9, eval_units=True, prior=unseen_prior(units))
    replay(est, until=150, first_eval=100, every=100)  # the run meets its target at 1,000 s
    _, comps = est.snapshot(150.0)
    assert comps[EVAL_UNITS] == pytest.approx(1000.0, rel=0.1)
    assert comps["history"] is None  # the guess from other benchmarks is contradicted by the job's own units
    remaining = est.estimate(150.0).remaining_s
    assert 150.0 + remaining == pytest.approx(1000.0, rel=0.2)


def test_evaluations_that_start_late_are_timed_by_their_cadence():
    units = EvalUnits(ratio=(5.0, 10.0, 20.0), steps=(4.0, 9.0, 19.0))
    est = OnlineEstimator(target=0.9, eval_units=True, prior=unseen_prior(units))
    replay(est, until=810, first_eval=800, every=20)  # first evaluation at 80% of a 1,000 s run, then every 20
    assert est.snapshot(810.0)[1][EVAL_UNITS] > 5000.0  # one evaluation: it may be the first of ten
    replay(est, start=820, until=830, first_eval=800, every=20)
    total = 830.0 + est.estimate(830.0).remaining_s
    assert total == pytest.approx(1000.0, rel=0.2)


def test_evaluation_units_are_off_unless_asked_for():
    units = EvalUnits(ratio=(5.0, 10.0, 20.0), steps=(4.0, 9.0, 19.0))
    est = OnlineEstimator(target=0.9, prior=unseen_prior(units))
    replay(est, until=150, first_eval=100, every=100)
    assert est.snapshot(150.0)[1][EVAL_UNITS] is None


def test_evaluation_units_stand_in_until_the_job_has_a_curve_of_its_own():
    units = EvalUnits(ratio=(5.0, 10.0, 20.0), steps=(4.0, 9.0, 19.0))
    est = OnlineEstimator(target=0.85, eval_units=True, prior=unseen_prior(units))
    for t in range(10, 1001, 10):
        est.observe(float(t), progress=float(t))
        if t % 100 == 0:  # an accuracy rising toward 0.9, evaluated every 100 units
            est.observe(float(t), progress=float(t), metric_value=0.9 * (1 - math.exp(-t / 300)))
        if t == 150:
            assert est.snapshot(150.0)[1][EVAL_UNITS] is not None  # one evaluation: no curve yet
    _, comps = est.snapshot(1000.0)
    assert comps["curve"] is not None and comps[EVAL_UNITS] is None


def test_a_benchmark_the_history_knows_is_not_timed_in_evaluation_units():
    units = EvalUnits(ratio=(5.0, 10.0, 20.0), steps=(4.0, 9.0, 19.0))
    seen = HistoryPrior(
        duration_s=1000.0,
        duration_low_s=800.0,
        duration_high_s=1200.0,
        work=1000.0,
        work_low=800.0,
        work_high=1200.0,
        benchmark="bert",
        seen=True,
        eval_units=units,
    )
    est = OnlineEstimator(target=0.9, eval_units=True, prior=seen)
    replay(est, until=150, first_eval=100, every=100)
    assert est.snapshot(150.0)[1][EVAL_UNITS] is None


def test_a_guess_outside_the_band_of_the_jobs_own_units_leaves_the_blend():
    # The history's band is so wide (held-out benchmarks span orders of magnitude) that the job's own total lies
    # inside it; its point, 100x the job's own units' 90% bound, is what is contradicted.
    units = EvalUnits(ratio=(5.0, 10.0, 20.0), steps=(4.0, 9.0, 19.0))
    wide = HistoryPrior(
        duration_s=1e5,
        duration_low_s=10.0,
        duration_high_s=1e7,
        work=5.0,
        work_low=0.01,
        work_high=1e4,
        benchmark="newbench",
        seen=False,
        eval_units=units,
    )
    est = OnlineEstimator(target=0.9, eval_units=True, prior=wide)
    replay(est, until=150, first_eval=100, every=100)
    _, comps = est.snapshot(150.0)
    assert comps["history"] is None
    assert 150.0 + est.estimate(150.0).remaining_s == pytest.approx(1000.0, rel=0.2)
