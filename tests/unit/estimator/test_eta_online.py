import dataclasses
import math

import pytest

from services.estimator.model.blend import BASELINE
from services.estimator.model.history import HistoryPrior
from services.estimator.model.online import MAX_MARKS, OnlineEstimator


def feed_linear(est, *, rate=10.0, until=100.0, every=5.0, metric=None):
    t = every
    while t <= until:
        est.observe(t, progress=rate * t, metric_value=metric(rate * t) if metric else None)
        t += every


def test_known_total_work_gives_exact_remaining_time():
    est = OnlineEstimator(total_work=2000.0)
    feed_linear(est, rate=10.0, until=100.0)
    e = est.estimate(100.0)
    assert e.remaining_s == pytest.approx(100.0, rel=1e-6)
    assert e.finish_time == pytest.approx(200.0)
    assert e.low_s <= e.remaining_s <= e.high_s


def test_start_time_offsets_absolute_clock():
    est = OnlineEstimator(start_time=1_000_000.0, total_work=2000.0)
    for i in range(1, 11):
        est.observe(1_000_000.0 + 10 * i, progress=100.0 * i)
    assert est.estimate(1_000_100.0).finish_time == pytest.approx(1_000_200.0)


def test_target_curve_predicts_finish_without_history():
    # metric = 0.95 - 0.9 exp(-p / 300); target 0.8 is met at p ~ 537, i.e. t ~ 53.7 s.
    est = OnlineEstimator(target=0.8, mode="max")
    feed_linear(est, rate=10.0, until=35.0, every=3.0, metric=lambda p: 0.95 - 0.9 * math.exp(-p / 300))
    e = est.estimate(35.0)
    assert 35.0 + e.remaining_s == pytest.approx(53.7, rel=0.2)


def test_min_mode_target_is_met_when_metric_drops_below():
    est = OnlineEstimator(target=1.0, mode="min")
    est.observe(10.0, progress=5.0, metric_value=1.5)
    assert est.estimate(10.0).method != "reached"
    est.observe(20.0, progress=10.0, metric_value=0.9)
    assert est.estimate(20.0) == (0.0, 20.0, 0.0, 0.0, "reached")


def test_history_prior_alone_before_any_progress():
    prior = HistoryPrior(
        duration_s=500.0, duration_low_s=400.0, duration_high_s=650.0, work=5000.0, work_low=4000.0, work_high=6000.0
    )
    e = OnlineEstimator(prior=prior).estimate(100.0)
    assert e.remaining_s == pytest.approx(400.0, rel=0.01)
    assert e.method == "history"
    assert e.low_s < e.remaining_s < e.high_s


def test_live_throughput_takes_over_from_history():
    prior = HistoryPrior(
        duration_s=5000.0, duration_low_s=4000.0, duration_high_s=6000.0, work=2000.0, work_low=1800.0, work_high=2200.0
    )
    est = OnlineEstimator(prior=prior)
    feed_linear(est, rate=10.0, until=100.0)
    e = est.estimate(100.0)
    # the live rate says 200 s, far outside the history's 4,000-6,000 s: its speed is contradicted (other
    # hardware than it assumed), so the history's duration leaves the blend instead of dragging it 25x long
    assert 100.0 + e.remaining_s == pytest.approx(200.0, rel=0.01)
    assert e.method == "throughput"


def test_history_that_agrees_with_the_live_rate_stays_in_the_blend():
    prior = HistoryPrior(
        duration_s=220.0, duration_low_s=180.0, duration_high_s=260.0, work=2000.0, work_low=1800.0, work_high=2200.0
    )
    est = OnlineEstimator(prior=prior)
    feed_linear(est, rate=10.0, until=40.0)
    e = est.estimate(40.0)
    assert "history" in e.method.split("+")
    assert 200.0 < 40.0 + e.remaining_s < 220.0  # between what the rate and the history say


