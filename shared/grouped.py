"""Writes that need no answer of their own, written with whatever else is being written at that moment.

In a burst the handlers of many jobs write at the same time: each update (or insert) handed here waits for the
group being written (`shared.batch.GroupCommit`) and goes out with the next one, one bulk write per collection
instead of one command each; a lone one is written at once, alone. For writes whose caller needs no count or
document back: outbox pulls, versioned view entries, a job's ETA and status, audit records.
"""

import asyncio
import weakref
from typing import Any

from pymongo import InsertOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from shared.batch import GroupCommit

DUPLICATE_KEY = 11000
Update = tuple[dict[str, Any], dict[str, Any]]  # (filter, update)
Request = InsertOne | UpdateOne
Item = tuple[AsyncCollection, list[Request]]

_GROUPS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit]" = weakref.WeakKeyDictionary()


async def update_grouped(collection: AsyncCollection, updates: list[Update], *, upsert: bool = False) -> None:
    """Write `updates` (each an update_one) in the next group. With `upsert`, a duplicate key is no error: the
    filter refused an entry a newer write made (a versioned entry), whose word stands."""
    await _grouped(collection, [UpdateOne(f, u, upsert=upsert) for f, u in updates])


async def insert_grouped(collection: AsyncCollection, doc: dict[str, Any]) -> None:
    """Insert `doc` in the next group; one already stored under its id is no error (a retried insert whose answer
    was lost: the stored one stands)."""
    await _grouped(collection, [InsertOne(doc)])


async def _grouped(collection: AsyncCollection, requests: list[Request]) -> None:
    loop = asyncio.get_running_loop()
    if loop not in _GROUPS:
        _GROUPS[loop] = GroupCommit(_write_group)
    await _GROUPS[loop]((collection, requests))


def collection_key(collection: AsyncCollection) -> tuple[int, str]:
    """One collection of one client (a process may hold clients of several servers)."""
    return id(collection.database.client), collection.full_name


async def _write_group(items: list[Item]) -> list[Exception | None]:
    """One write per collection, each item answered with its collection's outcome."""
    by_collection: dict[tuple[int, str], tuple[AsyncCollection, list[Request]]] = {}
    for collection, requests in items:
        by_collection.setdefault(collection_key(collection), (collection, []))[1].extend(requests)
    outcome: dict[tuple[int, str], Exception | None] = {}
    for key, (collection, requests) in by_collection.items():
        try:
            await _write(collection, requests)
            outcome[key] = None
        except Exception as exc:
            outcome[key] = exc
    return [outcome[collection_key(c)] for c, _ in items]


async def _write(collection: AsyncCollection, requests: list[Request]) -> None:
    try:
        request = requests[0] if len(requests) == 1 else None
        if isinstance(request, InsertOne):
            await collection.insert_one(request._doc)
        elif isinstance(request, UpdateOne):
            await collection.update_one(request._filter, request._doc, upsert=bool(request._upsert))
        else:
            await collection.bulk_write(requests, ordered=False)
    except DuplicateKeyError:
        pass
    except BulkWriteError as exc:
        if any(error.get("code") != DUPLICATE_KEY for error in exc.details.get("writeErrors", [])):
            raise
