"""The fitted curve's power law (issue 31's too-short deep targets): the vectorised fit is the former fit, and the
fit weighed to the tail, a build option, is read back by the live estimate as the calibration says."""

import math

import numpy as np
import pytest

from services.estimator.model.curves import crossing, fit_family
from services.estimator.model.owncurve import (
    FEATURES,
    PLAIN,
    TAIL,
    fit_power,
    line_slope,
    own_estimate,
    power_crossing,
    read_prefix,
)


def deep_curve(n=1000, every=10.0):
    """Issue 31's kind of job, noise-free: `0.012 + 0.6·(1 + s/30)^-0.9` printed every 10 steps, target 0.02."""
    s = np.arange(1, n + 1) * every
    return s, 0.012 + 0.6 * (1 + s / 30) ** -0.9


def test_the_vectorised_power_fit_is_the_former_fit():
    """Every shape of the grid solved at once gives `curves.fit_family`'s parameters and crossing (same grid,
    same refinement, the least squares in closed form): what every fold's samples are made of is unchanged."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(5, 150))
        x = np.sort(rng.uniform(0.01, 1.0, n))
        x /= x[-1]
        y = -(0.1 + rng.uniform(0.1, 2) * x ** -rng.uniform(0.05, 3)) + rng.normal(0, rng.uniform(0, 0.3), n)
        former, now = fit_family("power", x, y), fit_power(x, y)
        assert (former is None) == (now is None)
        if former is None or now is None:
            continue
        assert np.allclose(now, former.params, rtol=1e-7, atol=1e-9)
        a, b = crossing("power", former.params, -0.3), crossing("power", now, -0.3)
        assert (math.isinf(a) and math.isinf(b)) or math.isclose(a, b, rel_tol=1e-7)
    assert fit_power(np.linspace(0.1, 1, 8), np.linspace(1.0, 0.0, 8)) is None  # a curve getting worse: no fit


def test_the_closed_form_slope_is_polyfits():
    rng = np.random.default_rng(1)
    for n in (2, 3, 10, 200):
        x, y = np.sort(rng.uniform(0.1, 5, n)), rng.normal(size=n)
        assert math.isclose(line_slope(x, y), float(np.polyfit(x, y, 1)[0]), rel_tol=1e-9, abs_tol=1e-12)


def test_the_power_law_weighed_to_its_tail_reaches_a_deep_target_nearer_the_truth():
    """Fitted on the raw values, the high early values decide the power law and it crosses a deep target at about
    half the truth's progress; each residual over its way left to the target, the tail decides (docs: 53% -> 79%
    at half the run on this curve)."""
    s, v = deep_curve()
    truth = float(s[np.argmax(v <= 0.02)])
    for seen in (0.3, 0.5, 0.8):
        keep = s <= seen * truth
        plain = power_crossing(s[keep], v[keep], 0.02) / truth
        tail = power_crossing(s[keep], v[keep], 0.02, power_fit=TAIL) / truth
        assert plain < tail <= 1.0
    keep = s <= 0.5 * truth
    assert power_crossing(s[keep], v[keep], 0.02) / truth < 0.6
    assert power_crossing(s[keep], v[keep], 0.02, power_fit=TAIL) / truth > 0.7
    with pytest.raises(ValueError, match="power_fit"):
        power_crossing(s[keep], v[keep], 0.02, power_fit="tails")


def test_the_weighted_fit_survives_a_point_at_or_below_the_target():
    """A noisy print that touched the target before the last one (the way left 0 or negative) does not divide by
    zero: it weighs as a point at the floor of the way."""
    s, v = deep_curve(200)
    v = v.copy()
    v[50] = 0.019  # below the target 0.02, then back above
    got = power_crossing(s, v, 0.02, power_fit=TAIL)
    assert math.isinf(got) or got > 0


def _reader(feature: str) -> dict:
    """A calibration whose one network's median is the feature `feature` itself (log of the total over the time
    so far), its band as wide as softplus(0) either side."""
    weights = [[0.0] * len(FEATURES) for _ in range(3)]
    weights[0][FEATURES.index(feature)] = 1.0
    net = {"mean": [0.0] * len(FEATURES), "std": [1.0] * len(FEATURES), "layers": [[weights, [0.0, 0.0, 0.0]]]}
    return {"features": list(FEATURES), "nets": [net], "pads": [], "pad_edges": []}


def test_the_live_estimate_reads_the_power_law_as_its_calibration_was_fitted():
    """A calibration fitted on the tail-weighted feature says so (`power_fit`), and the live estimate reads the
    prefix the same way; one that names a fit this code does not know is not read at all (the uncalibrated
    band), rather than read with features it was not fitted on."""
    s, v = deep_curve()
    keep = s <= 1800
    ts, xs, vs = list(s[keep] / 10), list(s[keep]), list(v[keep])
    now = ts[-1]
    plain_cal, tail_cal = _reader("power"), _reader("power") | {"power_fit": TAIL}
    plain = own_estimate(ts, xs, vs, target=0.02, mode="min", elapsed=now, calibration=plain_cal)
    tail = own_estimate(ts, xs, vs, target=0.02, mode="min", elapsed=now, calibration=tail_cal)
    assert plain is not None and tail is not None and plain.kind == tail.kind == "curve-learned"
    for got, fit in ((plain, PLAIN), (tail, TAIL)):
        read = read_prefix(ts, xs, vs, target=0.02, mode="min", elapsed=now, power_fit=fit)
        assert read is not None
        expected = read.origin + read.span * math.exp(read.features[FEATURES.index("power")])
        assert math.isclose(got.total_s, expected, rel_tol=1e-9)
    assert tail.total_s > 1.2 * plain.total_s
    unknown = own_estimate(
        ts, xs, vs, target=0.02, mode="min", elapsed=now, calibration=plain_cal | {"power_fit": "cubic"}
    )
    assert unknown is not None and unknown.kind == "curve"
