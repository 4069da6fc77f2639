"""Issue 31's plain jobs through the served path (`JobModel`, a declared target and nothing else), on synthetic
curves: a script printing its loss without a step after a long start-up, and an average started from zero."""

import numpy as np
import pytest

from shared.events import LogLine
from shared.jobs import MetricSpec
from services.estimator.jobmodel import JobModel
from services.estimator.model.owncurve import past_rise
from services.estimator.tracker import MAX_KEPT, JobTracker

STEPPED = r"step (?P<step>\d+) loss (?P<value>[0-9.e-]+)"
VALUE_ONLY = r"loss (?P<value>[0-9.e-]+)"


def plain_job(regex: str, target: float) -> JobModel:
    model = JobModel(metrics=[MetricSpec(name="loss", regex=regex, mode="min", target=target)])
    model.started(at=0.0, accelerator="cpu", gpus=0, nodes=1)
    return model


def power_loss(steps: np.ndarray) -> np.ndarray:
    return 0.01 + 0.6 * (1 + steps / 30.0) ** -0.9


def ema_from_zero(raw: np.ndarray, beta: float) -> np.ndarray:
    """`ema = beta * ema + (1 - beta) * loss` from 0, without bias correction, as many scripts write it."""
    out, ema = np.empty_like(raw), 0.0
    for i, value in enumerate(raw):
        ema = beta * ema + (1 - beta) * value
        out[i] = ema
    return out


def feed(model: JobModel, times, steps, values) -> None:
    for t, step, value in zip(times, steps, values, strict=True):
        model.observe(LogLine(t=float(t), line=f"step {int(step)} loss {value:.6f}"))


def test_a_loss_printed_without_its_step_reads_the_training_from_the_pace_of_its_lines():
    # 20 s of imports and device set-up, then a line every 10 steps at 100 steps a second, 60 lines seen
    steps = np.arange(10, 610, 10)
    times = 20.0 + steps / 100.0
    stepped, plain = plain_job(STEPPED, 0.03), plain_job(VALUE_ONLY, 0.03)
    feed(stepped, times, steps, power_loss(steps))
    feed(plain, times, steps, power_loss(steps))
    now = float(times[-1])
    with_steps, without = stepped.estimate(now, None, None), plain.estimate(now, None, None)
    # the count of lines is the progress in units of 10 steps: the same reading, not the start-up read as training
    assert without.remaining_s == pytest.approx(with_steps.remaining_s, rel=1e-6)
    assert (without.low_s, without.high_s) == pytest.approx((with_steps.low_s, with_steps.high_s), rel=1e-6)
    assert without.remaining_s < 10 * (now - 20.0)  # not the horizon: 50 times the 26 s since the job started


def test_a_points_count_survives_the_thinning_of_a_long_job():
    tracker = JobTracker([MetricSpec(name="loss", regex=VALUE_ONLY, mode="min", target=0.01)])
    for i in range(1, MAX_KEPT + 500):
        tracker.observe(LogLine(t=float(i), line=f"loss {1.0 / i**0.3:.5f}"))
    kept = tracker.points["loss"]
    assert len(kept) <= MAX_KEPT and kept[-1].count == MAX_KEPT + 499 and kept[0].count == 1
    assert all(a.count < b.count for a, b in zip(kept, kept[1:]))  # the thinned ones leave gaps, not a recount


def test_an_average_started_from_zero_gets_an_estimate_once_it_turns_down():
    # an EMA (beta 0.99) from zero of a falling loss climbs for its first ~10 lines, then falls toward the target
    steps = np.arange(10, 6010, 10)
    ema = ema_from_zero(0.0005 + 0.5 * (1 + np.arange(1, 6001) / 20.0) ** -1.2, 0.99)[9::10]
    times = 2.0 + steps * 0.004
    peak = int(np.argmax(ema))
    assert 0 < peak < 20 and ema[0] < 0.5 * ema[peak]
    end = int(np.argmax(ema <= 0.002))
    seen = 3 * peak  # well past the peak: back below half of its height, still above its first value
    assert ema[seen] > ema[0] and seen < 0.1 * end
    model = plain_job(STEPPED, 0.002)
    feed(model, times[:seen], steps[:seen], ema[:seen])
    eta = model.estimate(float(times[seen - 1]), None, None)
    assert eta is not None and eta.method.startswith("curve") and eta.target == "ahead"
    assert eta.low_s <= eta.remaining_s <= eta.high_s


def test_a_rise_is_dropped_only_when_it_is_clear():
    ts, xs = list(range(1, 21)), [10.0 * i for i in range(1, 21)]
    rising = [0.1, 0.3, 0.5, 0.45, 0.4, 0.35, 0.3, 0.27, 0.25, 0.23] + [0.2 - 0.005 * i for i in range(10)]
    got = past_rise(ts, xs, rising, mode="min")
    assert got == (ts[2:], xs[2:], rising[2:])  # from the worst value on
    jitter = [1.0, 1.05, 0.9, 0.8, 0.85, 0.7] + [0.6 - 0.02 * i for i in range(14)]  # a noisy start, then a fall
    assert past_rise(ts, xs, jitter, mode="min") == (ts, xs, jitter)
    late = [0.5 - 0.01 * i for i in range(15)] + [0.9, 0.8, 0.7, 0.6, 0.5]  # a late spike is no start-up
    assert past_rise(ts, xs, late, mode="min") == (ts, xs, late)
    up = [1.0 + 0.1 * i for i in range(20)]  # still climbing: not turned, nothing dropped (no estimate follows)
    assert past_rise(ts, xs, up, mode="min") == (ts, xs, up)
    accuracy = [-v for v in rising]  # a maximised metric that first fell
    assert past_rise(ts, None, accuracy, mode="max") == (ts[2:], None, accuracy[2:])
