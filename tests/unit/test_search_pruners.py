"""The search pruners and the curve projection: pure functions of trials' points."""

import math

import pytest

from services.submitter.searches.curvefit import project
from services.submitter.searches.pruners import Config, Point, Trial, decide, horizon


def curve(
    number: int,
    *,
    floor: float,
    steps: int = 20,
    upto: int | None = None,
    done: bool = False,
    start: float = 0.0,
    stopped: bool = False,
) -> Trial:
    """A saturating loss curve reaching `floor`, one point a step, a second apart."""
    upto = steps if upto is None else upto
    points = tuple(Point(start + s, s, floor + 2.0 * math.exp(-s / 4)) for s in range(1, upto + 1))
    return Trial(trial=number, points=points, done=done, stopped=stopped)


def test_none_never_prunes():
    trials = [curve(0, floor=0.1, done=True), curve(1, floor=5.0, upto=10)]
    assert decide("none", trials) == {}


def test_horizon_is_given_or_learned_from_the_first_completed_trial():
    assert horizon([curve(0, floor=1, upto=5)], None) is None
    assert horizon([curve(0, floor=1, upto=5)], 40) == 40
    assert (
        horizon([curve(0, floor=1, steps=20, done=True), curve(1, floor=1, steps=30, done=True, start=100)], None) == 20
    )


def test_median_stops_a_trial_worse_than_the_completed_median_and_keeps_a_good_one():
    done = [curve(k, floor=0.1 * (k + 1), done=True) for k in range(3)]
    bad, good = curve(3, floor=3.0, upto=8, start=50), curve(4, floor=0.05, upto=8, start=50)
    pruned = decide("median", [*done, bad, good])
    assert list(pruned) == [3] and "median" in pruned[3]


def test_median_waits_for_its_startup_trials():
    trials = [curve(0, floor=0.1, done=True), curve(1, floor=3.0, upto=10, start=30)]
    assert decide("median", trials) == {}


def test_hyperband_stops_the_worse_trials_at_a_rung_and_keeps_the_best():
    done = curve(0, floor=0.1, steps=81, done=True)
    running = [curve(k, floor=1.0 * k, upto=9, start=100 + k) for k in range(1, 10)]
    pruned = decide("hyperband", [done, *running], key="s-test", config=Config(hb_min_fraction=1 / 81))
    assert pruned and 1 not in pruned  # the best running trial always goes on
    assert all(k in range(2, 10) for k in pruned) and all("hyperband" in why for why in pruned.values())


def test_hyperband_compares_at_a_rung_with_the_trials_that_reached_it_before():
    """Optuna's rule: of the values recorded at a rung so far (its own included), the best 1/eta go on."""
    first = curve(0, floor=0.1, steps=81, done=True)  # reached step 9 first, at 0.31
    worse, better = curve(1, floor=1.0, upto=9, start=100), curve(2, floor=0.0, upto=9, start=200)
    pruned = decide("hyperband", [first, worse, better], key="s-test")
    assert list(pruned) == [1] and "rung 0 (step 9)" in pruned[1]


def test_hyperband_decides_the_same_from_the_same_points():
    trials = [curve(0, floor=0.1, steps=81, done=True), *[curve(k, floor=k, upto=27, start=k) for k in range(1, 9)]]
    assert decide("hyperband", trials, key="s-x") == decide("hyperband", list(reversed(trials)), key="s-x")


def test_predicted_stops_a_trial_that_cannot_catch_up_and_keeps_one_that_can():
    best = curve(0, floor=0.1, done=True)
    hopeless = curve(1, floor=2.0, upto=10, start=30)
    close = curve(2, floor=0.09, upto=10, start=30)
    pruned = decide("predicted", [best, hopeless, close])
    assert list(pruned) == [1] and "predicted" in pruned[1]


def test_predicted_waits_for_min_progress_and_never_stops_a_finished_trial():
    best = curve(0, floor=0.1, done=True)
    early = curve(1, floor=2.0, upto=2, start=30)
    finished = curve(2, floor=3.0, done=True, start=60)
    assert decide("predicted", [best, early, finished], config=Config(min_progress=0.2)) == {}


