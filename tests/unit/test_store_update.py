"""The one conflict-retry helper: load, change, save until no one wrote in between, and raise when it gives up."""

import asyncio

import pytest
from pymongo import UpdateOne

from shared.events import JobDeleted
from shared.store import OUTBOX, REVISION, ConflictsExhausted, DocumentStore
from services.placement.fleet import Fleet, FleetNode
from tests.memory import MemoryCollection, Result


class Bus:
    """A broker that keeps what is published."""

    def __init__(self) -> None:
        self.published: list[tuple[str, dict]] = []

    async def publish(self, payload: dict, subject: str, **_) -> None:
        self.published.append((subject, payload))


class Contended(MemoryCollection):
    """A collection another writer always changes between our read and our write."""

    async def replace_one(self, query: dict, doc: dict, upsert: bool = False) -> Result:
        return Result(0)


def store(collection: MemoryCollection | None = None) -> DocumentStore:
    return DocumentStore(collection or MemoryCollection(), Bus())


async def test_a_change_is_retried_over_what_another_writer_stored():
    jobs = store()
    await jobs.save("j", {"n": 1}, None, [])
    seen = []

    def add_one(doc):
        seen.append(doc["n"])
        if len(seen) == 1:  # another writer gets in between our read and our write, once
            jobs.collection.docs["j"] |= {"n": 10, REVISION: doc[REVISION] + 1}
        return {"n": doc["n"] + 1}, [JobDeleted(event_id="j:deleted", job_id="j")]

    assert await jobs.update("j", add_one)
    assert seen == [1, 10]
    doc = await jobs.load("j")
    assert doc["n"] == 11 and doc[OUTBOX] == []
    assert [subject for subject, _ in jobs.broker.published] == ["tm.job.deleted"]


async def test_it_raises_when_every_attempt_loses_the_race_and_writes_nothing():
    jobs = store(Contended())
    await jobs.save("j", {"n": 1}, None, [])
    with pytest.raises(ConflictsExhausted, match="3 times"):
        await jobs.update("j", lambda doc: ({"n": 2}, [JobDeleted(event_id="j:deleted", job_id="j")]), attempts=3)
    assert (await jobs.load("j"))["n"] == 1 and jobs.broker.published == []


async def test_nothing_to_change_writes_nothing():
    jobs = store()
    assert not await jobs.update("j", lambda doc: None)
    assert await jobs.load("j") is None


async def test_a_document_stored_before_revisions_is_updated():
    jobs = store()
    jobs.collection.docs["j"] = {"_id": "j", "finished": False}  # written by a plain upsert: no revision
    assert await jobs.update("j", lambda doc: ({**doc, "finished": True}, []))
    assert (await jobs.load("j"))["finished"] is True


async def test_placement_fleet_raises_instead_of_keeping_a_node_it_could_not_store():
    fleet = Fleet(store=store(Contended()), provider=None)
    fleet.nodes["n1"] = FleetNode(node_id="n1")
    await fleet.store.save("n1", fleet.nodes["n1"].model_dump(), None, [])
    with pytest.raises(ConflictsExhausted):
        await fleet.reserve("n1", "j")
    assert fleet.nodes["n1"].reserved_for is None


class Counted(MemoryCollection):
    """Counts the writes that take published events off."""

    def __init__(self) -> None:
        super().__init__("counted")
        self.pull_writes: list[int] = []  # events pulled by each write
        self.in_bulk = False

    async def update_one(self, query: dict, update: dict, upsert: bool = False) -> Result:
        if "$pull" in update and not self.in_bulk:
            self.pull_writes.append(1)
        return await super().update_one(query, update, upsert)

    async def bulk_write(self, requests: list, ordered: bool = True) -> Result:
        if pulls := sum(isinstance(r, UpdateOne) for r in requests):  # documents' changes may go along, or alone
            self.pull_writes.append(pulls)
        self.in_bulk = True
        try:
            return await super().bulk_write(requests, ordered)
        finally:
            self.in_bulk = False


class Slow(Bus):
    async def publish(self, payload: dict, subject: str, **_) -> None:
        await asyncio.sleep(0)  # the broker answers on a later turn of the loop, as NATS does
        await super().publish(payload, subject)


