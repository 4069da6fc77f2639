"""GPU telemetry is taken only from the node a task runs on, for the GPUs placement gave it: a node's agent may
publish samples naming any job on its own telemetry subject, and the estimator keeps none for a job, attempt, rank
or GPU placed elsewhere; what it keeps it serves as the job's system series."""

import pytest

from shared.bus import publish
from shared.events import TaskTelemetry
from shared.rpc import MetricsQuery
from tests.factories import placed, unique
from tests.memory import MemoryCollection


def sample(
    job_id: str,
    *,
    node_id: str = "n1",
    attempt: int = 1,
    rank: int = 0,
    seq: int = 1,
    t: float = 100.0,
    memory_gb: float = 10.0,
    index: int = 0,
) -> TaskTelemetry:
    return TaskTelemetry(
        event_id=f"{job_id}:{attempt}:{rank}:gpu:{node_id}:{seq}",
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        node_id=node_id,
        seq=seq,
        t=t,
        gpus=[{"index": index, "util_percent": 80, "memory_used_gb": memory_gb, "power_w": 250, "temp_c": 65}],
    )


@pytest.fixture
async def known_job(estimator):  # noqa: F811
    broker, service, _ = estimator
    service.telemetry = MemoryCollection("telemetry")
    job_id = unique("j")
    await service.jobs.save(job_id, {"metrics": [], "parameters": [], "project_id": "p", "finished": False}, None, [])
    await publish(broker, placed(job_id, nodes=("n1",), gpu_indices=(0,), gpu_memory_gb=24))
    return broker, service, job_id


async def test_the_estimator_keeps_no_sample_from_elsewhere_nor_of_another_gpu_nor_past_its_memory(known_job):
    broker, service, job_id = known_job
    for forged in (
        sample(job_id, node_id="n9"),
        sample(job_id, rank=1),
        sample(job_id, attempt=2),
        sample(job_id, index=1),
        sample(job_id, memory_gb=80),
    ):
        await publish(broker, forged)
    assert service.telemetry.docs == {}
    await publish(broker, sample(job_id))
    await publish(broker, sample(job_id))  # a redelivery adds nothing
    assert [d["gpu_memory_gb"] for d in service.telemetry.docs.values()] == [10.0]


async def test_the_job_s_metrics_show_its_gpu_series_thinned_to_the_latest_with_the_peak_of_all(known_job):
    broker, service, job_id = known_job
    for seq, memory in enumerate((20.0, 5.0, 6.0), start=1):
        await publish(broker, sample(job_id, seq=seq, t=100.0 + seq, memory_gb=memory))
    report = await service.metrics(MetricsQuery(job_id=job_id, max_points=2))
    series = {s.name: s for s in report.series if s.system}
    assert [p[1] for p in series["gpu_memory_gb"].points] == [5.0, 6.0]
    assert [p[1] for p in series["gpu_memory_peak_gb"].points] == [20.0, 20.0]  # the older sample's peak counts
    assert [p[1] for p in series["gpu_util"].points] == [80.0, 80.0]
    assert {"gpu_power_w", "gpu_temp_c"} <= set(series)
