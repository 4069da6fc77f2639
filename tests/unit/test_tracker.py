import re

import pytest

from shared.events import LogLine
from shared.jobs import MetricSpec
from services.estimator.tracker import MAX_KEPT, JobTracker, parse_line


def spec(**kw):
    return MetricSpec(**{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)", "mode": "min", **kw})


def test_named_value_and_step_groups():
    s = MetricSpec(name="loss", regex=r"step (?P<step>\d+) loss (?P<value>[0-9.]+)")
    (point,) = parse_line("step 7 loss 0.25", 1.0, [s], [re.compile(s.regex)])
    assert (point.value, point.step) == (0.25, 7.0)


def test_mllog_records_become_points():
    line = ':::MLLOG {"key": "eval_accuracy", "value": 0.71, "time_ms": 1, "metadata": {"epoch_num": 3}}'
    (point,) = parse_line(line, 2.0, [], [])
    assert (point.name, point.value, point.step) == ("eval_accuracy", 0.71, 3.0)


def test_a_declared_target_gets_the_own_curve_estimate_from_the_job_start():
    from services.estimator.model.curveprior.estimate import estimate
    from services.estimator.tracker import blend_table, calibration, prior

    s = MetricSpec(name="loss", regex=r"step (?P<step>\d+) loss (?P<value>[0-9.]+)", mode="min", target=0.2)
    tracker = JobTracker([s])
    for i in range(1, 31):  # a power-law loss, 10 steps a line, after 20 s of start-up
        tracker.observe(LogLine(t=20.0 + i, line=f"step {10 * i} loss {0.05 + 2.2 * (1 + i / 10) ** -0.9:.4f}"))
    eta = tracker.estimate(now=51.0, start=0.0)
    points = tracker.points["loss"]
    own = estimate(
        [p.t for p in points],
        [p.step for p in points],
        [p.value for p in points],
        target=0.2,
        mode="min",
        elapsed=51.0,
        calibration=calibration(),
        prior=prior(),
        blend=True,
        table=blend_table(),
    )
    assert eta.remaining_s == pytest.approx(own.total_s - 51.0)
    assert eta.low_s == pytest.approx(own.low_s - 51.0) and eta.high_s == pytest.approx(own.high_s - 51.0)
    assert eta.method == own.kind and eta.low_s <= eta.remaining_s <= eta.high_s
    assert eta.method == ("curve-prior+fit" if prior() is not None else "curve-learned")  # the prior, where shipped


def test_a_long_job_keeps_a_bounded_curve():
    tracker = JobTracker([spec(target=0.01)])
    for i in range(1, MAX_KEPT + 500):
        tracker.observe(LogLine(t=float(i), line=f"loss {1.0 / i**0.3:.5f}"))
    assert len(tracker.points["loss"]) <= MAX_KEPT
    assert tracker.points["loss"][-1].t == MAX_KEPT + 499.0
    assert tracker.estimate(now=MAX_KEPT + 500.0) is not None


def test_no_estimate_without_a_target_or_against_the_trend():
    assert JobTracker([spec()]).estimate(now=0) is None
    tracker = JobTracker([spec(target=0.0)])
    for i in range(5):
        tracker.observe(LogLine(t=float(i), line=f"loss {0.1 * i + 1:.2f}"))
    assert tracker.estimate(now=5) is None


def test_report_lines_become_points_with_their_step():
    line = 'TRAINMASTER_METRICS {"step": 12, "loss": 0.5, "accuracy": 0.9}'
    points = parse_line(line, 3.0, [], [])
    assert sorted((p.name, p.value, p.step) for p in points) == [
        ("accuracy", 0.9, 12.0),
        ("loss", 0.5, 12.0),
        ("step", 12.0, 12.0),
    ]
