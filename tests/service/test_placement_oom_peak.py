"""After a CUDA out-of-memory the next attempt asks for more GPU memory than the job's recorded peak (1.25 times
it, the estimator's telemetry), more than the GPU it ran out on, never past the largest GPU there is; past even
that the job fails as before."""

import pytest

from shared.bus import publish
from shared.events import JobStatusChanged
from shared.rpc import MetricSeries, MetricsReport
from services.placement.estimates import recorded_peak
from services.placement.policy.hosting import gpu_memory_after_oom
from tests.factories import node, requeued, submitted
from tests.service.test_placement_engine import register


def oom(job_id: str) -> JobStatusChanged:
    return requeued(job_id, "oom_gpu")


@pytest.mark.parametrize(
    "peak, larger_gpu_gb, expected",
    [
        (None, 80, 24.001),  # no telemetry: more than the GPU it had, as before
        (10.0, 80, 24.001),  # a low peak never asks for less than that
        (23.5, 80, 29.375),  # 1.25 x the peak
        (23.5, 26, 26),  # ... bounded by the largest GPU there is
    ],
)
async def test_the_next_attempt_asks_for_more_than_the_recorded_peak(
    placement,
    peak,
    larger_gpu_gb,  # noqa: F811
    expected,
):
    broker, service, _ = placement
    asked = []

    async def recorded(job_id: str) -> float | None:
        asked.append(job_id)
        return peak

    service.estimates.peak_gpu_memory = recorded
    await register(broker, node(node_id="small", gpus=1, gpu_memory_gb=24))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert await service.schedule_once() == 1
    await register(broker, node(node_id="larger", gpus=1, gpu_memory_gb=larger_gpu_gb))
    await publish(broker, oom("j"))
    item = service.queue["j"]
    assert (item.state, item.needs.min_gpu_memory_gb, asked) == ("queued", pytest.approx(expected), ["j"])
    assert await service.schedule_once() == 1 and service.queue["j"].assignments[0].node_id == "larger"


async def test_a_job_that_ran_out_on_the_largest_gpu_still_fails(placement):  # noqa: F811
    broker, service, _ = placement

    async def recorded(job_id: str) -> float:
        return 79.0

    service.estimates.peak_gpu_memory = recorded
    await register(broker, node(node_id="big", gpus=1, gpu_memory_gb=80))
    await publish(broker, submitted(job_id="j", gpu_count=1))
    assert await service.schedule_once() == 1
    await publish(broker, oom("j"))
    assert service.queue["j"].state == "held"  # unplaceable, published for the monitor to fail the job


def test_the_recorded_peak_is_the_system_series_only_and_a_finite_figure():
    report = MetricsReport(
        job_id="j",
        series=[
            MetricSeries(name="gpu_memory_peak_gb", points=[(1.0, 900.0, None)]),  # printed by the job: not believed
            MetricSeries(name="gpu_memory_peak_gb", system=True, points=[(1.0, 12.0, None), (2.0, float("inf"), None)]),
        ],
    )
    assert recorded_peak(report) == 12.0 and recorded_peak(MetricsReport(job_id="j", series=[])) is None
    assert gpu_memory_after_oom(asked_gb=40, had_gb=24, peak_gb=None, largest_gb=80) == 40  # never below the ask
