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
