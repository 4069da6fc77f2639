"""Output is taken only from the node that runs the task: a node's agent may publish chunks naming any job on its
own log subject, and neither the submitter (which shows them) nor the estimator (which reads metrics from them)
takes one for a job, attempt or rank placed elsewhere; nor can such chunks take the real ones' places."""

import asyncio

import pytest
from faststream.exceptions import NackMessage
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import publish
from shared.jobs import MetricSpec
from shared.origin import MAX_WAITS, UNPLACED_S, Origins
from services.submitter.handlers import router as submitter_router
from services.submitter.logs import read_page
from services.submitter.repository import Repository
from tests.factories import chunk, placed, unique
from tests.service.conftest import origins
from tests.unit.api_app import Db

INJECTED = ('TRAINMASTER_METRICS {"loss": 0.00001}', "loss=0.00001", "all done, target reached")


@pytest.fixture
async def submitter():
    broker = NatsBroker()
    broker.include_router(submitter_router)
    async with TestNatsBroker(broker) as test_broker:
        repo = Repository(db=Db(), broker=test_broker, origins=origins())
        test_broker.context.set_global("repo", repo)
        yield test_broker, repo


async def output(repo: Repository, job_id: str, rank: int = 0) -> list[str]:
    return (await read_page(repo.output, job_id, rank=rank, offset=0, limit=1000)).text.splitlines()


async def test_the_submitter_drops_chunks_from_a_node_the_task_was_not_placed_on(submitter):
    broker, repo = submitter
    job_id = unique("j")
    await publish(broker, placed(job_id, nodes=("n1", "n2")))
    await publish(broker, chunk(job_id, node_id="n9", lines=INJECTED))  # another node's agent, its own subject
    await publish(broker, chunk(job_id, rank=1, node_id="n1", lines=INJECTED))  # a rank placed on n2
    await publish(broker, chunk(job_id, attempt=2, node_id="n1", lines=INJECTED))  # an attempt never placed
    assert repo.output.chunks.docs == {}
    await publish(broker, chunk(job_id, node_id="n1", lines=("real",)))
    await publish(broker, chunk(job_id, rank=1, node_id="n2", lines=("real 1",)))
    assert await output(repo, job_id) == ["real"] and await output(repo, job_id, rank=1) == ["real 1"]


async def test_chunks_sent_first_with_the_coming_sequence_numbers_take_no_real_chunk_s_place(submitter):
    broker, repo = submitter
    job_id = unique("j")
    await publish(broker, placed(job_id, nodes=("n1",)))
    for seq in range(3):  # the attacker's node, first, with the numbers the real stream will use
        await publish(broker, chunk(job_id, node_id="n9", seq=seq, lines=INJECTED, last=seq == 2))
    for seq in range(3):
        await publish(broker, chunk(job_id, node_id="n1", seq=seq, lines=(f"real {seq}",), last=seq == 2))
    assert await output(repo, job_id) == ["real 0", "real 1", "real 2"]
    assert await repo.output.complete(job_id, attempt=1, rank=0)


async def test_the_estimator_reads_no_metric_from_a_node_the_task_was_not_placed_on(estimator):
    broker, service, bus = estimator
    job_id = unique("j")
    await service.jobs.save(
        job_id,
        {
            "metrics": [MetricSpec(name="loss", regex=r"loss=([0-9.]+)", mode="min", target=0.001).model_dump()],
            "parameters": [],
            "project_id": "p",
            "finished": False,
        },
        None,
        [],
    )
    await publish(broker, placed(job_id, nodes=("n1",)))
    for seq in range(3):
        await publish(broker, chunk(job_id, node_id="n9", seq=seq, lines=INJECTED))
    assert service.points.docs == {} and bus.published == []
    assert service.live.get(job_id) is None or service.live[job_id].tracker.points == {}
    await publish(broker, chunk(job_id, node_id="n1", lines=("loss=0.5",)))
    assert [p.value for p in service.live[job_id].tracker.points["loss"]] == [0.5]
    assert [d["line"] for d in service.points.docs.values()] == ["loss=0.5"]


