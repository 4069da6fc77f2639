"""The one conflict-retry helper: load, change, save until no one wrote in between, and raise when it gives up."""
import pytest

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
