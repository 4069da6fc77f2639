"""A receiver of output's placement records (`shared.origin.Origins`): the records of placements read within a short
window go out in one insert; each placement is known at once (output is judged by it while its record waits), a
record stored already (a redelivery, another consumer, a lost answer) is no error, and one not stored is written
again at the next delivery."""

import asyncio

import pytest
from pymongo.errors import AutoReconnect

from shared.origin import Origins, attempt_key
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
