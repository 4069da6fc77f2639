"""A write group answers each of its items on its own (`shared.grouped`), on the embedded database: whether a
conditional replacement matched is what the server said of it, not what its document reads like afterwards (another
writer may have replaced it since), and one item's error is that item's alone."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ClientBulkWriteException,
    DuplicateKeyError,
    InvalidOperation,
    OperationFailure,
    WriteConcernError,
    WriteError,
)

from shared.grouped import insert_grouped, replace_if, update_grouped
from shared.store import REVISION, DocumentStore
from tests.factories import unique
from tests.integration.test_status_writes import database  # noqa: F401 (the module's embedded server)
from tests.unit.api_app import client, make_app

pytestmark = pytest.mark.integration


class AfterTheWrite(monitoring.CommandListener):
    """Runs `then` once, right after the first write command the server answers: another writer getting in
    between a group's write and anything that group does next. `seen`: the commands sent, by name."""

    def __init__(self) -> None:
        self.then: Any = None
        self.seen: list[str] = []

    def started(self, event) -> None:
        self.seen.append(event.command_name)

    def succeeded(self, event) -> None:
        if self.then is not None and event.command_name in ("update", "bulkWrite"):
            then, self.then = self.then, None
            then()

    def failed(self, event) -> None:
        pass


@pytest.fixture
def racing(database) -> Iterator[tuple[AsyncMongoClient, pymongo.MongoClient, AfterTheWrite]]:  # noqa: F811
    """A client whose writes another writer (a client of its own) can follow at once."""
    after = AfterTheWrite()
    ours = AsyncMongoClient(database, tz_aware=True, event_listeners=[after])
    other: pymongo.MongoClient = pymongo.MongoClient(database, tz_aware=True)
    yield ours, other, after
    other.close()


async def test_a_change_that_landed_and_was_replaced_at_once_by_another_writer_is_told_it_landed(racing):
    """Three changes in one group, one of them stale: the group's command does not match all. Right after it,
    another writer changes `a` on the revision ours made. Ours landed and must be told so (read back, `a` showed
    the other writer's mark, so its caller took it as lost and made its change again on top)."""
    ours, other, after = racing
    name = unique("race").replace("-", "_")
    store = DocumentStore(ours[name].docs, broker=None)  # type: ignore[arg-type]  # no events: nothing published
    await store.collection.insert_many([{"_id": d, "count": 0, REVISION: 1} for d in ("a", "b", "c")])
    current = {d: await store.load(d) for d in ("a", "b", "c")}
    stale = {**current["c"], REVISION: 0}

    def the_other_writer() -> None:
        stored = other[name].docs.find_one({"_id": "a"})
        assert stored is not None and stored[REVISION] == 2  # ours landed
        # its own document, as a change writes it (a DocumentStore's with a mark of its own, none here)
        replaced = other[name].docs.replace_one({"_id": "a", REVISION: 2}, {"count": stored["count"] + 10, REVISION: 3})
        assert replaced.matched_count == 1

    after.then = the_other_writer
    answers = await asyncio.gather(
        store.save("a", {"count": 1}, current["a"], []),
        store.save("b", {"count": 1}, current["b"], []),
        store.save("c", {"count": 1}, stale, []),
    )
    assert after.then is None  # the other writer did get in between
    assert after.seen.count("bulkWrite") == 1 and "update" not in after.seen  # the three in one command
    assert answers == [True, True, False]
    assert [(d["_id"], d["count"]) async for d in store.collection.find({})] == [("a", 11), ("b", 1), ("c", 0)]
    await ours.close()


