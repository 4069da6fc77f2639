"""A job's output is hostile: no line may make the estimator raise (and lose the chunk it came in); a value that is
no finite number is skipped alone, the rest of the line and of the chunk still read."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shared.events import LogLine
from shared.jobs import MetricSpec, Parameter
from services.estimator.jobmodel import JobModel
from services.estimator.model.mllog import parse_mllog_line
from services.estimator.tracker import MAX_METRICS, JobTracker, parse_line

HUGE = 10**400  # float() of it overflows
SPECS = [
    MetricSpec(name="loss", regex=r"loss=([0-9.eE+-]+)", mode="min", target=0.1),
    MetricSpec(name="acc", regex=r"step (?P<step>[0-9.eE+-]+) acc (?P<value>\S+)", mode="max"),
]
# Any character a decoded chunk can hold, lone surrogates (invalid UTF-8 once encoded) included.
CHARS = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=())
SCALARS = (
    st.none()
    | st.booleans()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**420)
    | st.text(CHARS, max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "key",
                    "value",
                    "time_ms",
                    "metadata",
                    "step",
                    "loss",
                    "epoch_num",
                    "samples_count",
                    "step_num",
                    "metric",
                ]
            )
            | st.text(CHARS, max_size=8),
            inner,
            max_size=6,
        )
    ),
    max_leaves=20,
)
PREFIXES = st.sampled_from(["TRAINMASTER_METRICS ", ":::MLLOG ", "x :::MLLOG ", ""])


def dumped(value) -> str:
    return json.dumps(value, allow_nan=True)


LINES = (
    st.builds(lambda p, v: p + dumped(v), PREFIXES, JSON)
    | st.builds(lambda p, t: p + t, PREFIXES, st.text(CHARS, max_size=200))
    | st.builds(
        lambda n, v: f"step {n} acc {v} loss={v}",
        st.text(CHARS, max_size=8),
        st.sampled_from(["nan", "inf", "-inf", "1e400", "9" * 400, "0.5", "1e-5", "--"]),
    )
)


def model(benchmark: str | None = None) -> JobModel:
    parameters = (
        [Parameter(name="benchmark", value=benchmark), Parameter(name="batch_size", value="32")] if benchmark else []
    )
    return JobModel(metrics=SPECS, parameters=parameters)


def finite_points(points) -> bool:
    return all(math.isfinite(p.value) and (p.step is None or math.isfinite(p.step)) for p in points)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(LINES, min_size=1, max_size=5),
    st.sampled_from([None, "resnet", "unet3d", "stable_diffusion", "maskrcnn", "ssd"]),
)
def test_no_line_makes_the_estimator_raise(lines, benchmark):
    job = model(benchmark)
    for i, line in enumerate(lines):
        assert finite_points(job.observe(LogLine(t=float(i), line=line)))
        parse_mllog_line(line)
    job.estimate(float(len(lines)), None, None)


@pytest.mark.parametrize(
    "line",
    [
        "TRAINMASTER_METRICS [1, 2, 3]",
        'TRAINMASTER_METRICS "loss"',
        "TRAINMASTER_METRICS 12",
        f'TRAINMASTER_METRICS {{"loss": {HUGE}}}',
        f'TRAINMASTER_METRICS {{"step": {HUGE}, "loss": 0.5}}',
        "TRAINMASTER_METRICS " + "[" * 100_000 + "]" * 100_000,
        'TRAINMASTER_METRICS {"loss": ' + "9" * 5000 + "}",  # more digits than Python converts
        f':::MLLOG {{"key": "eval_accuracy", "value": {HUGE}, "time_ms": 1, "metadata": {{"epoch_num": 1}}}}',
        f':::MLLOG {{"key": "eval_accuracy", "value": 0.5, "time_ms": 1, "metadata": {{"epoch_num": {HUGE}}}}}',
        ':::MLLOG {"key": "eval_accuracy", "value": 0.5, "time_ms": 1, "metadata": [1]}',
        ':::MLLOG {"key": "eval_accuracy", "value": 0.5, "time_ms": Infinity, "metadata": {}}',
        ':::MLLOG {"key": "epoch_stop", "value": null, "time_ms": 1, "metadata": {"epoch_num": 1e308}}',
        f"loss={'9' * 400}",
    ],
)
def test_hostile_report_and_mllog_lines_are_skipped_not_raised(line):
    for benchmark in (None, "unet3d", "ssd"):
        job = model(benchmark)
        assert finite_points(job.observe(LogLine(t=1.0, line=line)))


def test_a_bad_value_is_skipped_alone():
    line = f'TRAINMASTER_METRICS {{"loss": 0.5, "lr": NaN, "big": {HUGE}, "tags": ["a"], "step": 3}}'
    points = parse_line(line, 1.0, [], [])
    assert {(p.name, p.value, p.step) for p in points} == {("loss", 0.5, 3.0), ("step", 3.0, 3.0)}


def test_a_job_naming_a_new_metric_on_every_line_keeps_a_bounded_number():
    tracker = JobTracker([])
    for i in range(MAX_METRICS + 50):
        tracker.observe(LogLine(t=float(i), line=f'TRAINMASTER_METRICS {{"m{i}": 1.0}}'))
    assert len(tracker.points) == MAX_METRICS


@pytest.mark.filterwarnings("error")  # numpy's overflow warnings too: values past 1e15 are not read at all
@pytest.mark.parametrize("declared", ["abc", "nan", "inf", "1e308", "-3", "0"])
def test_extreme_values_and_hardware_counts_leave_the_job_estimated(declared):
    """A metric of 1e308 (against a target at the other end: the curve's arithmetic overflowed to NaN and every
    estimate failed) and a declared count of accelerators or nodes that is no sane number (it raised at the start,
    or made a 300-digit count that overflowed the hardware features)."""
    with pytest.raises(ValueError):
        MetricSpec(name="loss", regex=r"loss=([0-9.eE+-]+)", mode="min", target=-1e308)
    job = JobModel(
        metrics=[MetricSpec(name="loss", regex=r"loss=([0-9.eE+-]+)", mode="min", target=-1e15)],
        parameters=[
            Parameter(name="benchmark", value="resnet"),
            Parameter(name="accelerators", value=declared),
            Parameter(name="nodes", value=declared),
        ],
    )
    job.started(at=0.0, accelerator="H100", gpus=8, nodes=1)
    assert (job.gpus, job.nodes) == (8, 1)
    for i in range(200):
        job.observe(LogLine(t=float(i), line=f"loss={'1e308' if i % 2 else '-1e308'}"))
        job.observe(LogLine(t=float(i) + 0.5, line=f"loss={10.0 - i * 0.01}"))
        job.estimate(float(i) + 1, None, None)
