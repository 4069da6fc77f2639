import math

import numpy as np
import pytest

from services.estimator.model.curves import crossing, fit_family, predict_crossing


@pytest.mark.parametrize(
    "name,true,params",
    [
        ("exp", lambda x: 0.9 - 0.8 * np.exp(-2.0 * x), None),
        ("power", lambda x: 0.9 - 0.3 * x**-0.7, None),
        ("optimus", lambda x: 1.0 - 1.0 / (4.0 * x + 1.5), None),
    ],
)
def test_each_family_fits_its_own_curve(name, true, params):
    x = np.linspace(0.1, 1.0, 12)
    fit = fit_family(name, x, true(x))
    assert fit is not None and fit.rmse < 0.01


def test_crossing_is_analytic_and_inf_when_unreachable():
    # exp: c - a*exp(-b x) = T  ->  x = -ln((c - T) / a) / b
    assert crossing("exp", (1.0, 2.0, 1.0), 0.5) == pytest.approx(math.log(2) / 2)
    assert crossing("power", (0.5, 1.0, 0.8), 0.9) == math.inf
    assert crossing("log", (0.5, 0.0), 0.9) == math.inf


def test_predict_crossing_extrapolates_a_saturating_curve():
    x = np.linspace(100, 500, 10)
    y = 0.95 - 0.9 * np.exp(-x / 300.0)
    truth = -300.0 * math.log((0.95 - 0.8) / 0.9)  # ~537
    cross, fits = predict_crossing(x, y, 0.8)
    assert fits
    assert cross == pytest.approx(truth, rel=0.15)


def test_predict_crossing_never_returns_a_point_behind_the_data():
    x = np.linspace(1, 10, 10)
    y = np.linspace(0.1, 0.5, 10)
    cross, _ = predict_crossing(x, y, 0.6)
    assert cross > 10 or cross == math.inf
