"""Thinning a curve keeps its whole run: the ends, and each slice's lowest and highest value."""

from services.estimator.thinning import thin


def test_a_short_curve_is_kept_whole():
    assert thin([1, 2, 3], 10, value=float) == [1, 2, 3]


def test_a_long_curve_keeps_its_ends_its_spike_and_its_order():
    points = [(t, 1.0 / (t + 1)) for t in range(10_000)]
    points[5_000] = (5_000, 9.0)  # a spike in the middle
    kept = thin(points, 200, value=lambda p: p[1])
    assert len(kept) <= 200 and kept[0] == points[0] and kept[-1] == points[-1]
    assert (5_000, 9.0) in kept
    assert [t for t, _ in kept] == sorted(t for t, _ in kept)
    assert kept[1][0] < 100  # the start of the run is there, not only its last 200 points
