"""Writes that need no document or count back, written with whatever else is being written at that moment.

In a burst the handlers of many jobs write at the same time: each update (or insert) handed here waits for the
group being written (`shared.batch.GroupCommit`) and goes out with the next one, one bulk write per collection
instead of one command each; a lone one is written at once, alone. For outbox pulls, versioned view entries, a
job's ETA and status, audit records, and inserts whose caller only needs to know whether a unique index refused them
(a document's first state, a billing line).
"""

import asyncio
import weakref
from typing import Any

from pymongo import InsertOne, ReplaceOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from shared.batch import GroupCommit

DUPLICATE_KEY = 11000
Update = tuple[dict[str, Any], dict[str, Any]]  # (filter, update)
Request = InsertOne | ReplaceOne | UpdateOne
Item = tuple[AsyncCollection, list[Request]]

_GROUPS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit]" = weakref.WeakKeyDictionary()


async def update_grouped(collection: AsyncCollection, updates: list[Update], *, upsert: bool = False) -> bool:
    """Write `updates` (each an update_one) in the next group. With `upsert`, a duplicate key is no error: the
    filter refused an entry a newer write made (a versioned entry), whose word stands; True where that happened."""
    return await _grouped(collection, [UpdateOne(f, u, upsert=upsert) for f, u in updates])


async def replace_grouped(collection: AsyncCollection, query: dict[str, Any], doc: dict[str, Any]) -> None:
    """Replace the document `query` finds (none: nothing) in the next group."""
    await _grouped(collection, [ReplaceOne(query, doc)])


async def insert_grouped(collection: AsyncCollection, doc: dict[str, Any]) -> bool:
    """Insert `doc` in the next group; False where a unique index refused it (one stored under its id, say: a
    redelivery, or a retried insert whose answer was lost), whatever else its group held."""
    return not await _grouped(collection, [InsertOne(doc)])


WRITE = "_w"  # a conditional replacement's own mark: which of a group's replacements matched, where not all did


class Conditional(ReplaceOne):
    """A replacement whose caller learns whether its filter found the document (`replace_if`)."""

    def __init__(self, query: dict[str, Any], doc: dict[str, Any]) -> None:
        super().__init__(query, doc)
        self.query, self.doc = query, doc


async def replace_if(collection: AsyncCollection, query: dict[str, Any], doc: dict[str, Any]) -> bool:
    """Replace the document `query` finds, in the next group (the group's conditional replacements of a collection
    in one command of their own); whether it found it. `doc` carries a mark of its own under `WRITE` (a fresh one
    each write): where a group's did not all match, each is read back to learn whose did."""
    return not await _grouped(collection, [Conditional(query, doc)])


async def _grouped(collection: AsyncCollection, requests: list[Request]) -> bool:
    """Whether a unique index refused any of `requests`."""
    loop = asyncio.get_running_loop()
    if loop not in _GROUPS:
        _GROUPS[loop] = GroupCommit(_write_group)
    return await _GROUPS[loop]((collection, requests))


def collection_key(collection: AsyncCollection) -> tuple[int, str]:
    """One collection of one client (a process may hold clients of several servers)."""
    return id(collection.database.client), collection.full_name


async def _write_group(items: list[Item]) -> list[bool | Exception]:
    """One write per collection; each item answered with whether a unique index refused any of its requests, or
    the exception its collection's write raised."""
    by_collection: dict[tuple[int, str], tuple[AsyncCollection, list[Request], list[tuple[int, range]]]] = {}
    for n, (collection, requests) in enumerate(items):
        _, pending, spans = by_collection.setdefault(collection_key(collection), (collection, [], []))
        spans.append((n, range(len(pending), len(pending) + len(requests))))
        pending.extend(requests)
    answers: list[bool | Exception] = [False] * len(items)
    for collection, requests, spans in by_collection.values():
        try:
            refused = await _write_answered(collection, requests)
        except Exception as exc:
            for n, _ in spans:
                answers[n] = exc
            continue
        for n, span in spans:
            answers[n] = any(i in refused for i in span)
    return answers


async def _write_answered(collection: AsyncCollection, requests: list[Request]) -> set[int]:
    """`_write`, the conditional replacements apart: the indexes of the requests refused (a unique index) or not
    matched (a conditional replacement whose document was not as its filter said)."""
    conditional = [i for i, r in enumerate(requests) if isinstance(r, Conditional)]
    if not conditional:
        return await _write(collection, requests)
    others = [i for i, r in enumerate(requests) if not isinstance(r, Conditional)]
    refused = {others[i] for i in await _write(collection, [requests[i] for i in others])} if others else set()
    replacements = [r for r in requests if isinstance(r, Conditional)]
    if len(replacements) == 1:
        [only] = replacements
        matched = (await collection.replace_one(only.query, only.doc)).matched_count
        return refused | (set() if matched else {conditional[0]})
    if (await collection.bulk_write(replacements, ordered=False)).matched_count == len(replacements):
        return refused
    for i, request in zip(conditional, replacements):  # some did not match: whose did, each read by its id
        stored = await collection.find_one({"_id": request.query["_id"]}, {WRITE: 1})
        if stored is None or stored.get(WRITE) != request.doc.get(WRITE):
            refused.add(i)
    return refused


async def _write(collection: AsyncCollection, requests: list[Request]) -> set[int]:
    """The requests written, in one command; the indexes of those a unique index refused."""
    try:
        request = requests[0] if len(requests) == 1 else None
        if isinstance(request, InsertOne):
            await collection.insert_one(request._doc)
        elif isinstance(request, ReplaceOne):
            await collection.replace_one(request._filter, request._doc, upsert=bool(request._upsert))
        elif isinstance(request, UpdateOne):
            await collection.update_one(request._filter, request._doc, upsert=bool(request._upsert))
        else:
            await collection.bulk_write(requests, ordered=False)
    except DuplicateKeyError:
        return {0}
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if any(error.get("code") != DUPLICATE_KEY for error in errors):
            raise
        return {error["index"] for error in errors}
    return set()