async def test_one_items_error_fails_that_item_alone_and_its_group_is_written(racing):
    """An insert and updates beside conditional replacements, one of which breaks a unique index and one update
    that cannot apply: those two raise, every other item is written and answered as it was (each raised the
    other's error before, the insert that landed included, so its caller would try it again as refused)."""
    ours, _, after = racing
    collection = ours[unique("isolated").replace("-", "_")].docs
    await collection.create_index("slot", unique=True)
    await collection.insert_many([{"_id": f"j{n}", "slot": n, "text": "x", REVISION: 1} for n in range(4)])
    answers = await asyncio.gather(
        insert_grouped(collection, {"_id": "new", "slot": 9}),
        replace_if(collection, {"_id": "j0", REVISION: 1}, {"slot": 0, REVISION: 2}),
        replace_if(collection, {"_id": "j1", REVISION: 1}, {"slot": 0, REVISION: 2}),  # j0's slot: refused
        replace_if(collection, {"_id": "j2", REVISION: 7}, {"slot": 2, REVISION: 8}),  # stale
        update_grouped(collection, [({"_id": "j3"}, {"$inc": {"text": 1}})]),  # not a number
        update_grouped(collection, [({"_id": "j3"}, {"$set": {"seen": "yes"}})]),
        return_exceptions=True,
    )
    assert answers[0] is True and answers[1] is True and answers[3] is False and answers[5] is False
    assert isinstance(answers[2], DuplicateKeyError)
    assert isinstance(answers[4], WriteError) and not isinstance(answers[4], DuplicateKeyError)
    stored = {d["_id"]: d async for d in collection.find({})}
    assert stored["new"]["slot"] == 9 and stored["j0"][REVISION] == 2 and stored["j1"][REVISION] == 1
    assert stored["j3"]["seen"] == "yes" and stored["j3"]["text"] == "x"
    assert after.seen.count("bulkWrite") == 1  # the conditional replacements' own command
    await ours.close()


REFUSALS = {
    "before MongoDB 8.0": InvalidOperation("MongoClient.bulk_write requires MongoDB server version 8.0+."),
    "not authorized": ClientBulkWriteException(
        {"error": OperationFailure("not authorized on admin to execute command", 13), "writeErrors": []}, True
    ),
    "feature compatibility below 8.0": ClientBulkWriteException(
        {"error": OperationFailure("bulkWrite is not supported", 115), "writeErrors": []}, True
    ),
}


@pytest.mark.parametrize("refusal", REFUSALS)
async def test_a_server_without_the_bulk_write_command_answers_each_replacement_as_exactly(
    racing, monkeypatch, refusal
):
    """MongoDB before 8.0 has no `bulkWrite` command (pymongo refuses before sending), and a user whose role names
    only its collections' actions may not run it: each conditional replacement goes as a command of its own, with
    its own answer; so on a MongoDB 8 still at an older feature compatibility version (after an upgrade). The
    refusal is remembered: the next group is not refused again first (every group was)."""
    ours, _, after = racing
    asked = 0

    async def no_command(*args, **kwargs):
        nonlocal asked
        asked += 1
        raise REFUSALS[refusal]

    monkeypatch.setattr(AsyncMongoClient, "bulk_write", no_command)
    collection = ours[unique("older").replace("-", "_")].docs
    await collection.insert_many([{"_id": f"j{n}", REVISION: 1} for n in range(3)])
    for revision in (1, 2):
        answers = await asyncio.gather(
            *(
                replace_if(collection, {"_id": f"j{n}", REVISION: revision if n != 1 else 5}, {REVISION: revision + 1})
                for n in range(3)
            )
        )
        assert answers == [True, False, True]
    assert [d[REVISION] async for d in collection.find({})] == [3, 1, 3]
    assert asked == 1 and after.seen.count("update") == 6  # one command per replacement, no refused one again
    await ours.close()


async def test_a_server_without_the_bulk_write_command_gets_a_groups_replacements_at_once(racing, monkeypatch):
    """Each replacement's command is sent without waiting for the one before: a group of k waited for k round
    trips one after another, and every other write of the process with it."""
    ours, _, _ = racing
    monkeypatch.setattr(AsyncMongoClient, "bulk_write", REFUSING)
    together = asyncio.Barrier(3)
    replace = AsyncCollection.replace_one

    async def replace_when_all_are_sent(self, *args, **kwargs):
        await asyncio.wait_for(together.wait(), 5)  # one after another: the first waits for the others in vain
        return await replace(self, *args, **kwargs)

    monkeypatch.setattr(AsyncCollection, "replace_one", replace_when_all_are_sent)
    collection = ours[unique("together").replace("-", "_")].docs
    await collection.insert_many([{"_id": f"j{n}", REVISION: 1} for n in range(3)])
    answers = await asyncio.gather(
        *(replace_if(collection, {"_id": f"j{n}", REVISION: 1}, {REVISION: 2}) for n in range(3))
    )
    assert answers == [True, True, True]
    await ours.close()


async def REFUSING(*args, **kwargs):
    raise REFUSALS["before MongoDB 8.0"]


