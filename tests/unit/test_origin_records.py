"""A receiver of output's placement records (`shared.origin.Origins`): the records of placements read within a short
window go out in one insert; each placement is known at once (output is judged by it while its record waits), a
record stored already (a redelivery, another consumer, a lost answer) is no error, and one not stored is written
again at the next delivery."""

import asyncio

import pytest
from bson.errors import InvalidDocument
from pymongo.errors import AutoReconnect, BulkWriteError

from shared import origin as origin_module
from shared.origin import RECORDS_WINDOW_S, Origins, attempt_key
from tests.factories import chunk, placed, unique
from tests.memory import MemoryCollection


class CountingInserts(MemoryCollection):
    """The records, counting write commands (one insert, many, or a bulk write each)."""

    def __init__(self) -> None:
        super().__init__("placements")
        self.inserts = 0
        self.down = False

        self._within = False  # the memory collection's own bulk writes insert one by one: one command

    def _sent(self) -> None:
        if self._within:
            return
        self.inserts += 1
        if self.down:
            raise AutoReconnect("database away")

    async def insert_one(self, doc):
        self._sent()
        return await super().insert_one(doc)

    async def insert_many(self, docs, ordered=True):
        self._sent()
        self._within = True
        try:
            return await super().insert_many(docs, ordered=ordered)
        finally:
            self._within = False

    async def bulk_write(self, requests, ordered=True):
        self._sent()
        self._within = True
        try:
            return await super().bulk_write(requests, ordered=ordered)
        finally:
            self._within = False


async def all_read() -> bool:
    return True


@pytest.fixture(autouse=True)
def short_window(monkeypatch):
    """The window of the tests below but the last, which reads a few placements as a burst brings them."""
    monkeypatch.setattr(origin_module, "RECORDS_WINDOW_S", 0.1)


async def test_placements_read_one_after_another_within_the_window_are_stored_in_one_insert():
    records = CountingInserts()
    origins = Origins(placements=records, all_read=all_read)
    jobs = [unique("j") for _ in range(5)]
    tasks = []
    for job_id in jobs:  # one at a time, as a consumer reads them at a few jobs a second
        tasks.append(asyncio.create_task(origins.placed(placed(job_id, nodes=("n1",)))))
        await asyncio.sleep(0)
        assert await origins.admit(chunk(job_id, node_id="n1"), deliveries=1)  # known before its record is written
        assert await origins.given(job_id, 1, 0) is not None  # ... and the GPUs it gave (a sample is judged by them)
    await asyncio.gather(*tasks)
    assert records.inserts == 1 and sorted(records.docs) == sorted(attempt_key(j, 1) for j in jobs)


async def test_a_record_stored_already_is_no_error_and_one_not_stored_is_written_at_the_next_delivery():
    records = CountingInserts()
    job_id, other = unique("j"), unique("j")
    await Origins(placements=records, all_read=all_read).placed(placed(job_id))  # another process stored it
    origins = Origins(placements=records, all_read=all_read)
    records.down = True
    with pytest.raises(AutoReconnect):
        await asyncio.gather(origins.placed(placed(job_id)), origins.placed(placed(other)))
    records.down = False
    await asyncio.gather(origins.placed(placed(job_id)), origins.placed(placed(other)))  # redelivered
    assert sorted(records.docs) == sorted([attempt_key(job_id, 1), attempt_key(other, 1)])
    inserts = records.inserts
    await origins.placed(placed(other))  # redelivered once more: stored here, nothing written
    assert records.inserts == inserts


class SlowFirstWrite(CountingInserts):
    """The first insert hangs until let go, then fails (a database electing a primary past the ack wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def insert_many(self, docs, ordered=True):
        if self.inserts == 0:
            self.inserts += 1
            await self.gate.wait()
            raise AutoReconnect("primary stepped down")
        return await super().insert_many(docs, ordered=ordered)


async def test_a_redelivery_while_the_first_write_is_out_is_not_acknowledged_before_a_write_lands():
    records = SlowFirstWrite()
    origins = Origins(placements=records, all_read=all_read)
    job_id = unique("j")
    first = asyncio.create_task(origins.placed(placed(job_id)))
    while records.inserts == 0:  # its group's write is out (past the window)
        await asyncio.sleep(0.05)
    again = asyncio.create_task(origins.placed(placed(job_id)))  # redelivered: the ack wait ran out
    for _ in range(5):
        await asyncio.sleep(0)
    assert not again.done()  # not acknowledged on the strength of a write that has not landed
    records.gate.set()
    for delivery in (first, again):  # both fail with the write: both come again
        with pytest.raises(AutoReconnect):
            await delivery
    assert records.docs == {} and len(origins.stored) == 0
    await origins.placed(placed(job_id))
    assert list(records.docs) == [attempt_key(job_id, 1)]


class RefusesOneRecord(CountingInserts):
    """The driver cannot send one record (`InvalidDocument`, raised before anything is written)."""

    async def insert_many(self, docs, ordered=True):
        if any(doc["job_id"].startswith("bad") for doc in docs):
            raise InvalidDocument("cannot encode object")
        return await super().insert_many(docs, ordered=ordered)

    async def insert_one(self, doc):
        if doc["job_id"].startswith("bad"):
            raise InvalidDocument("cannot encode object")
        return await super().insert_one(doc)


async def test_a_record_the_driver_refuses_fails_alone_and_the_rest_of_its_group_is_stored():
    records = RefusesOneRecord()
    origins = Origins(placements=records, all_read=all_read)
    good, bad = [unique("j") for _ in range(3)], unique("bad")
    outcomes = await asyncio.gather(*(origins.placed(placed(j)) for j in [*good, bad]), return_exceptions=True)
    assert outcomes[:3] == [None] * 3 and isinstance(outcomes[3], InvalidDocument)
    assert sorted(records.docs) == sorted(attempt_key(j, 1) for j in good)


class WriteConcernLost(CountingInserts):
    async def insert_many(self, docs, ordered=True):
        await super().insert_many(docs, ordered=ordered)
        raise BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 64, "errmsg": "waiting"}]})


async def test_a_write_concern_error_fails_the_whole_group_so_every_record_comes_again():
    origins = Origins(placements=WriteConcernLost(), all_read=all_read)
    outcomes = await asyncio.gather(*(origins.placed(placed(unique("j"))) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(o, BulkWriteError) for o in outcomes)
    assert len(origins.stored) == 0  # none marked stored: each delivery writes again


async def test_placements_read_a_few_tenths_of_a_second_apart_share_their_insert():
    """As a burst of a few jobs a second brings them (at 0.2 s each was an insert of its own)."""
    records = CountingInserts()
    origins = Origins(placements=records, all_read=all_read)
    origins.records.window_s = RECORDS_WINDOW_S  # as the services read them
    tasks = []
    for _ in range(3):
        tasks.append(asyncio.create_task(origins.placed(placed(unique("j")))))
        await asyncio.sleep(0.3)
    await asyncio.gather(*tasks)
    assert records.inserts == 1 and len(records.docs) == 3
