"""The own-curve ETA (a job that declares a target and nothing else): curve reading, learned band, corpus."""

import math

import numpy as np
import pytest

from services.estimator.model import owncorpus
from services.estimator.model.owncurve import (
    FEATURES,
    OwnEstimate,
    learned_quantiles,
    load_calibration,
    own_estimate,
    progress_rate,
    quantile_net,
    read_prefix,
)
from services.estimator.owneval import previous_rate


def loss_curve(n=40, *, every=10, rate=50.0, offset=0.0, floor=0.05):
    """(t, step, loss) of a power-law loss printed every `every` steps at `rate` steps a second after `offset` s."""
    steps = [every * (i + 1) for i in range(n)]
    return (
        [offset + s / rate for s in steps],
        [float(s) for s in steps],
        [floor + 2.2 * (1 + s / 100) ** -0.9 for s in steps],
    )


def test_the_progress_rate_follows_a_change_of_pace():
    ts = np.array([float(t) for t in range(1, 11)] + [10 + 2 * k for k in range(1, 6)])
    xs = np.array([10.0 * t for t in range(1, 11)] + [100 + 10 * k for k in range(1, 6)])  # 10/s, then 5/s
    rate = progress_rate(ts, xs, elapsed=float(ts[-1]))
    plain = np.polyfit(ts, xs, 1)[0]  # every mark alike: 7.4/s
    assert 5.0 < rate < plain - 0.5  # recent marks weigh more: toward the new pace
    assert progress_rate(np.array([1.0, 2.0]), np.array([5.0, 5.0]), elapsed=2.0) is None  # stalled


def test_a_slow_start_up_is_not_read_as_slow_training():
    ts, xs, ys = loss_curve(20)
    late_ts = [t + 30.0 for t in ts]
    a = read_prefix(ts, xs, ys, target=0.2, mode="min", elapsed=ts[-1])
    b = read_prefix(late_ts, xs, ys, target=0.2, mode="min", elapsed=late_ts[-1])
    assert b.origin == pytest.approx(a.origin + 30.0, abs=1e-6)
    assert b.features == pytest.approx(a.features) and b.span == pytest.approx(a.span)


def test_a_maximised_metric_reads_like_a_minimised_one():
    ts, xs, ys = loss_curve(20)
    low = read_prefix(ts, xs, ys, target=0.2, mode="min", elapsed=ts[-1])
    high = read_prefix(ts, xs, [-y for y in ys], target=-0.2, mode="max", elapsed=ts[-1])
    shape = FEATURES.index("depth")  # the curve's shape reads alike; its depth needs a floor (a negated loss has none)
    assert high.features[:shape] == pytest.approx(low.features[:shape])
    with pytest.raises(ValueError, match="mode"):
        read_prefix(ts, xs, ys, target=0.2, mode="up", elapsed=ts[-1])


def test_nothing_to_extrapolate_gives_no_estimate_and_a_met_target_gives_zero():
    rising = [1.0 + 0.1 * i for i in range(6)]
    assert own_estimate(list(range(1, 7)), None, rising, target=0.0, mode="min", elapsed=6.0, calibration=None) is None
    assert own_estimate([1.0], [10.0], [2.0], target=0.1, mode="min", elapsed=1.0, calibration=None) is None
    done = own_estimate([1.0, 2.0, 3.0], None, [1.0, 0.5, 0.09], target=0.1, mode="min", elapsed=3.5, calibration=None)
    assert done == OwnEstimate(3.5, 3.5, 3.5, "reached", 1.0)


def test_without_a_calibration_the_band_is_wide_and_ordered():
    ts, xs, ys = loss_curve(15)
    est = own_estimate(ts, xs, ys, target=0.2, mode="min", elapsed=ts[-1] + 0.5, calibration=None)
    assert est.kind == "curve" and est.low_s <= est.total_s <= est.high_s
    assert est.high_s / est.low_s > 2


