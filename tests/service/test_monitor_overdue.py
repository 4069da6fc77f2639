"""The sweep for jobs past their max_duration_s reads only the running jobs whose deadline has passed (and those
stored before jobs carried one), not every running job with a limit, every second."""

from datetime import UTC, datetime, timedelta

from shared.bus import publish
from tests.factories import placed, started, submitted
from tests.memory import Cursor, MemoryCollection


class DocsCounting(MemoryCollection):
    """Counts the documents the monitor's finds return (what a database would send it, after a sort and limit)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.read = 0

    def find(self, query: dict | None = None, projection: dict | None = None) -> Cursor:
        return Counted(super().find(query, projection).docs, self)


class Counted(Cursor):
    def __init__(self, docs: list[dict], collection: DocsCounting) -> None:
        super().__init__(docs)
        self.collection = collection

    async def _iterate(self):
        async for doc in super()._iterate():
            self.collection.read += 1
            yield doc


async def run(broker, job_id: str, **spec) -> None:
    for event in (submitted(job_id=job_id, **spec), placed(job_id), started(job_id)):
        await publish(broker, event)


async def test_the_overdue_sweep_reads_only_the_jobs_past_their_deadline(monitor_broker):
    broker, monitor, seen = monitor_broker
    jobs = monitor.jobs.collection = DocsCounting("jobs")
    for i in range(10):
        await run(broker, f"long-{i}", max_duration_s=3600)
        await run(broker, f"unlimited-{i}")
    await run(broker, "short", max_duration_s=1)

    now = datetime.now(UTC)
    jobs.read = 0
    await monitor.expire_due(now)
    assert jobs.read == 1  # nothing is past its deadline yet; the first sweep learns when the first is (the short job)
    jobs.read = 0
    await monitor.expire_due(now + timedelta(seconds=5))
    assert jobs.read == 1  # the short job alone
    assert (await monitor.jobs.load("short"))["phase"] == "Terminating"
    assert {doc["phase"] for doc in jobs.docs.values() if doc["_id"] != "short"} == {"Running"}
    jobs.read = 0
    await monitor.expire_due(now + timedelta(seconds=5))
    # terminating: not settled again; the sweep after one that found a job reads the next due: the next deadline
    # and the terminating job's stop, due if its node never reports the exit (`state.stop_due`)
    assert jobs.read == 2
    jobs.read = 0
    await monitor.expire_due(now + timedelta(seconds=60))
    assert jobs.read == 0  # the next is in an hour: no read until then


async def test_a_job_stored_before_deadlines_is_still_expired(monitor_broker):
    broker, monitor, _ = monitor_broker
    await run(broker, "old", max_duration_s=1)
    monitor.jobs.collection.docs["old"].pop("deadline", None)  # as an earlier monitor wrote it
    await monitor.expire_due(datetime.now(UTC) + timedelta(seconds=5))
    assert (await monitor.jobs.load("old"))["phase"] == "Terminating"
