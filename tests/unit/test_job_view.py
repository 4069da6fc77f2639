"""How a stored job is shown: the estimate counts down between the estimator's updates."""

from datetime import timedelta

from shared.events import Eta
from services.submitter.views import aged
from tests.factories import T0


def stored(remaining: float, low: float, high: float) -> dict:
    return Eta(
        remaining_s=remaining,
        finish_time=T0 + timedelta(seconds=remaining),
        low_s=low,
        high_s=high,
        method="throughput",
        updated_at=T0,
    ).model_dump(mode="json")


def test_the_estimate_counts_down_with_the_clock_and_keeps_its_finish_time():
    eta = aged(stored(100.0, 80.0, 130.0), T0 + timedelta(seconds=30))
    assert (eta.remaining_s, eta.low_s, eta.high_s) == (70.0, 50.0, 100.0)
    assert eta.finish_time == T0 + timedelta(seconds=100)


def test_an_overdue_estimate_stops_at_zero_and_none_stays_none():
    eta = aged(stored(10.0, 5.0, 20.0), T0 + timedelta(seconds=60))
    assert (eta.remaining_s, eta.low_s, eta.high_s) == (0.0, 0.0, 0.0)
    assert aged(None, T0) is None
    assert aged(stored(10.0, 5.0, 20.0), T0 - timedelta(seconds=5)).remaining_s == 10.0  # clocks a little apart
