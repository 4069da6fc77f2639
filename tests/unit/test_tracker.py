import re

from shared.events import LogLine
from shared.jobs import MetricSpec
from services.estimator.tracker import JobTracker, parse_line


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


def test_a_steady_decline_gives_the_time_to_target():
    tracker = JobTracker([spec(target=0.0)])
    for i in range(10):  # loss 1.0 → 0.1 at 0.1 per second
        tracker.observe(LogLine(t=float(i), line=f"loss {1.0 - 0.1 * i:.2f}"))
    eta = tracker.estimate(now=9.0)
    assert abs(eta.remaining_s - 1.0) < 0.05 and eta.low_s <= eta.remaining_s <= eta.high_s
    assert 0.85 < eta.progress < 0.95


def test_no_estimate_without_a_target_or_against_the_trend():
    assert JobTracker([spec()]).estimate(now=0) is None
    tracker = JobTracker([spec(target=0.0)])
    for i in range(5):
        tracker.observe(LogLine(t=float(i), line=f"loss {0.1 * i + 1:.2f}"))
    assert tracker.estimate(now=5) is None


def test_report_lines_become_points_with_their_step():
    line = 'TRAINMASTER_METRICS {"step": 12, "loss": 0.5, "accuracy": 0.9}'
    points = parse_line(line, 3.0, [], [])
    assert sorted((p.name, p.value, p.step) for p in points) == [("accuracy", 0.9, 12.0), ("loss", 0.5, 12.0),
                                                                 ("step", 12.0, 12.0)]
