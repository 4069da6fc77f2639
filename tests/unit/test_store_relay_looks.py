"""The outbox relay looks through its collections (a scan of every document on the embedded database) at its start,
again soon after a publish failed in this process, and otherwise now and then for what another writer left; not
every 2 s whatever happened."""

import asyncio

import pytest

from shared.events import JobDeleted
from shared.store import DocumentStore, relay
from tests.conftest import eventually
from tests.memory import MemoryCollection
from tests.unit.test_store_update import Bus


class Looked(MemoryCollection):
    """Counts the relay's looks (a query on the outbox count)."""

    def __init__(self) -> None:
        super().__init__("looked")
        self.looks = 0

    def find(self, query: dict | None = None, projection: dict | None = None):
        if query and "_outbox_n" in query:
            self.looks += 1
        return super().find(query, projection)


class Down:
    async def publish(self, *_, **__) -> None:
        raise ConnectionError("bus away")


def event(job_id: str) -> list[JobDeleted]:
    return [JobDeleted(event_id=f"{job_id}:1", job_id=job_id)]


def published(bus: Bus, count: int):
    async def check() -> bool:
        return len(bus.published) >= count

    return check


async def test_the_relay_looks_again_soon_only_after_a_publish_failed_here():
    bus, collection = Bus(), Looked()
    jobs = DocumentStore(collection, bus)
    relaying = asyncio.create_task(relay(bus, [collection], interval_s=0.01, idle_s=60))
    try:
        await asyncio.sleep(0.1)
        await jobs.write("left", {"n": 1}, None, event("left"))  # as another writer that died would leave it
        await asyncio.sleep(0.1)
        assert collection.looks == 1 and bus.published == []  # ten intervals, one look: the one at start
        jobs.broker = Down()
        with pytest.raises(ConnectionError):
            await jobs.save("failed", {"n": 1}, None, event("failed"))
        jobs.broker = bus  # back: the next look publishes what waits, the failed and the left alike
        await eventually(published(bus, 2), timeout_s=5, interval_s=0.01)
        assert sorted(p["event_id"] for _, p in bus.published) == ["failed:1", "left:1"]
        looks = collection.looks
        await asyncio.sleep(0.1)
        assert collection.looks == looks  # nothing failed since: no more looks
    finally:
        relaying.cancel()


async def test_what_another_writer_left_is_published_at_the_next_idle_look():
    bus, collection = Bus(), Looked()
    jobs = DocumentStore(collection, bus)
    relaying = asyncio.create_task(relay(bus, [collection], interval_s=0.01, idle_s=0.3))
    try:
        await asyncio.sleep(0.05)
        await jobs.write("left", {"n": 1}, None, event("left"))
        await eventually(published(bus, 1), timeout_s=5, interval_s=0.01)
        assert [p["event_id"] for _, p in bus.published] == ["left:1"]
    finally:
        relaying.cancel()


class AnswerLost(Looked):
    """A write that lands and whose answer is lost (a retryable write's retry failing in a primary election)."""

    async def update_one(self, *args, **kwargs):
        await super().update_one(*args, **kwargs)
        raise ConnectionError("answer lost")

    async def insert_one(self, *args, **kwargs):
        await super().insert_one(*args, **kwargs)
        raise ConnectionError("answer lost")

    async def insert_many(self, *args, **kwargs):
        await super().insert_many(*args, **kwargs)
        raise ConnectionError("answer lost")


@pytest.mark.parametrize("how", ["save", "insert_many"])
async def test_a_write_that_landed_with_its_answer_lost_is_relayed_soon(how):
    """Its events are stored and nobody published them: the relay used to find them at its idle look (30 s)."""
    bus, collection = Bus(), AnswerLost()
    jobs = DocumentStore(collection, bus)
    relaying = asyncio.create_task(relay(bus, [collection], interval_s=0.01, idle_s=60))
    try:
        await asyncio.sleep(0.1)
        with pytest.raises(ConnectionError):
            if how == "save":
                await jobs.save("lost", {"n": 1}, None, event("lost"))
            else:
                await jobs.insert_many([("lost", {"n": 1}, event("lost"))])
        await eventually(published(bus, 1), timeout_s=5, interval_s=0.01)
        assert [p["event_id"] for _, p in bus.published] == ["lost:1"]
    finally:
        relaying.cancel()