def failing_after(count: int, *, error: Exception | None = None, concern: bool = False):
    """A client `bulk_write` whose first `count` requests the server applies and answers; then `error` ends the
    command (a later batch of a group split in several, the connection lost), or a write concern error comes
    back with the answers."""
    write = AsyncMongoClient.bulk_write

    async def bulk_write(self, models, **kwargs):
        details: dict[str, Any] = {"anySuccessful": False, "updateResults": {}, "insertResults": {}}
        if count:
            applied = await write(self, models[:count], **kwargs)
            details = {**applied.bulk_api_result, "anySuccessful": True}
        wce = [{"code": 64, "errmsg": "waiting for replication timed out"}] if concern else []
        raise ClientBulkWriteException({**details, "error": error, "writeErrors": [], "writeConcernErrors": wce}, True)

    return bulk_write


async def test_requests_the_server_answered_before_the_command_failed_keep_their_answers(racing, monkeypatch):
    """The first two landed, then the connection was lost: those two are told so, the third gets the error (all
    three got it: the callers of the two took their changes as lost, and their retries no longer matched)."""
    ours, _, _ = racing
    monkeypatch.setattr(AsyncMongoClient, "bulk_write", failing_after(2, error=AutoReconnect("connection reset")))
    collection = ours[unique("partial").replace("-", "_")].docs
    await collection.insert_many([{"_id": f"j{n}", REVISION: 1} for n in range(3)])
    answers = await asyncio.gather(
        *(replace_if(collection, {"_id": f"j{n}", REVISION: 1 if n else 7}, {REVISION: 2}) for n in range(3)),
        return_exceptions=True,
    )
    assert answers[:2] == [False, True] and isinstance(answers[2], AutoReconnect)
    await ours.close()


async def test_a_command_that_failed_as_a_whole_raises_its_own_error(racing, monkeypatch):
    """The database away: each item raises the connection error itself, not pymongo's wrapper of it (which the
    API's handler of an unreachable database does not catch: a 500, not a 503 with Retry-After)."""
    ours, _, _ = racing
    monkeypatch.setattr(AsyncMongoClient, "bulk_write", failing_after(0, error=AutoReconnect("connection refused")))
    collection = ours[unique("away").replace("-", "_")].docs
    answers = await asyncio.gather(
        *(replace_if(collection, {"_id": f"j{n}"}, {REVISION: 2}) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(a, AutoReconnect) for a in answers), answers
    await ours.close()


async def test_a_write_concern_error_is_no_success(racing, monkeypatch):
    """Applied on the primary, not confirmed as the write concern asks (it may be rolled back): raised, as a single
    write raises it, both from the conditional replacements' command and from the group's other writes (each was
    answered as written)."""
    ours, _, _ = racing
    monkeypatch.setattr(AsyncMongoClient, "bulk_write", failing_after(2, concern=True))
    write = AsyncCollection.bulk_write

    async def unconfirmed(self, requests, **kwargs):
        applied = await write(self, requests, **kwargs)
        concern = [{"code": 64, "errmsg": "waiting for replication timed out"}]
        raise BulkWriteError({**applied.bulk_api_result, "writeErrors": [], "writeConcernErrors": concern})

    monkeypatch.setattr(AsyncCollection, "bulk_write", unconfirmed)
    collection = ours[unique("unconfirmed").replace("-", "_")].docs
    await collection.insert_many([{"_id": f"j{n}", REVISION: 1} for n in range(2)])
    answers = await asyncio.gather(
        *(replace_if(collection, {"_id": f"j{n}", REVISION: 1}, {REVISION: 2}) for n in range(2)),
        update_grouped(collection, [({"_id": "j0"}, {"$set": {"a": 1}})]),
        update_grouped(collection, [({"_id": "j1"}, {"$set": {"a": 1}})]),
        return_exceptions=True,
    )
    assert all(isinstance(a, WriteConcernError) for a in answers), answers
    await ours.close()


async def test_the_api_answers_a_save_whose_group_found_the_database_away_with_503(racing, monkeypatch):
    """What a request's grouped write raises when the database is away reaches the API's handler of an unreachable
    database: a 503 with Retry-After (pymongo's wrapper of the connection error was a 500)."""
    ours, _, _ = racing
    monkeypatch.setattr(AsyncMongoClient, "bulk_write", failing_after(0, error=AutoReconnect("connection refused")))
    collection = ours[unique("api").replace("-", "_")].docs
    app, _, _ = await make_app()

    @app.post("/v2/test/grouped-save")  # a save that shares its group with another's, as in a burst
    async def grouped_save() -> None:
        await asyncio.gather(*(replace_if(collection, {"_id": f"j{n}"}, {REVISION: 2}) for n in range(2)))

    async with client(app) as admin:
        response = await admin.post("/v2/test/grouped-save")
    assert (response.status_code, response.headers.get("retry-after")) == (503, "2")
    await ours.close()