async def test_events_published_side_by_side_are_pulled_off_in_one_write_and_a_lone_one_at_once():
    jobs = DocumentStore(Counted(), Slow())
    events = [JobDeleted(event_id=f"j{i}:deleted", job_id=f"j{i}") for i in range(20)]
    await asyncio.gather(*(jobs.save(f"j{i}", {"n": i}, None, [events[i]]) for i in range(20)))
    assert sum(jobs.collection.pull_writes) == 20 and len(jobs.collection.pull_writes) < 5
    assert all(doc[OUTBOX] == [] for doc in jobs.collection.docs.values())
    jobs.collection.pull_writes.clear()
    await jobs.save("alone", {"n": 1}, None, [JobDeleted(event_id="alone:deleted", job_id="alone")])
    assert jobs.collection.pull_writes == [1] and (await jobs.load("alone"))[OUTBOX] == []


class Refusing(Bus):
    async def publish(self, payload: dict, subject: str, **_) -> None:
        if payload["job_id"] == "second":
            raise ConnectionError("the bus is away")
        await super().publish(payload, subject)


async def test_what_was_published_before_a_failure_is_pulled_off_and_the_rest_stays_for_the_relay():
    jobs = DocumentStore(MemoryCollection(), Refusing())
    events = [JobDeleted(event_id=f"{j}:deleted", job_id=j) for j in ("first", "second", "third")]
    with pytest.raises(ConnectionError):
        await jobs.save("d", {"n": 1}, None, events)
    assert [e["event_id"] for e in (await jobs.load("d"))[OUTBOX]] == ["second:deleted", "third:deleted"]


class Reading(DocumentStore):
    """Counts the documents it reads."""

    reads = 0

    async def load(self, doc_id):
        self.reads += 1
        return await super().load(doc_id)


def bump(doc):
    return {"n": doc["n"] + 1 if doc else 1, "at": [1, 2]}, [JobDeleted(event_id=f"d:{doc and doc['n']}", job_id="d")]


async def test_a_remembered_document_changes_without_a_read_and_a_stale_one_costs_a_lost_race():
    jobs = Reading(MemoryCollection(), Bus(), remember=2)
    for _ in range(3):
        assert await jobs.update("d", bump)
    assert jobs.reads == 1  # the first: nothing remembered yet
    stored = jobs.collection.docs["d"]
    assert stored["n"] == 3 and stored[OUTBOX] == [] and jobs._recall("d") == stored
    stored |= {"n": 10, REVISION: stored[REVISION] + 1}  # another writer, behind this process's back
    assert await jobs.update("d", bump)
    assert jobs.collection.docs["d"]["n"] == 11 and jobs.reads == 2
    for doc_id in ("e", "f", "g"):  # only the two last written are kept
        await jobs.update(doc_id, bump)
    assert jobs._recall("d") is None and jobs._recall("g") is not None


async def test_the_current_document_is_the_remembered_one_without_a_read_else_the_stored_one():
    jobs = Reading(MemoryCollection(), Bus(), remember=1)
    await jobs.update("d", bump)
    reads = jobs.reads
    assert (await jobs.current("d"))["n"] == 1 and jobs.reads == reads  # remembered: no read
    await jobs.update("e", bump)  # pushes "d" out
    reads = jobs.reads
    assert (await jobs.current("d"))["n"] == 1 and jobs.reads == reads + 1


async def test_nothing_is_remembered_of_a_write_whose_events_did_not_all_go_out():
    jobs = DocumentStore(MemoryCollection(), Refusing(), remember=10)
    with pytest.raises(ConnectionError):
        await jobs.save("d", {"n": 1}, None, [JobDeleted(event_id="second:deleted", job_id="second")])
    assert jobs._recall("d") is None


class CountingReads(MemoryCollection):
    def __init__(self) -> None:
        super().__init__("counted")
        self.reads = 0

    async def find_one(self, query: dict, projection: dict | None = None):
        self.reads += 1
        return await super().find_one(query, projection)


async def test_a_new_document_is_inserted_without_a_read_and_a_stored_one_is_read_and_kept():
    collection = CountingReads()
    jobs = store(collection)
    create = lambda doc: None if doc else ({"n": 1}, [])  # noqa: E731 - a job's first event: only on nothing
    assert await jobs.update("j", create, new=True)
    assert collection.reads == 0 and (await collection.find_one({"_id": "j"}))["n"] == 1
    collection.reads = 0
    assert not await jobs.update("j", create, new=True)  # redelivered: the insert is refused, the stored one read
    assert collection.reads == 1 and collection.docs["j"]["n"] == 1
    collection.reads = 0
    assert (
        await jobs.update("k", lambda doc: ({"n": (doc or {}).get("n", 0) + 1}, []) if doc else None, new=True) is False
    )  # nothing to make of nothing: what is stored (none) decides
    assert collection.reads == 1 and "k" not in collection.docs
