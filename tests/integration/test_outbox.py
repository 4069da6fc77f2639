"""The outbox and the streams against a real NATS server and the database server."""

import asyncio
from datetime import UTC, datetime

import nats
import pymongo
import pytest

from shared.bus import connect, make_broker
from shared.events import JobDeleted
from shared.store import DocumentStore, make_client, outbox_entries, relay
from services.submitter.caps import QueueCaps
from services.submitter.intake import Arrival, Intake
from services.submitter.repository import NameTaken, Repository
from tests.factories import submitted, unique

pytestmark = pytest.mark.integration


@pytest.fixture
async def wiring(bus_and_database):
    broker = make_broker(bus_and_database.nats_url, name="test", creds=bus_and_database.admin_creds())
    await connect(broker)
    client = make_client(bus_and_database.mongo_url_of("submitter"))
    collection = client.test[unique("outbox").replace("-", "_")]
    yield broker, collection
    await broker.stop()
    await client.close()


async def stream_subjects(bus_and_database, subject: str) -> list[bytes]:
    nc = await nats.connect(bus_and_database.nats_url, user_credentials=str(bus_and_database.admin_creds()))
    js = nc.jetstream()
    info = await js.stream_info("TM_JOBS")
    sub = await js.subscribe(subject, ordered_consumer=True)
    messages = []
    try:
        while True:
            messages.append((await sub.next_msg(timeout=0.5)).data)
    except (TimeoutError, nats.errors.TimeoutError):
        pass
    await nc.close()
    assert info.config.duplicate_window > 0
    return messages


async def test_events_left_in_an_outbox_by_a_crash_are_relayed_once(bus_and_database, wiring):
    broker, collection = wiring
    job_id = unique("j")
    event = JobDeleted(event_id=f"{job_id}:deleted", job_id=job_id)
    entries = outbox_entries([event])
    await collection.insert_one({"_id": job_id, "_outbox": entries, "_outbox_n": 1})  # written, never published
    # another writer's leftovers looked for every 0.1 s (30 s in service)
    relaying = asyncio.create_task(relay(broker, [collection], interval_s=0.1, idle_s=0.1))
    await asyncio.sleep(0.5)
    await collection.update_one({"_id": job_id}, {"$set": {"_outbox": entries, "_outbox_n": 1}})  # "crash" again
    await asyncio.sleep(0.5)
    relaying.cancel()
    doc = await collection.find_one({"_id": job_id})
    assert doc["_outbox"] == [] and doc["_outbox_n"] == 0
    published = [m for m in await stream_subjects(bus_and_database, "tm.job.deleted") if job_id.encode() in m]
    assert len(published) == 1  # the second relay was de-duplicated by the message id


async def test_a_stale_revision_is_refused(bus_and_database, wiring):
    broker, collection = wiring
    store = DocumentStore(collection, broker)
    assert await store.save("d", {"n": 1}, None, [])
    first = await store.load("d")
    assert await store.save("d", {"n": 2}, first, [])
    assert not await store.save("d", {"n": 3}, first, [])  # written by someone else since `first` was read
    assert not await store.save("d", {"n": 4}, None, [])  # and it is not new
    assert (await store.load("d"))["n"] == 2


async def test_a_document_written_before_revisions_is_changed_once(bus_and_database, wiring):
    broker, collection = wiring
    store = DocumentStore(collection, broker)
    await collection.insert_one({"_id": "old", "finished": False})  # a plain write: no revision
    before = await store.load("old")
    assert await store.update("old", lambda doc: ({**doc, "finished": True}, []))
    assert not await store.save("old", {"finished": False}, before, [])  # it has a revision now: `before` is stale
    assert (await store.load("old"))["finished"] is True


async def test_a_submitted_job_is_stored_with_its_announcement_and_a_taken_name_is_refused(bus_and_database, wiring):
    broker, collection = wiring
    repo = Repository(db=collection.database.client[unique("api").replace("-", "_")], broker=broker)
    await repo.create_indexes()
    first, second = submitted(), submitted()
    doc = {
        "_id": first.job_id,
        "project_id": "p",
        "name": "train",
        "user_name": "alice",
        "create_time": first.create_time,
        "status": {"phase": "Creating"},
        "status_version": 0,
    }
    pending = await repo.insert(doc, first)
    with pytest.raises(NameTaken):
        await repo.insert({**doc, "_id": second.job_id}, second)
    # the refused one left no queue entry, and a rebuild (on the real server) finds the same one
    assert await repo.queued_count(project_id="p") == 1 == await repo.queued_count(user_name="alice")
    assert await repo.rebuild_views() == 1
    stored = await repo.jobs.find_one({"_id": first.job_id})
    assert stored["create_time"] == first.create_time and stored["_outbox_n"] == 1  # stored; announced by the relay
    await repo.publish(first.job_id, pending)
    # published; pulled off its outbox a moment later with others (`DEFER_PULLS_S`), or at a graceful stop
    assert [e["event_id"] for e in (await repo.jobs.find_one({"_id": first.job_id}))["_outbox"]] == [first.event_id]
    await repo.store.pull_now()
    assert (await repo.jobs.find_one({"_id": first.job_id}))["_outbox"] == []
    assert await repo.jobs.count_documents({}) == 1
    published = [m for m in await stream_subjects(bus_and_database, "tm.job.submitted") if first.job_id.encode() in m]
    assert len(published) == 1