def test_projection_of_a_saturating_curve_lands_near_its_floor_with_an_optimistic_low_bound():
    steps = list(range(1, 11))
    values = [0.5 + 2.0 * math.exp(-s / 4) for s in steps]
    result = project(steps, values, horizon=20)
    assert result.low <= result.value <= result.high == pytest.approx(values[-1])
    assert result.value == pytest.approx(0.5 + 2.0 * math.exp(-5), abs=0.2)


def test_projection_needs_enough_points():
    assert project([1, 2, 3], [3.0, 2.0, 1.0], horizon=10) is None


def test_unknown_pruner_is_refused():
    with pytest.raises(ValueError):
        decide("bogus", [curve(0, floor=1, done=True), curve(1, floor=2, upto=5)], max_step=20)


def test_predicted_gives_a_trial_the_late_drop_a_completed_trial_had_after_the_same_step():
    """A step schedule: flat at 2.0 until step 15, then down to 0.5; a rival finished at 1.0 earlier."""

    def stepped(number: int, *, upto: int, done: bool, start: float) -> Trial:
        values = [2.0 + 0.01 * (20 - s) if s < 15 else 0.5 for s in range(1, upto + 1)]
        return Trial(
            trial=number, points=tuple(Point(start + s, s, v) for s, v in zip(range(1, upto + 1), values)), done=done
        )

    finished = stepped(0, upto=20, done=True, start=0)
    rival = curve(1, floor=1.0, done=True, start=30)
    plateau = stepped(2, upto=12, done=False, start=60)
    assert 2 in decide("predicted", [finished, rival, plateau], config=Config(history=0.0))
    assert decide("predicted", [finished, rival, plateau], config=Config(history=1.0)) == {}


def plateau(number: int, *, level: float, upto: int = 16, start: float = 100.0, done: bool = False) -> Trial:
    """A trial that has flattened at `level` (a flat curve: the projection's optimistic bound sits near it)."""
    points = tuple(Point(start + s, s, level + 0.5 * math.exp(-s)) for s in range(1, upto + 1))
    return Trial(trial=number, points=points, done=done)


def test_predicted_makes_no_decision_on_a_near_tie_and_records_the_projection_it_stopped_on():
    """A trial whose optimistic bound (3 sigma) reaches within the margin (0.2%) of the best is left to run; a stop
    says what it was made on: the projection, its optimistic bound, the bar, the step, the sigmas and the margin."""
    best = plateau(0, level=0.05, upto=20, start=0.0, done=True)
    near = plateau(1, level=0.0502)  # 0.4% above the best: inside its bound (3 sigma) and the margin
    far = plateau(2, level=0.2)  # four times the best
    pruned = decide("predicted", [best, near, far], max_step=20)
    assert list(pruned) == [2]
    reason = pruned[2]
    assert reason.startswith("predicted: final value projected 0.") and "cannot beat 0.05: at step 16 of 20" in reason
    assert "3 sigma, near-tie margin 0.2% (stops only above 0.0501)" in reason
    assert 1 in decide("predicted", [best, near, far], max_step=20, config=Config(margin=0.0, z=0.0))


def test_a_tiny_horizon_and_a_huge_step_neither_overflow_nor_wedge_the_search():
    """`low * eta**k` counted rungs on until the power overflowed: every pass of the search failed (review)."""
    hostile = Trial(trial=0, points=(Point(1.0, 1e300, 0.5), Point(2.0, 1e300, 0.4)), done=False)
    other = curve(1, floor=0.3, upto=5)
    assert isinstance(decide("hyperband", [hostile, other], max_step=1e-300, key="s"), dict)


def test_one_point_a_running_trial_printed_once_prunes_no_other():
    """A running trial's single `loss 0.0` became the bar every other trial was measured against (review): a value
    counts once the trial held it over two points in a row."""
    spike = Trial(trial=0, points=tuple(Point(float(s), s, 0.0 if s == 5 else 2.0) for s in range(1, 12)), done=False)
    honest = [curve(n, floor=0.5 + 0.1 * n, upto=12, steps=20) for n in (1, 2, 3)]
    assert decide("predicted", [spike, *honest], max_step=20) == {}
