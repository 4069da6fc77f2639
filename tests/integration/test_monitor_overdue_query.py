"""The sweep of what is due (`due_query`) against the database server: a running job past its deadline and one
stored before jobs carried a deadline are found; one not due yet, one without a limit and one already ending are
not; an exit kept for its start is found once due."""

from datetime import UTC, datetime, timedelta

import pytest

from shared.jobs import Phase
from shared.store import make_client
from services.monitor import state
from services.monitor.service import DEADLINE_INDEX, EXITS_DUE_INDEX, STOPS_DUE_INDEX, due_query
from services.monitor.state import JobState
from tests.factories import exited, placed, submitted, unique

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


@pytest.fixture
async def jobs(bus_and_database):
    """The monitor's jobs collection in a database of its own, on the test stack's server."""
    client = make_client(bus_and_database.mongo_url_of("monitor"))
    try:
        yield client[unique("monitor").replace("-", "_")].monitor_jobs
    finally:
        await client.close()


def placed_job(job_id: str, *, now: datetime) -> JobState:
    job, _ = state.submitted(submitted(job_id=job_id), now=now)
    job, _ = state.placed(job, placed(job_id), now=now)
    return job


async def test_the_sweep_finds_only_the_jobs_due(jobs):
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
    found = sorted([d["_id"] async for d in jobs.find(due_query(datetime.now(UTC)), {"_id": 1})])
    assert found == ["due", "legacy"]


async def test_the_sweep_of_exits_kept_for_their_start_finds_only_those_due_and_reads_them_back(jobs):
    """An exit heard before its task's start is stored on the task (the whole report) with the job's `exits_due`;
    the sweep reads by it, and what it reads back is the exit as heard."""
    await jobs.create_index(EXITS_DUE_INDEX)
    now = datetime.now(UTC)
    docs = []
    for job_id, heard_s_ago in (("due", state.START_WAIT_S + 5), ("waiting", 1.0), ("none", None)):
        job = placed_job(job_id, now=now)
        if heard_s_ago is not None:
            job, _ = state.task_exited(job, exited(job_id), now=now - timedelta(seconds=heard_s_ago))
        docs.append({"_id": job_id, **job.model_dump()})
    await jobs.insert_many(docs)
    found = [d async for d in jobs.find(due_query(now))]
    assert [d["_id"] for d in found] == ["due"]
    job = JobState.model_validate(found[0])
    kept = job.tasks["0"].early_exit
    assert kept is not None and (kept.event_id, kept.reason, kept.exit_code) == ("due:1:0:exited", "completed", 0)
    failed, _ = state.exits_unstarted(job, now=now)
    assert failed.phase == Phase.FAILED and "without having started" in failed.reason


async def test_the_sweep_finds_a_stop_no_exit_answered_once_it_is_due(jobs):
    await jobs.create_index(STOPS_DUE_INDEX)
    now = datetime.now(UTC)
    docs = []
    for job_id, asked_s_ago in (("unanswered", 10 + state.STOP_WAIT_S + 5), ("stopping", 1.0)):
        job = placed_job(job_id, now=now)
        job, _ = state.terminate(job, requested_by="bob", now=now - timedelta(seconds=asked_s_ago))
        docs.append({"_id": job_id, **job.model_dump()})
    await jobs.insert_many(docs)
    found = [d async for d in jobs.find(due_query(now))]
    assert [d["_id"] for d in found] == ["unanswered"]
    ended, _ = state.stops_unheard(JobState.model_validate(found[0]), now=now)
    assert ended.phase == Phase.TERMINATED