async def test_a_burst_of_submissions_is_stored_in_groups_within_the_caps_and_announced_once(bus_and_database, wiring):
    """The intake on the real server: duplicates in the burst and against the history refused one by one, the caps
    counted across the group, every stored job queued, listed and announced, its outbox emptied in one write."""
    broker, collection = wiring
    repo = Repository(db=collection.database.client[unique("api").replace("-", "_")], broker=broker)
    await repo.create_indexes()
    intake = Intake(repo, QueueCaps(per_project=100, per_user=4))

    def arrival(name: str, user: str = "alice") -> Arrival:
        event = submitted()
        return Arrival(
            {
                "_id": event.job_id,
                "project_id": "p",
                "name": name,
                "user_name": user,
                "create_time": event.create_time,
                "status": {"phase": "Creating"},
                "status_version": 0,
            },
            event,
        )

    await repo.insert(*vars(arrival("old")).values())
    burst = [arrival("a"), arrival("b"), arrival("a"), arrival("old"), arrival("c"), arrival("d"), arrival("e", "bob")]
    answers = await asyncio.gather(*(intake.store(a) for a in burst), return_exceptions=True)
    kinds = [type(a).__name__ if isinstance(a, Exception) else "stored" for a in answers]
    # alice had 1 queued and may have 4: a, b, c stored; the second "a" and "old" taken; d over her cap; bob's own
    assert kinds == ["stored", "stored", "NameTaken", "NameTaken", "stored", "QueueFull", "stored"]
    assert intake.store.groups == 1
    assert await repo.queued_count(user_name="alice") == 4 and await repo.queued_count(project_id="p") == 5
    assert await repo.listing.count_documents({"project_id": "p"}) == 5
    stored = [(a.doc["_id"], entries) for a, entries in zip(burst, answers) if isinstance(entries, list)]
    assert await asyncio.gather(*(intake.announce(item) for item in stored)) == [None] * 4
    await repo.store.pull_now()  # what a moment later (`DEFER_PULLS_S`) or a graceful stop pulls off
    for job_id, _ in stored:
        doc = await repo.jobs.find_one({"_id": job_id})
        assert doc["_outbox"] == [] and doc["_outbox_n"] == 0
    published = await stream_subjects(bus_and_database, "tm.job.submitted")
    for job_id, _ in stored:
        assert sum(job_id.encode() in m for m in published) == 1


async def test_a_remembered_document_is_what_the_database_would_answer(bus_and_database, wiring):
    broker, collection = wiring
    store = DocumentStore(collection, broker, remember=10)
    fields = {
        "phase": "Running",
        "at": datetime(2026, 11, 25, 9, 30, 0, 123000, tzinfo=UTC),
        "ranks": (0, 1),
        "tasks": {"0": {"node": "n1", "exit": None}},
    }
    job_id = unique("j")
    event = JobDeleted(event_id=f"{job_id}:deleted", job_id=job_id)
    assert await store.save(job_id, fields, None, [event])
    assert store._recall(job_id) == await collection.find_one({"_id": job_id})
    assert await store.update(
        job_id, lambda doc: ({**doc, "phase": "Completed"}, [JobDeleted(event_id=f"{job_id}:deleted-2", job_id=job_id)])
    )
    assert store._recall(job_id) == await collection.find_one({"_id": job_id})


@pytest.mark.parametrize("failure", ["answer lost", "entries failed", "process killed"])
async def test_a_job_stored_without_its_entries_is_listed_and_queued_again(
    bus_and_database, wiring, monkeypatch, failure
):
    """Seen in the failover test: a job was stored and its entries were not (an insert's answer lost, the entries'
    write failing after it, or the replica killed between the two); its create was answered 503, the retry was told
    the name is taken, and the job ran without a list entry or a queue entry (its statuses update entries, never
    make them): listed by no one, counted by no cap. The failed create, else the retry, writes them."""
    broker, collection = wiring
    repo = Repository(db=collection.database.client[unique("api").replace("-", "_")], broker=broker)
    await repo.create_indexes()
    event = submitted()
    doc = {
        "_id": event.job_id,
        "project_id": "p",
        "name": "lost-answer",
        "user_name": "alice",
        "create_time": event.create_time,
        "status": {"phase": "Creating"},
        "status_version": 0,
    }
    if failure == "process killed":  # the job written, nothing after it
        await repo.store.insert_many([(doc["_id"], doc, [event])])
    else:
        landed = repo.store.insert_many

        async def insert_answer_lost(items):
            await landed(items)
            raise pymongo.errors.AutoReconnect("connection closed")  # as a timeout after the server applied it

        async def entries_failed(stored):
            raise pymongo.errors.AutoReconnect("connection closed")

        if failure == "answer lost":
            monkeypatch.setattr(repo.store, "insert_many", insert_answer_lost)
        else:
            monkeypatch.setattr(repo.views, "add_new", entries_failed)
        with pytest.raises(pymongo.errors.AutoReconnect):
            await repo.insert(doc, event)
        monkeypatch.undo()
    again = submitted()
    with pytest.raises(NameTaken):  # the client's retry
        await repo.insert({**doc, "_id": again.job_id}, again)
    total, listed = await repo.page("p", phases=[], offset=0, limit=10)
    assert total == 1 and [d["_id"] for d in listed] == [event.job_id]
    assert await repo.queued_count(project_id="p") == 1 == await repo.queued_count(user_name="alice")
