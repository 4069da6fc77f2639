"""A deleted job is tracked no more by the estimator: its record, metric lines, GPU samples and placements go when
JobDeleted arrives, output that comes later is dropped, and the deletion seen again changes nothing."""

from datetime import timedelta

from shared.bus import publish
from shared.events import JobDeleted, JobStatusChanged, TaskTelemetry
from shared.jobs import Phase, SecondaryPhase
from shared.rpc import MetricsQuery
from tests.factories import T0, chunk, placed, started, submitted, unique
from tests.memory import MemoryCollection

METRICS = [{"name": "loss", "regex": r"loss=([0-9.]+)", "mode": "min"}]


def finished(job_id: str) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:9",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=9,
        phase=Phase.FAILED,
        secondary_phase=SecondaryPhase.FAILED,
        start_time=T0,
        end_time=T0 + timedelta(minutes=5),
    )


def sample(job_id: str, seq: int) -> TaskTelemetry:
    return TaskTelemetry(
        event_id=f"{job_id}:1:0:gpu:n1:{seq}",
        job_id=job_id,
        attempt=1,
        rank=0,
        node_id="n1",
        seq=seq,
        t=100.0 + seq,
        gpus=[{"index": 0, "util_percent": 80, "memory_used_gb": 10.0, "power_w": 250, "temp_c": 65}],
    )


def held(service, job_id: str) -> dict[str, int]:
    """How many documents of the job each of the estimator's collections holds."""
    collections = {
        "jobs": service.jobs.collection,
        "points": service.points,
        "telemetry": service.telemetry,
        "placements": service.origins.placements,
    }
    return {
        name: sum(1 for doc in c.docs.values() if job_id in (doc.get("job_id"), doc.get("_id")))
        for name, c in collections.items()
    }


async def test_a_deleted_job_leaves_nothing_tracked_and_its_late_output_is_dropped(estimator):
    broker, service, _ = estimator
    service.telemetry = MemoryCollection("telemetry")
    job = submitted(job_id="gone", metrics=METRICS)
    kept = submitted(job_id="kept", metrics=METRICS)
    for event in (job, kept):
        await publish(broker, event)
        await publish(broker, placed(event.job_id, nodes=("n1",), gpu_indices=(0,), gpu_memory_gb=24))
        await publish(broker, started(event.job_id))
        await publish(broker, chunk(event.job_id, node_id="n1", seq=1, lines=("loss=2.5", "loss=1.5")))
        await publish(broker, sample(event.job_id, 1))
    await publish(broker, chunk("gone", node_id="n1", seq=2, lines=("loss=1.0",)))  # still tracked: kept
    assert held(service, "gone") == {"jobs": 1, "points": 3, "telemetry": 1, "placements": 1}
    await publish(broker, finished("gone"))

    await publish(broker, JobDeleted(event_id="gone:deleted", job_id="gone"))
    await publish(broker, chunk("gone", node_id="n1", seq=3, lines=("loss=0.5",)))  # a task's last chunk, late
    await publish(broker, sample("gone", 2))
    await publish(broker, JobDeleted(event_id="gone:deleted:again", job_id="gone"))  # seen again: nothing changes

    assert held(service, "gone") == {"jobs": 0, "points": 0, "telemetry": 0, "placements": 0}
    assert "gone" not in service.live and "gone" not in service.last_published
    assert (await service.metrics(MetricsQuery(job_id="gone", max_points=10))).series == []
    assert held(service, "kept") == {"jobs": 1, "points": 2, "telemetry": 1, "placements": 1}  # another job's stay
    assert "kept" in service.live


async def test_a_finished_jobs_curves_are_read_again_once_for_many_queries(estimator):
    """Each query of a finished job's curves replayed every line it kept (20,000 lines: 0.6 s on the loop each
    time; found by review): its model is kept for the next queries, until a late line of it is kept or it goes."""
    broker, service, _ = estimator
    job = submitted(job_id=unique("done"), metrics=METRICS)
    await publish(broker, job)
    await publish(broker, placed(job.job_id, nodes=("n1",)))
    await publish(broker, started(job.job_id))
    await publish(broker, chunk(job.job_id, node_id="n1", seq=1, lines=("loss=2.5", "loss=1.5")))
    await publish(broker, finished(job.job_id))
    service.ended.pop(job.job_id)  # its late-output window past
    reads = []
    find = service.points.find

    def counted(*args, **kwargs):
        reads.append(args)
        return find(*args, **kwargs)

    service.points.find = counted
    for _ in range(3):
        [series] = (await service.metrics(MetricsQuery(job_id=job.job_id, max_points=10))).series
        assert [p[1] for p in series.points] == [2.5, 1.5]
    assert len(reads) == 1
    await publish(broker, JobDeleted(event_id=f"{job.job_id}:deleted", job_id=job.job_id))
    assert (await service.metrics(MetricsQuery(job_id=job.job_id, max_points=10))).series == []
