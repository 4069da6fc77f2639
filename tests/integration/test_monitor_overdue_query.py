"""The overdue sweep's query against the database server: a running job past its deadline and one stored before
jobs carried a deadline are found; one not due yet, one without a limit and one already ending are not."""

from datetime import UTC, datetime, timedelta

import pytest

from shared.jobs import Phase
from shared.store import make_client
from services.monitor.service import DEADLINE_INDEX, overdue_query
from services.monitor.state import JobState
from tests.factories import unique

pytestmark = pytest.mark.integration


def stored(job_id: str, *, phase: Phase = Phase.RUNNING, max_duration_s: int | None, started_s_ago: float) -> dict:
    now = datetime.now(UTC)
    job = JobState(
        job_id=job_id,
        project_id="p",
        user_name="alice",
        phase=phase,
        max_duration_s=max_duration_s,
        start_time=now - timedelta(seconds=started_s_ago),
    )
    return {"_id": job_id, **job.model_dump()}


async def test_the_sweep_finds_only_the_jobs_due(bus_and_database):
    client = make_client(bus_and_database.mongo_url_of("monitor"))
    try:
        jobs = client[unique("monitor").replace("-", "_")].monitor_jobs
        await jobs.create_index(DEADLINE_INDEX)
        legacy = stored("legacy", max_duration_s=60, started_s_ago=120)
        del legacy["deadline"]  # as a monitor before deadlines wrote it
        await jobs.insert_many(
            [
                stored("due", max_duration_s=60, started_s_ago=120),
                stored("later", max_duration_s=3600, started_s_ago=120),
                stored("unlimited", max_duration_s=None, started_s_ago=120),
                stored("ending", phase=Phase.TERMINATING, max_duration_s=60, started_s_ago=120),
                legacy,
            ]
        )
        found = sorted([d["_id"] async for d in jobs.find(overdue_query(datetime.now(UTC)), {"_id": 1})])
        assert found == ["due", "legacy"]
    finally:
        await client.close()