def test_the_shipped_calibration_was_learned_without_the_held_out_seeds():
    table = load_calibration()
    assert table is not None, "services/estimator/model/owncurve.json is missing: python -m bench.search.calibrate"
    assert table["features"] == list(FEATURES)
    assert sorted(table["held_out_seeds"]) == sorted(owncorpus.HELD_OUT_SEEDS)
    rng = np.random.default_rng(0)
    assert len(table["nets"]) >= 2 and len(table["pads"]) == len(table["pad_edges"]) + 1
    for net in table["nets"]:
        for _ in range(20):
            q10, q50, q90 = quantile_net(rng.normal(size=len(FEATURES)) * 2, net)
            assert q10 <= q50 <= q90 and all(math.isfinite(q) for q in (q10, q50, q90))


def test_the_shipped_calibration_was_fitted_on_every_family_the_estimator_is_tuned_on():
    """`owncurve.json` is refitted with the families the prior and the blend table are tuned on (eleven since the
    third round of issue 31), never on the unseen split's."""
    table = load_calibration()
    assert table is not None
    trained = owncorpus.load_corpus(owncorpus.TRAINED)
    if not trained:
        pytest.skip("the recorded corpus is not in this checkout")
    assert table["runs"] == len(trained)
    assert table["groups"] == sorted({r["group"] for r in trained})
    unseen = {r["group"] for r in owncorpus.load_corpus(owncorpus.UNSEEN)}
    assert not unseen & set(table["groups"])


def run(points, *, seed=0, name="r1"):
    return {"run": name, "group": "g", "params": {"seed": seed}, "points": points}


def test_a_case_is_timed_at_the_first_value_meeting_its_target():
    points = [{"t": 0.1 * i, "step": 10 * i, "loss": 2.0 / i} for i in range(1, 61)]
    case = owncorpus.make_case(run(points), "loss", u=0.5, smooth=False)
    target_at = max(i for i, p in enumerate(points) if p["t"] <= 0.5 * points[-1]["t"])
    assert case.target == pytest.approx(points[target_at]["loss"])  # a falling curve: the median is that point
    assert case.truth == pytest.approx(points[target_at]["t"]) and len(case.ts) == target_at + 1
    early = [{"t": 0.1 * i, "step": 10 * i, "loss": 1.0 if i > 3 else 2.0} for i in range(1, 61)]
    assert owncorpus.make_case(run(early), "loss", u=0.5, smooth=False) is None  # met in its first lines: no ETA needed
    printed = owncorpus.make_case(run(points), "loss", u=0.5, smooth=True)  # a running mean: met a little later
    assert printed.values[-1] <= printed.target and printed.truth >= case.truth


def test_a_run_printing_a_running_mean_is_taken_as_printed_and_a_regression_has_no_accuracy_case():
    points = [{"t": 0.1 * i, "step": 10 * i, "loss": 2.0 / i, "val_acc": None} for i in range(1, 61)]
    averaged = {"run": "m1", "group": "np-mlp-mean", "params": {"seed": 0, "mean": 50}, "points": points}
    assert owncorpus.make_case(averaged, "loss", u=0.5, smooth=True) == owncorpus.make_case(
        averaged, "loss", u=0.5, smooth=False
    )
    assert owncorpus.make_case(averaged, "val_acc", u=0.5) is None


def test_the_band_is_the_ensembles_mean_widened_by_the_pads_of_its_phase():
    def constant(mid, gap):  # a "network" that ignores its input: (mid - gap, mid, mid + gap) with softplus gaps
        raw = math.log(math.expm1(gap))
        return {
            "mean": [0.0] * len(FEATURES),
            "std": [1.0] * len(FEATURES),
            "layers": [[[[0.0] * len(FEATURES)] * 3, [mid, raw, raw]]],
        }

    table = {
        "nets": [constant(1.0, 0.5), constant(2.0, 0.5)],
        "pad_edges": [0.15, 0.25, 0.4, 0.6],
        "pads": [[0.0, 0.0], [0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]],
    }
    low, mid, high = learned_quantiles([0.0] * len(FEATURES), table)
    assert mid == pytest.approx(1.5)  # exp(-1.5) = 0.22 of the training seen: the second phase's pads
    assert low == pytest.approx(1.0 - 0.1) and high == pytest.approx(2.0 + 0.2)


