"""Published events pulled off later (`DocumentStore(defer_pulls_s=...)`): a job's next write drops them for nothing,
what is left goes in one bulk write; every event is published once and no outbox keeps what went out."""

import asyncio
from types import SimpleNamespace

from shared.events import JobDeleted
from shared.store import DEFER_PULLS_S, OUTBOX, DocumentStore, relay
from services.submitter.repository import Repository
from tests.memory import MemoryCollection
from tests.unit.test_store_update import Bus, Counted, Reading

# the submitter's other collections
VIEWS = ("api_logs", "api_log_sizes", "api_notifications", "api_projects", "api_queue", "api_job_list")

DELAY_S = 0.05


def bump(job_id: str):
    def change(doc):
        n = doc["n"] + 1 if doc else 1
        return {"n": n}, [JobDeleted(event_id=f"{job_id}:{n}", job_id=job_id)]

    return change


async def test_a_jobs_next_write_drops_its_published_events_and_the_rest_go_in_one_write():
    # a second for the next change to come: at 0.05 s a loaded suite's pause between two changes let a pull go
    # first (one run in many: the test said nothing of the store then)
    bus, collection = Bus(), Counted()
    jobs = DocumentStore(collection, bus, remember=100, defer_pulls_s=1.0)
    for step in range(4):  # four jobs, four changes each, each change publishing one event
        await asyncio.gather(*(jobs.update(f"j{i}", bump(f"j{i}"), new=step == 0) for i in range(4)))
    assert collection.pull_writes == []  # the next change of each job took the last one's event off with it
    assert all(len(doc[OUTBOX]) == 1 for doc in collection.docs.values())  # the last event: published, not pulled
    for _ in range(100):
        if collection.pull_writes:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # a second write would come with the first, not later
    assert collection.pull_writes == [4]  # one write for every job's last event
    assert all(doc[OUTBOX] == [] and doc["_outbox_n"] == 0 for doc in collection.docs.values())
    assert sorted(p["event_id"] for _, p in bus.published) == sorted(f"j{i}:{n}" for i in range(4) for n in range(1, 5))


async def test_after_the_deferred_pull_the_remembered_document_is_what_is_stored():
    jobs = Reading(Counted(), Bus(), remember=10, defer_pulls_s=DELAY_S)
    await jobs.update("d", bump("d"))
    await asyncio.sleep(DELAY_S * 3)
    assert jobs._recall("d") == jobs.collection.docs["d"]
    await jobs.update("d", bump("d"))  # from memory: no read, no refused write
    assert jobs.reads == 1 and jobs.collection.docs["d"]["n"] == 2


async def test_the_relay_leaves_events_waiting_for_their_pull_and_relays_the_unpublished():
    bus, collection = Bus(), Counted()
    jobs = DocumentStore(collection, bus, remember=10, defer_pulls_s=60)  # the pull would come much later
    await jobs.update("published", bump("published"))
    await jobs.write("crashed", {"n": 1}, None, [JobDeleted(event_id="crashed:1", job_id="crashed")])  # not sent
    task = asyncio.create_task(relay(bus, [collection], interval_s=60))
    await asyncio.sleep(0.05)
    task.cancel()
    assert [p["event_id"] for _, p in bus.published] == ["published:1", "crashed:1"]  # each once
    assert collection.docs["crashed"][OUTBOX] == []


async def test_the_services_pull_the_last_events_of_jobs_ending_a_second_apart_in_one_write():
    """As the state machines are built (`DEFER_PULLS_S`): jobs ending half a second apart, as a burst of a few jobs
    a second ends them, share the pull of their last events (at 0.5 s each was one write of its own)."""
    bus, collection = Bus(), Counted()
    jobs = DocumentStore(collection, bus, remember=100, defer_pulls_s=DEFER_PULLS_S)
    for i in range(3):
        await jobs.update(f"end-{i}", bump(f"end-{i}"), new=True)
        await asyncio.sleep(0.5)
    await asyncio.sleep(DEFER_PULLS_S)
    assert collection.pull_writes == [3]
    assert all(doc[OUTBOX] == [] for doc in collection.docs.values())


async def test_the_submitters_new_jobs_announced_half_a_second_apart_are_pulled_off_in_one_write():
    """A burst of a few jobs a second stores and announces each in a group of its own: their announcements share
    one pull (one write for each intake group before), and each was published once."""
    bus, jobs = Bus(), Counted()
    db = SimpleNamespace(api_jobs=jobs, **{name: MemoryCollection(name) for name in VIEWS})
    repo = Repository(db=db, broker=bus)  # type: ignore[arg-type]
    for i in range(3):
        job_id = f"new-{i}"
        [pending] = await repo.store.insert_many([(job_id, {"n": 1}, [JobDeleted(event_id=job_id, job_id=job_id)])])
        assert pending is not None and await repo.publish_many([(job_id, pending)]) == [None]
        await asyncio.sleep(0.5)
    assert jobs.pull_writes == []
    await asyncio.sleep(DEFER_PULLS_S)
    assert jobs.pull_writes == [3]
    assert all(doc[OUTBOX] == [] for doc in jobs.docs.values())
    assert sorted(p["event_id"] for _, p in bus.published) == ["new-0", "new-1", "new-2"]