async def test_a_chunk_before_its_placement_was_read_waits_then_is_judged():
    checks = origins(all_read=False)  # the placements consumer has not read everything yet
    early = chunk("j", node_id="n1")
    with pytest.raises(NackMessage):
        await checks.admit(early, deliveries=1)
    await checks.placed(placed("j", nodes=("n1",)))
    assert await checks.admit(early, deliveries=2)
    assert not await checks.admit(chunk("j", node_id="n9"), deliveries=1)  # placed elsewhere: no wait
    assert not await checks.admit(chunk("j", attempt=2), deliveries=MAX_WAITS)  # waited long enough


async def test_a_chunk_for_a_placement_never_made_is_dropped_once_every_placement_was_read():
    checks = origins(all_read=True)
    assert not await checks.admit(chunk("j", node_id="n1"), deliveries=1)
    fresh = Origins(placements=checks.placements, all_read=checks.all_read)  # a restarted service: from storage
    await checks.placed(placed("j", nodes=("n1",)))
    assert await fresh.admit(chunk("j", node_id="n1"), deliveries=1)


async def test_reports_of_an_attempt_never_placed_are_judged_without_reading_again_for_a_while():
    """Each cost a database read and a question to the bus on the consumer every job's output waits on (found by
    review): the finding is remembered a few seconds, and forgotten as soon as the placement comes."""
    checks = origins(all_read=True)
    now = [100.0]
    checks.clock = lambda: now[0]
    reads = []
    find_one = checks.placements.find_one

    async def counted(*args, **kwargs):
        reads.append(args)
        return await find_one(*args, **kwargs)

    checks.placements.find_one = counted
    for seq in range(50):
        assert not await checks.admit(chunk("ghost", node_id="n9", seq=seq), deliveries=1)
    assert len(reads) == 1
    now[0] += UNPLACED_S
    assert not await checks.admit(chunk("ghost", node_id="n9", seq=99), deliveries=1)
    assert len(reads) == 2
    await checks.placed(placed("ghost", nodes=("n9",)))  # placed after all: taken at once
    assert await checks.admit(chunk("ghost", node_id="n9", seq=100), deliveries=1)


async def test_a_line_that_is_no_utf_8_is_stored_and_read_not_lost(submitter, estimator):
    for broker, stored in (
        (submitter[0], lambda: submitter[1].db.api_logs.docs),
        (estimator[0], lambda: estimator[1].points.docs),
    ):
        job_id = unique("j")
        if broker is estimator[0]:
            await estimator[1].jobs.save(
                job_id, {"metrics": [], "parameters": [], "project_id": "p", "finished": False}, None, []
            )
        await publish(broker, placed(job_id, nodes=("n1",)))
        raw = chunk(job_id, lines=("x",)).model_dump_json().replace('"line":"x"', '"line":"\\ud800 :::MLLOG {}"')
        await broker.publish(raw.encode(), f"tm.log.n1.{job_id}")
        assert [d for d in stored().values() if d["job_id"] == job_id], broker


async def test_a_deleted_jobs_output_is_no_longer_taken(submitter):
    broker, repo = submitter
    job_id = unique("j")
    await repo.jobs.insert_one({"_id": job_id, "status": {"phase": "Completed"}})
    await publish(broker, placed(job_id, nodes=("n1",)))
    assert await repo.delete(job_id, finished=["Completed"])
    await publish(broker, chunk(job_id, node_id="n1", lines=("late",)))
    assert repo.output.chunks.docs == {} and repo.db.api_placements.docs == {}


async def test_one_placement_read_by_two_consumers_at_once_is_inserted_once():
    checks = origins()
    inserts = []
    insert = checks.placements.insert_one

    async def counted(doc):
        inserts.append(doc["_id"])
        await asyncio.sleep(0)  # the other consumer's delivery comes in meanwhile
        return await insert(doc)

    checks.placements.insert_one = counted
    event = placed(unique("j"))
    await asyncio.gather(checks.placed(event), checks.placed(event))
    assert len(inserts) == 1 and len(checks.placements.docs) == 1


async def test_a_placement_whose_insert_failed_is_inserted_when_it_comes_again():
    checks = origins()
    insert = checks.placements.insert_one

    async def failing(doc):
        raise ConnectionError("the database went away")

    checks.placements.insert_one = failing
    event = placed(unique("j"))
    with pytest.raises(ConnectionError):
        await checks.placed(event)
    checks.placements.insert_one = insert
    await checks.placed(event)
    assert len(checks.placements.docs) == 1