def unseen_prior(duration_s: float) -> HistoryPrior:
    """A benchmark the model never trained on: a guess with a band of a factor ~30 either way."""
    return HistoryPrior(
        duration_s=duration_s,
        duration_low_s=duration_s / 30,
        duration_high_s=duration_s * 30,
        work=500.0,
        work_low=5.0,
        work_high=50_000.0,
        benchmark="new",
        seen=False,
    )


@pytest.mark.parametrize("guess, kept", [(100_000.0, False), (60.0, True)])
def test_an_unseen_benchmarks_guess_leaves_the_blend_once_its_own_curve_contradicts_it(guess, kept):
    # metric = 0.95 - 0.9 exp(-p / 300) reaches 0.8 at p ~ 537, t ~ 54 s; the guess says 100,000 s (28 hours,
    # its band down to 3,300 s: another hardware than it assumed) or 60 s (the band holds what the curve says)
    est = OnlineEstimator(target=0.8, mode="max", prior=unseen_prior(guess))
    before = est.components(1.0)["history"]
    feed_linear(est, rate=10.0, until=35.0, every=3.0, metric=lambda p: 0.95 - 0.9 * math.exp(-p / 300))
    comps = est.components(35.0)
    assert before is not None and comps["curve"] == pytest.approx(54.0, rel=0.2)
    assert (comps["history"] is not None) == kept
    if not kept:  # what is left is the job's own curve, not a pull toward a day
        assert 35.0 + est.estimate(35.0).remaining_s == pytest.approx(54.0, rel=0.3)


def test_no_information_gives_nan():
    assert math.isnan(OnlineEstimator().estimate(10.0).remaining_s)


def test_memory_is_capped():
    """The cost per update is measured by bench/eta/bench_online.py, not asserted on a shared machine."""
    est = OnlineEstimator(target=0.99, mode="max")
    for i in range(1, 3001):
        est.observe(float(i), progress=float(i), metric_value=1 - 1 / (i + 1) if i % 10 == 0 else None)
        est.estimate(float(i))
    assert len(est._marks_t) <= MAX_MARKS and len(est._metric_x) <= 64


def test_rejects_unknown_mode():
    with pytest.raises(ValueError):
        OnlineEstimator(mode="up")


def test_metric_without_progress_is_fitted_against_time():
    # loss = 0.5 + 2 exp(-t / 100) reaches 0.6 at t = 100 ln 20 ~ 300 s.
    est = OnlineEstimator(target=0.6, mode="min")
    for t in range(10, 160, 10):
        est.observe(float(t), metric_value=0.5 + 2 * math.exp(-t / 100))
    e = est.estimate(150.0)
    assert e.method == "curve"
    assert 150.0 + e.remaining_s == pytest.approx(300.0, rel=0.2)


def test_evaluation_repeating_the_last_progress_does_not_read_as_a_stall():
    # MLPerf logs a block's end and then its evaluation at the same sample count, seconds later.
    est = OnlineEstimator(total_work=4000.0)
    est.observe(100.0, progress=1000.0)
    est.observe(120.0, progress=1000.0, metric_value=0.5)
    rate, t_last, p_last = est.rate()
    assert rate == pytest.approx(10.0) and (t_last, p_last) == (100.0, 1000.0)
    assert est.estimate(130.0).remaining_s == pytest.approx(270.0)


def test_an_unseen_benchmark_s_prior_work_does_not_drive_the_rate_estimate():
    from services.estimator.model.history import UNSEEN

    wild = HistoryPrior(
        duration_s=5000.0,
        duration_low_s=1.0,
        duration_high_s=1e7,
        work=1e9,
        work_low=1.0,
        work_high=1e12,
        benchmark="never_seen",
        seen=False,
    )
    est = OnlineEstimator(target=0.8, mode="max", prior=wild)
    feed_linear(est, rate=10.0, until=35.0, every=3.0, metric=lambda p: 0.95 - 0.9 * math.exp(-p / 300))
    comps = est.components(35.0)
    assert est.key == UNSEEN and comps["throughput"] is None  # 1e9 units of work at 10 a second: not believed
    assert comps["curve"] == pytest.approx(53.7, rel=0.2)  # its own curve says when it meets the target
    assert max(v for v in comps.values() if v) <= 3 * wild.duration_s  # no centuries from a guessed band


