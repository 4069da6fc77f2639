"""A job shows Completed only once its final output is stored: a follower that stops at the end sees the last line,
even when the status overtakes the output (they travel on different streams)."""

import asyncio
from datetime import timedelta
from types import SimpleNamespace

from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish
from shared.clock import utcnow
from shared.events import JobStatusChanged, LogChunk, LogLine, TaskStatus
from shared.jobs import Phase, SecondaryPhase
from services.submitter.handlers import router
from services.submitter.logs import OUTPUT_HOLD_S, follow, output_stored
from services.submitter.repository import Repository
from tests.memory import MemoryCollection


def repository() -> Repository:
    db = SimpleNamespace(
        api_jobs=MemoryCollection(),
        api_queue=MemoryCollection(),
        api_job_list=MemoryCollection(),
        api_logs=MemoryCollection(),
        api_log_sizes=MemoryCollection(),
        api_notifications=MemoryCollection(),
        api_projects=MemoryCollection(),
    )
    return Repository(db=db, broker=None)


def chunk(seq: int, *lines: str, last: bool = False) -> LogChunk:
    return LogChunk(
        event_id=f"j:1:0:log:{seq}",
        job_id="j",
        attempt=1,
        rank=0,
        node_id="n1",
        seq=seq,
        lines=tuple(LogLine(t=0, line=line) for line in lines),
        last=last,
    )


def completed(*, at=None) -> JobStatusChanged:
    return JobStatusChanged(
        event_id="j:status:3",
        occurred_at=at or utcnow(),
        job_id="j",
        project_id="p",
        user_name="ana",
        version=3,
        phase=Phase.COMPLETED,
        secondary_phase=SecondaryPhase.COMPLETED,
        attempt=1,
        node_ids=("n1",),
        task_statuses=(TaskStatus(task="worker-0", exit_code=0),),
    )


async def test_completed_waits_for_the_last_line_and_a_follower_sees_it():
    repo = repository()
    await repo.jobs.insert_one(
        {
            "_id": "j",
            "project_id": "p",
            "user_name": "u",
            "status_version": 2,
            "status": {"phase": "Running"},
            "create_time": utcnow(),
        }
    )
    await repo.output.add(chunk(0, "step 1"))
    broker = NatsBroker()
    broker.include_router(router)
    async with TestNatsBroker(broker) as test_broker:
        test_broker.context.set_global("repo", repo)
        try:
            await publish(test_broker, completed())  # the status overtook the final output
        except Exception:  # the handler asks for a redelivery (a real stream redelivers it shortly)
            pass
        assert (await repo.jobs.find_one({"_id": "j"}))["status"]["phase"] == "Running"

        async def never() -> bool:
            return False

        followed = asyncio.create_task(_collect(follow(repo, "j", rank=0, disconnected=never)))
        await asyncio.sleep(1.5)  # longer than a follower waits for trailing output once a job is shown finished
        await repo.output.add(chunk(1, "the last line", last=True))
        await publish(test_broker, completed())  # redelivered
        assert (await repo.jobs.find_one({"_id": "j"}))["status"]["phase"] == "Completed"
        assert (await asyncio.wait_for(followed, 10)).splitlines() == ["step 1", "the last line"]


async def _collect(stream) -> str:
    return "".join([text async for text in stream])


async def test_every_chunk_before_the_last_must_be_stored_and_the_wait_is_bounded():
    repo = repository()
    await repo.output.add(chunk(2, "end", last=True))
    assert not await output_stored(repo, completed(), now=utcnow())  # chunks 0 and 1 still on their way
    await repo.output.add(chunk(0, "a"))
    await repo.output.add(chunk(1, "b"))
    assert await output_stored(repo, completed(), now=utcnow())
    late = completed(at=utcnow() - timedelta(seconds=OUTPUT_HOLD_S + 1))
    assert await output_stored(repository(), late, now=utcnow())  # never marked (an older agent): shown anyway


async def test_a_status_without_reported_ends_is_not_held():
    lost = completed().model_copy(update={"phase": Phase.FAILED, "task_statuses": (TaskStatus(task="worker-0"),)})
    assert await output_stored(repository(), lost, now=utcnow())
    assert await output_stored(repository(), completed().model_copy(update={"phase": Phase.RUNNING}), now=utcnow())


async def test_the_agent_ships_its_final_chunk_marked_before_reporting_the_end(tmp_path):
    from shared.events import TaskExited
    from tests.factories import start_task
    from tests.unit.test_agent_journal import make_agent

    sent: list = []
    await make_agent(tmp_path, sent).start(start_task("k", "echo first; echo 'the last line'"))
    for _ in range(400):
        if any(isinstance(m, TaskExited) for m in sent):
            break
        await asyncio.sleep(0.05)
    chunks = [m for m in sent if isinstance(m, LogChunk)]
    assert isinstance(sent[-1], TaskExited) and chunks and chunks[-1].last
    assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [line.line for c in chunks for line in c.lines][-1] == "the last line"
