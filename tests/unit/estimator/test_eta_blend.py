import math

import numpy as np
import pytest

from services.estimator.model.blend import blend, bucket, fit_table


def samples(n=400, seed=0):
    """History is noisy (20%) and 10% long; throughput is precise (3%) but 5% short."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        truth = float(rng.uniform(100, 1000))
        out.append({"key": "bert", "fraction": 0.25, "truth": truth, "components": {
            "history": truth * math.exp(0.1 + rng.normal(0, 0.2)),
            "throughput": truth * math.exp(-0.05 + rng.normal(0, 0.03)),
        }})
    return out


def test_bucket_edges():
    assert bucket(0.0) == 0 and bucket(0.04) == 0 and bucket(0.05) == 1 and bucket(0.95) == 9


def test_fit_table_prefers_the_precise_component_and_removes_bias():
    table = fit_table(samples())
    cell = table["bert"][str(bucket(0.25))]
    assert cell["w"]["throughput"] > 0.9
    assert cell["cbias"]["throughput"] == pytest.approx(-0.05, abs=0.01)
    truth = 500.0
    total, low, high, method = blend({"history": truth * 1.1, "throughput": truth * math.exp(-0.05)},
                                     fraction=0.25, key="bert", table=table)
    assert total == pytest.approx(truth, rel=0.02)
    assert method.startswith("throughput")


def test_band_covers_about_80_percent_of_fresh_samples():
    table = fit_table(samples(seed=1))
    test = samples(seed=2)
    inside = 0
    for s in test:
        _, low, high, _ = blend(s["components"], fraction=s["fraction"], key="bert", table=table)
        inside += low <= s["truth"] <= high
    assert 0.7 <= inside / len(test) <= 0.9


def test_unknown_key_falls_back_to_star_and_missing_table_to_defaults():
    table = fit_table(samples())
    total, *_ = blend({"throughput": 100.0}, fraction=0.25, key="other", table=table)
    assert total == pytest.approx(100.0 * math.exp(0.05), rel=0.02)
    total, low, high, method = blend({"history": 100.0}, fraction=0.0, key="x", table=None)
    assert (total, method) == (pytest.approx(100.0), "history") and low < 100.0 < high


def test_no_components_gives_nan():
    assert math.isnan(blend({"history": None}, fraction=0.1, key="x", table=None)[0])


def correlated_samples(n=600, seed=0, fraction=0.85):
    """Late in a run: throughput and history share the history's work error; history adds its speed's error."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        truth = float(rng.uniform(100, 1000))
        work = rng.normal(0, 0.1)
        out.append({"key": "bert", "fraction": fraction, "truth": truth, "components": {
            "throughput": truth * math.exp(work + rng.normal(0, 0.02)),
            "history": truth * math.exp(work + rng.normal(0, 0.1)),
        }})
    return out


def test_a_second_opinion_repeating_the_first_one_s_error_gets_little_weight():
    # Inverse variances alone would give the history a third of the weight (its variance is twice the
    # throughput's); their covariance says it adds almost nothing the throughput does not already carry.
    cell = fit_table(correlated_samples())["bert"][str(bucket(0.85))]
    weights = cell["ws"]["history+throughput"]
    assert weights["history"] < 0.1 and weights["throughput"] == pytest.approx(1 - weights["history"])
    assert cell["w"]["history"] > 0.25  # what the former weights said
    assert cell["ws"]["history"] == {"history": 1.0}


def test_late_in_a_run_a_prior_far_off_gives_way_to_work_over_the_live_rate():
    table = fit_table(correlated_samples())
    live = 500.0  # the work the history says, at the live rate: what "median work / live throughput" says
    total, *_ = blend({"throughput": live, "history": 1.8 * live}, fraction=0.85, key="bert", table=table)
    assert total == pytest.approx(live, rel=0.05)


def test_a_loose_curve_is_calibrated_apart_and_an_old_table_reads_it_as_a_curve():
    rng = np.random.default_rng(3)
    rows = []
    for i in range(400):
        truth = float(rng.uniform(100, 1000))
        name, sd = ("curve", 0.03) if i % 2 else ("curve_loose", 0.5)
        rows.append({"key": "bert", "fraction": 0.5, "truth": truth, "components": {
            "throughput": truth * math.exp(rng.normal(0, 0.1)), name: truth * math.exp(rng.normal(0, sd))}})
    cell = fit_table(rows)["bert"][str(bucket(0.5))]
    assert cell["ws"]["curve+throughput"]["curve"] > 0.8
    assert cell["ws"]["curve_loose+throughput"]["curve_loose"] < 0.1
    old = {"*": {str(bucket(0.5)): {"w": {"throughput": 0.5, "curve": 0.5}, "cbias": {}, "q": (-0.1, 0.1),
                                    "bias": 0.0}}}
    total, *_ , method = blend({"throughput": 100.0, "curve_loose": 400.0}, fraction=0.5, key="bert", table=old)
    assert total == pytest.approx(200.0) and set(method.split("+")) == {"throughput", "curve"}