def test_survived_is_the_median_given_what_is_already_passed():
    from services.estimator.model.online import survived

    assert survived(100.0, 70.0, 140.0, passed=10.0) == pytest.approx(100.0, rel=1e-6)  # early: the median
    assert survived(100.0, 70.0, 140.0, passed=100.0) == pytest.approx(120.0, rel=0.01)  # the upper half's median
    late = survived(100.0, 70.0, 140.0, passed=200.0)
    assert 200.0 < late < 220.0  # far past every run of its kind: a little more, not "now"
    assert survived(100.0, 100.0, 100.0, passed=150.0) == 150.0  # no spread known: nothing to add


def test_a_run_past_the_history_s_work_is_not_finishing_now():
    prior = HistoryPrior(
        duration_s=100.0, duration_low_s=80.0, duration_high_s=125.0, work=1000.0, work_low=800.0, work_high=1250.0
    )
    est = OnlineEstimator(prior=prior, target=0.9)
    feed_linear(est, rate=10.0, until=110.0)  # 1,100 done, the target not met
    comps = est.components(110.0)
    assert 115.0 < comps["throughput"] < 135.0  # the work of runs that needed more than 1,100
    assert comps["history"] > 110.0
    assert comps[BASELINE] == pytest.approx(110.0)  # the baseline itself: median work over the rate, "now"
    early = OnlineEstimator(prior=prior, target=0.9)
    feed_linear(early, rate=10.0, until=50.0)
    assert early.components(50.0)[BASELINE] == pytest.approx(100.0)  # 500 left of 1,000 at 10 a second


def test_a_curve_whose_families_disagree_is_a_loose_curve():
    import random

    rng = random.Random(0)
    tight = OnlineEstimator(target=0.8, mode="max")
    feed_linear(tight, rate=10.0, until=35.0, every=3.0, metric=lambda p: 0.95 - 0.9 * math.exp(-p / 300))
    assert set(k for k, v in tight.snapshot(35.0)[1].items() if v) == {"curve"}
    plateau = OnlineEstimator(target=0.9, mode="max")  # flat just under its target: where it crosses is unknown
    for i in range(1, 13):
        plateau.observe(10.0 * i, progress=100.0 * i, metric_value=0.88 - 0.3 / i + rng.uniform(-0.004, 0.004))
    assert set(k for k, v in plateau.snapshot(120.0)[1].items() if v) == {"curve_loose"}


@pytest.mark.parametrize(
    "mode, metric, target",
    [("max", lambda p: 0.95 - 0.9 * math.exp(-p / 300), 0.8), ("min", lambda p: 0.05 + 0.9 * math.exp(-p / 300), 0.2)],
)
def test_an_unseen_benchmark_s_own_curve_is_read_by_the_learned_curve_prior(mode, metric, target):
    # the target is met at p ~ 537, t ~ 54 s; by t = 20 s the job has printed 6 points;
    # the history's guess, from other benchmarks, says 100,000 s
    unseen = OnlineEstimator(target=target, mode=mode, prior=unseen_prior(100_000.0))
    seen = OnlineEstimator(target=target, mode=mode, prior=dataclasses.replace(unseen_prior(60.0), seen=True))
    feed_linear(unseen, rate=10.0, until=9.0, every=3.0, metric=metric)
    assert unseen.components(9.0)["curve_prior"] is None  # three points: too short a prefix to read
    unseen = OnlineEstimator(target=target, mode=mode, prior=unseen_prior(100_000.0))
    for est in (unseen, seen):
        feed_linear(est, rate=10.0, until=20.0, every=3.0, metric=metric)
    comps = unseen.components(20.0)
    assert 54.0 / 2 < comps["curve_prior"] < 54.0 * 2  # its own curve, not the day the guess says
    assert seen.components(20.0).get("curve_prior") is None  # a seen benchmark's calibration is left as it was
