import math

import numpy as np
import pytest

from services.estimator.model.blend import BASELINE, BUCKET_EDGES, EDGES_KEY, EVAL_UNITS, blend, bucket
from services.estimator.model.blendfit import fit_table


def samples(n=400, seed=0):
    """History is noisy (20%) and 10% long; throughput is precise (3%) but 5% short."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        truth = float(rng.uniform(100, 1000))
        out.append(
            {
                "key": "bert",
                "fraction": 0.25,
                "truth": truth,
                "components": {
                    "history": truth * math.exp(0.1 + rng.normal(0, 0.2)),
                    "throughput": truth * math.exp(-0.05 + rng.normal(0, 0.03)),
                },
            }
        )
    return out


def test_bucket_edges():
    assert bucket(0.0) == 0 and bucket(0.04) == 0 and bucket(0.05) == 1 and bucket(0.95) == 11
    assert bucket(0.83) != bucket(0.99)  # near the end a run at 83% is not one that reads as done


def test_a_table_saved_before_the_late_buckets_is_read_with_its_own_edges():
    old = {"*": {"9": {"w": {"throughput": 1.0}, "cbias": {}, "q": (-0.1, 0.1), "bias": math.log(2.0)}}}
    total, *_ = blend({"throughput": 100.0}, fraction=0.85, key="bert", table=old)  # legacy bucket 9: >= 0.8
    assert total == pytest.approx(200.0)
    assert fit_table(samples())[EDGES_KEY] == list(BUCKET_EDGES)


def test_fit_table_prefers_the_precise_component_and_removes_bias():
    table = fit_table(samples())
    cell = table["bert"][str(bucket(0.25))]
    assert cell["w"]["throughput"] > 0.9
    assert cell["cbias"]["throughput"] == pytest.approx(-0.05, abs=0.01)
    truth = 500.0
    total, low, high, method = blend(
        {"history": truth * 1.1, "throughput": truth * math.exp(-0.05)}, fraction=0.25, key="bert", table=table
    )
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
        out.append(
            {
                "key": "bert",
                "fraction": fraction,
                "truth": truth,
                "components": {
                    "throughput": truth * math.exp(work + rng.normal(0, 0.02)),
                    "history": truth * math.exp(work + rng.normal(0, 0.1)),
                },
            }
        )
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
        rows.append(
            {
                "key": "bert",
                "fraction": 0.5,
                "truth": truth,
                "components": {
                    "throughput": truth * math.exp(rng.normal(0, 0.1)),
                    name: truth * math.exp(rng.normal(0, sd)),
                },
            }
        )
    cell = fit_table(rows)["bert"][str(bucket(0.5))]
    assert cell["ws"]["curve+throughput"]["curve"] > 0.8
    assert cell["ws"]["curve_loose+throughput"]["curve_loose"] < 0.1
    old = {
        "*": {str(bucket(0.5)): {"w": {"throughput": 0.5, "curve": 0.5}, "cbias": {}, "q": (-0.1, 0.1), "bias": 0.0}}
    }
    total, *_, method = blend({"throughput": 100.0, "curve_loose": 400.0}, fraction=0.5, key="bert", table=old)
    assert total == pytest.approx(200.0) and set(method.split("+")) == {"throughput", "curve"}


def late_samples(n=600, seed=0, *, curve_outliers=0.35, baseline_sd=0.08):
    """At 85% of a run: a curve exact on most runs and twice too long on the rest; the baseline ("median work
    over the live rate") off by `baseline_sd` (log) on every run."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        truth = float(rng.uniform(100, 1000))
        curve = rng.normal(0, 0.02) + (0.7 if rng.random() < curve_outliers else 0.0)
        out.append(
            {
                "key": "bert",
                "fraction": 0.85,
                "truth": truth,
                "run": f"r{i}",
                "components": {
                    "curve": truth * math.exp(curve),
                    BASELINE: truth * math.exp(rng.normal(0, baseline_sd)),
                },
            }
        )
    return out


def test_late_in_a_run_the_blend_falls_back_on_the_baseline_where_cross_fitting_says_it_misses_less():
    cell = fit_table(late_samples())["bert"][str(bucket(0.85))]
    # The curve's robust spread is tiny, so the covariance weights trust it; a third of its estimates miss.
    assert cell["ws"][f"curve+{BASELINE}"]["curve"] > 0.5
    assert cell["lam"] == 1.0
    base = 500.0
    total, low, high, method = blend(
        {"curve": 2 * base, BASELINE: base},
        fraction=0.85,
        key="bert",
        table={"bert": {str(bucket(0.85)): cell}, EDGES_KEY: list(BUCKET_EDGES)},
    )
    assert method == BASELINE
    # With the evidence behind it, the late estimate is the baseline up to the calibrated bias and band.
    assert abs(math.log(total / base)) <= max(abs(q) for q in cell["q"]) and low <= base <= high
    inside = sum(
        low_ <= s["truth"] <= high_
        for s in late_samples(seed=1)
        for _, low_, high_, _ in [
            blend(
                s["components"],
                fraction=0.85,
                key="bert",
                table={"bert": {str(bucket(0.85)): cell}, EDGES_KEY: list(BUCKET_EDGES)},
            )
        ]
    )
    assert 0.7 <= inside / 600 <= 0.9  # the band is the baseline's own errors


def test_the_blend_keeps_its_own_weights_where_it_beats_the_baseline():
    cell = fit_table(late_samples(curve_outliers=0.0, baseline_sd=0.3))["bert"][str(bucket(0.85))]
    assert cell["lam"] <= 0.25
    total, *_ = blend(
        {"curve": 500.0, BASELINE: 900.0},
        fraction=0.85,
        key="bert",
        table=fit_table(late_samples(curve_outliers=0.0, baseline_sd=0.3)),
    )
    assert total == pytest.approx(500.0, rel=0.15)


def test_on_a_benchmark_never_trained_on_the_blend_falls_back_on_its_own_curve():
    rng = np.random.default_rng(4)
    rows = []
    for i in range(800):
        truth = float(rng.uniform(100, 1000))
        history = rng.normal(0, 0.02) + (0.7 if rng.random() < 0.35 else 0.0)
        rows.append(
            {
                "key": "<unseen>",
                "fraction": 0.85,
                "truth": truth,
                "run": f"r{i}",
                "group": f"b{i % 8}",
                "components": {"history": truth * math.exp(history), "curve": truth * math.exp(rng.normal(0, 0.08))},
            }
        )
    table = fit_table(rows)
    cell = table["<unseen>"][str(bucket(0.85))]
    # The history 0.7 off (35% of rows) is beyond 3 robust deviations of its own curve: those rows leave the blend
    # (`implausible`), so cross-fitting shrinks the rest most of the way to the curve.
    assert cell["ws"]["curve+history"]["history"] > 0.5 and cell["lam"] >= 0.75
    total, *_, method = blend({"history": 1000.0, "curve": 500.0}, fraction=0.85, key="<unseen>", table=table)
    assert method == "curve" and total == pytest.approx(500.0, rel=0.1)


def unseen_rows(n=400, seed=5):
    """A benchmark never trained on: its curve and the history's guess each 10% noisy around the truth."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        truth = float(rng.uniform(100, 1000))
        comps = {"history": truth * math.exp(rng.normal(0, 0.1)), "curve": truth * math.exp(rng.normal(0, 0.1))}
        rows.append({"key": "<unseen>", "fraction": 0.85, "truth": truth, "run": f"r{i}", "group": f"b{i % 8}"})
        rows[-1]["components"] = comps
    return rows


def test_an_unseen_benchmark_s_guess_far_outside_what_the_fit_saw_leaves_the_blend():
    table = fit_table(unseen_rows())
    cell = table["<unseen>"][str(bucket(0.85))]
    assert cell["ws"]["curve+history"]["history"] > 0.03  # the history has a weight where it is plausible
    near, *_, near_method = blend({"history": 600.0, "curve": 500.0}, fraction=0.85, key="<unseen>", table=table)
    assert "history" in near_method and near != pytest.approx(500.0 * math.exp(-cell["cbias"]["curve"]), rel=1e-6)
    # 470x the job's own curve (a toy history network on a benchmark it never saw): no weight stands for it.
    total, low, high, method = blend({"history": 235_000.0, "curve": 500.0}, fraction=0.85, key="<unseen>", table=table)
    assert method == "curve" and total == pytest.approx(500.0, rel=0.1) and high < 1000.0


def test_a_table_saved_without_component_scales_keeps_every_component():
    table = fit_table(unseen_rows())
    for cell in table["<unseen>"].values():
        del cell["cscale"]
    *_, method = blend({"history": 235_000.0, "curve": 500.0}, fraction=0.85, key="<unseen>", table=table)
    assert "history" in method


def test_an_unseen_benchmark_s_rows_with_evaluation_units_do_not_move_the_bias_of_rows_without_them():
    # Rows with the job's curve alone are right; rows that also have evaluation units (jobs early in their run, a
    # curve 30% long) are long together. One bias for the cell would leave one kind or the other off.
    rng = np.random.default_rng(6)
    rows = []
    for i in range(600):
        truth = float(rng.uniform(100, 1000))
        long = 1.3 if i % 2 else 1.0
        comps = {"curve": truth * long * math.exp(rng.normal(0, 0.03))}
        if i % 2:
            comps[EVAL_UNITS] = truth * long * math.exp(rng.normal(0, 0.1))
        rows.append({"key": "<unseen>", "fraction": 0.3, "truth": truth, "run": f"r{i}", "group": f"b{i % 8}"})
        rows[-1]["components"] = comps
    table = fit_table(rows)
    alone, *_ = blend({"curve": 1000.0}, fraction=0.3, key="<unseen>", table=table)
    both, *_ = blend({"curve": 1300.0, EVAL_UNITS: 1300.0}, fraction=0.3, key="<unseen>", table=table)
    assert alone == pytest.approx(1000.0, rel=0.05) and both == pytest.approx(1000.0, rel=0.05)


def two_kinds_of_unseen_rows(n=800, seed=7):
    """A benchmark never trained on: its curve is precise (3%) on every row, right where it is alone and twice too
    long where the history's guess (15% noisy, unbiased) is there too, on half of the rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        truth = float(rng.uniform(100, 1000))
        both = rng.random() < 0.5
        comps = {"curve": truth * (2.0 if both else 1.0) * math.exp(rng.normal(0, 0.03))}
        if both:
            comps["history"] = truth * math.exp(rng.normal(0, 0.15))
        rows.append({"key": "<unseen>", "fraction": 0.6, "truth": truth, "run": f"r{i}", "group": f"b{i % 8}"})
        rows[-1]["components"] = comps
    return rows


def test_the_shrinkage_toward_the_curve_is_judged_with_the_bias_each_combination_is_served():
    # Served, each combination of components has its own remaining bias (`sbias`): the curve alone, with the bias
    # of its own rows, is within 20% on every row of both kinds. Judged with one bias for the cell (as the trial
    # tables were fitted before), the curve alone missed every row of one kind, and the noisier history kept its
    # weight.
    table = fit_table(two_kinds_of_unseen_rows())
    assert table["<unseen>"][str(bucket(0.6))]["lam"] == 1.0
    fresh = two_kinds_of_unseen_rows(seed=8)
    within = sum(
        abs(math.log(blend(r["components"], fraction=0.6, key="<unseen>", table=table)[0] / r["truth"])) < 0.18
        for r in fresh
    )
    assert within / len(fresh) > 0.98