def test_the_split_holds_seeds_out_and_a_missing_estimate_counts_as_a_miss():
    points = [{"t": 0.1 * i, "step": 10 * i, "loss": 2.0 / i} for i in range(1, 61)]
    cases = owncorpus.cases([run(points, seed=s, name=f"r{s}") for s in range(5)], "loss")
    train, test = owncorpus.split(cases)
    assert {c.seed for c in test} == set(owncorpus.HELD_OUT_SEEDS) and not {c.seed for c in train} & {4}
    rows = owncorpus.evaluate_cases(test, None, cuts=(0.01, 0.5))
    assert rows[0.01][0]["pred"] is None  # no point seen yet
    assert rows[0.5][0]["pred"] is not None and rows[0.5][0]["low"] <= rows[0.5][0]["high"]


def test_the_previous_rate_baseline_extrapolates_a_line():
    ts = [1.0, 2.0, 3.0, 4.0]
    total, low, high = previous_rate(ts, [0.9, 0.8, 0.7, 0.6], target=0.1, mode="min", now=4.0)
    assert total == pytest.approx(9.0) and low == pytest.approx(9.0) and high == pytest.approx(9.0)
    assert previous_rate(ts, [0.6, 0.7, 0.8, 0.9], target=0.1, mode="min", now=4.0) is None


@pytest.mark.skipif(not owncorpus.SWEEP.exists(), reason="the recorded sweep is not in this checkout")
def test_on_held_out_curves_the_band_narrows_as_the_run_goes():
    runs = owncorpus.load_sweep()
    _, test = owncorpus.split(owncorpus.cases(runs[:200], "loss"))
    rows = owncorpus.evaluate_cases(test, load_calibration(), cuts=(0.1, 0.8))
    assert owncorpus.band_width(rows[0.1]) > owncorpus.band_width(rows[0.8])


def test_the_depth_reads_how_many_times_a_loss_must_still_fall_which_the_way_left_hides():
    ts, xs, ys = loss_curve(30, floor=0.0)
    near = read_prefix(ts, xs, ys, target=ys[-1] * 0.9, mode="min", elapsed=ts[-1])  # 10% lower: nearly there
    far = read_prefix(ts, xs, ys, target=ys[-1] / 3, mode="min", elapsed=ts[-1])  # three times lower
    depth = FEATURES.index("depth")
    assert near.features[FEATURES.index("way")] > 0.9 and far.features[FEATURES.index("way")] > 0.6
    assert far.features[depth] == pytest.approx(near.features[depth] + math.log(3 * 0.9), abs=0.05)
    assert far.features[FEATURES.index("depth_slope")] < 0 and far.features[FEATURES.index("depth_ok")] == 1.0
    pace = FEATURES.index("depth_pace")  # at the late log-log slope, three times lower takes longer
    assert 0 < near.features[pace] < far.features[pace]


def test_an_accuracy_is_deep_by_its_error_and_a_metric_without_a_floor_has_no_depth():
    ts, xs, ys = loss_curve(30, floor=0.0)
    errors = [min(y / 3, 0.9) for y in ys]  # an error rate falling toward 0
    acc = read_prefix(ts, xs, [1 - e for e in errors], target=1 - errors[-1] / 2, mode="max", elapsed=ts[-1])
    err = read_prefix(ts, xs, errors, target=errors[-1] / 2, mode="min", elapsed=ts[-1])
    depth = [FEATURES.index(f) for f in ("depth", "depth_start", "depth_slope", "depth_pace", "depth_ok")]
    assert [acc.features[i] for i in depth] == pytest.approx([err.features[i] for i in depth])
    shifted = read_prefix(ts, xs, [y - 1.0 for y in ys], target=ys[-1] / 3 - 1.0, mode="min", elapsed=ts[-1])
    assert [shifted.features[i] for i in depth] == [0.0] * 5  # a negative value: no floor at zero to measure from
