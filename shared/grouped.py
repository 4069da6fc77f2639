"""Writes that need no document or count back, written with whatever else is being written at that moment.

In a burst the handlers of many jobs write at the same time: each update (or insert) handed here waits for the
group being written (`shared.batch.GroupCommit`) and goes out with the next one, one bulk write per collection
instead of one command each; a lone one is written at once, alone. For outbox pulls, versioned view entries, a
job's ETA and status, audit records, and inserts whose caller only needs to know whether a unique index refused them
(a document's first state, a billing line). Each item is answered on its own: whether a unique index refused it or,
for a conditional replacement, whether its filter found the document (as the server answered that replacement), or
the error its own request met; another item's error is not its own.
"""

import asyncio
import weakref
from collections.abc import Awaitable
from typing import Any

from pymongo import InsertOne, ReplaceOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import (
    BulkWriteError,
    ClientBulkWriteException,
    DuplicateKeyError,
    InvalidOperation,
    OperationFailure,
    WriteConcernError,
    WriteError,
)

from shared.batch import GroupCommit

DUPLICATE_KEY = 11000
# The server refuses the `bulkWrite` command itself, having applied nothing: not authorized (13), unknown there (59),
# or not supported (115: a server whose feature compatibility version is still below 8.0, say after an upgrade).
NO_BULK_WRITE = {13, 59, 115}
Update = tuple[dict[str, Any], dict[str, Any]]  # (filter, update)
Request = InsertOne | ReplaceOne | UpdateOne
Item = tuple[AsyncCollection, list[Request]]

# The groups of each event loop, by how long a group's first write waits for others (`window_s`).
_GROUPS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, GroupCommit]]" = weakref.WeakKeyDictionary()


async def update_grouped(
    collection: AsyncCollection, updates: list[Update], *, upsert: bool = False, window_s: float = 0.0
) -> bool:
    """Write `updates` (each an update_one) in the next group. With `upsert`, a duplicate key is no error: the
    filter refused an entry a newer write made (a versioned entry), whose word stands; True where that happened.
    `window_s`: a write that finds no group waiting waits this long for others (written with those of its window
    only; 0: at once, with whatever else is written then)."""
    return await _grouped(collection, [UpdateOne(f, u, upsert=upsert) for f, u in updates], window_s=window_s)


async def replace_grouped(
    collection: AsyncCollection, query: dict[str, Any], doc: dict[str, Any], *, window_s: float = 0.0
) -> None:
    """Replace the document `query` finds (none: nothing) in the next group (`window_s`: as `update_grouped`)."""
    await _grouped(collection, [ReplaceOne(query, doc)], window_s=window_s)


async def insert_grouped(collection: AsyncCollection, doc: dict[str, Any], *, window_s: float = 0.0) -> bool:
    """Insert `doc` in the next group; False where a unique index refused it (one stored under its id, say: a
    redelivery, or a retried insert whose answer was lost), whatever else its group held (`window_s`: as
    `update_grouped`)."""
    return not await _grouped(collection, [InsertOne(doc)], window_s=window_s)


class Conditional(ReplaceOne):
    """A replacement whose caller learns whether its filter found the document (`replace_if`)."""

    def __init__(self, query: dict[str, Any], doc: dict[str, Any]) -> None:
        super().__init__(query, doc)
        self.query, self.doc = query, doc


async def replace_if(collection: AsyncCollection, query: dict[str, Any], doc: dict[str, Any]) -> bool:
    """Replace the document `query` finds, in the next group (the group's conditional replacements of a collection
    in one command of their own, which answers each on its own); whether it found it."""
    return not await _grouped(collection, [Conditional(query, doc)])


async def _grouped(collection: AsyncCollection, requests: list[Request], *, window_s: float = 0.0) -> bool:
    """Whether a unique index refused any of `requests`."""
    groups = _GROUPS.setdefault(asyncio.get_running_loop(), {})
    if window_s not in groups:
        groups[window_s] = GroupCommit(_write_group, window_s=window_s)
    return await groups[window_s]((collection, requests))


def collection_key(collection: AsyncCollection) -> tuple[int, str]:
    """One collection of one client (a process may hold clients of several servers)."""
    return id(collection.database.client), collection.full_name


Outcome = bool | Exception  # a request's own answer: refused or not matched (True), written (False), its error


async def _write_group(items: list[Item]) -> list[Outcome]:
    """One write per collection (and one for its conditional replacements); each item answered with whether a
    unique index refused (or a filter missed) any of its requests, or the error one of its own requests met."""
    by_collection: dict[tuple[int, str], tuple[AsyncCollection, list[Request], list[tuple[int, range]]]] = {}
    for n, (collection, requests) in enumerate(items):
        _, pending, spans = by_collection.setdefault(collection_key(collection), (collection, [], []))
        spans.append((n, range(len(pending), len(pending) + len(requests))))
        pending.extend(requests)
    answers: list[Outcome] = [False] * len(items)
    # The collections' writes sent side by side: the group waits for the slowest, not for their sum (a write
    # queued behind this group waited for every collection's round trip in turn).
    written = await asyncio.gather(
        *(_outcomes(collection, requests) for collection, requests, _ in by_collection.values())
    )
    for (_, _, spans), outcomes in zip(by_collection.values(), written):
        for n, span in spans:
            own = [outcomes[i] for i in span]
            error = next((o for o in own if isinstance(o, Exception)), None)
            answers[n] = error if error is not None else any(own)
    return answers


async def _outcomes(collection: AsyncCollection, requests: list[Request]) -> list[Outcome]:
    """Each request's own outcome: the conditional replacements in a command of their own, so that neither
    command's failure is taken for the other's."""
    outcomes: list[Outcome] = [False] * len(requests)
    conditional = [i for i, r in enumerate(requests) if isinstance(r, Conditional)]
    others = [i for i, r in enumerate(requests) if not isinstance(r, Conditional)]
    for indexes, write in ((others, _write), (conditional, _replace_each)):
        if not indexes:
            continue
        try:
            answered = await write(collection, [requests[i] for i in indexes])
        except Exception as exc:  # the command failed as a whole (the database away, say): so did each of its own
            answered = [exc] * len(indexes)
        for i, outcome in zip(indexes, answered):
            outcomes[i] = outcome
    return outcomes


async def _replace_each(collection: AsyncCollection, requests: list[Request]) -> list[Outcome]:
    """The conditional replacements in one command that answers each (MongoDB 8.0's `bulkWrite`; a server before
    it, or a user not allowed it: one command each, all at once); True where the filter found nothing. Whether one
    matched is learned from its own result, never from the document afterwards, which another writer may have
    replaced since."""
    replacements = [r for r in requests if isinstance(r, Conditional)]
    client = collection.database.client
    if len(replacements) == 1 or _refuses(client):
        return await _each(collection, replacements)
    ops = [ReplaceOne(r.query, r.doc, namespace=collection.full_name) for r in replacements]
    try:
        result = await client.bulk_write(ops, ordered=False, verbose_results=True)
    except InvalidOperation:  # no `bulkWrite` command on this server (before MongoDB 8.0): nothing was sent
        _remember_refusal(client)
        return await _each(collection, replacements)
    except ClientBulkWriteException as exc:
        error = _top_level(exc.error)
        if isinstance(error, OperationFailure) and error.code in NO_BULK_WRITE and not exc.details.get("anySuccessful"):
            _remember_refusal(client)
            return await _each(collection, replacements)
        return _answered(exc, error, len(ops))
    updates = result.update_results
    return [not updates[i].matched_count if i in updates else _unanswered(i) for i in range(len(ops))]


def _answered(exc: ClientBulkWriteException, error: Exception | None, count: int) -> list[Outcome]:
    """Each of `count` requests as a `bulkWrite` that raised answered it: its own result or write error; `error`
    (the command's own: the database away, say) for those the server did not answer, raised where it answered
    none. A write concern error is raised, as a single write raises it: what it applied may not last."""
    partial = exc.partial_result
    updates = partial.update_results if partial is not None else {}
    errors = {e["idx"]: _error(e) for e in exc.details.get("writeErrors", [])}
    if error is not None and not updates and not errors:
        raise error from exc
    if concern := exc.details.get("writeConcernErrors"):
        raise _write_concern_error(concern[0]) from exc
    return [
        errors[i] if i in errors else not updates[i].matched_count if i in updates else error or _unanswered(i)
        for i in range(count)
    ]


def _top_level(error: Any) -> Exception | None:
    """A `bulkWrite`'s own error as pymongo hands it (an exception, or the server's reply where the command failed
    after it was sent), as an exception."""
    if error is None or isinstance(error, Exception):
        return error
    return OperationFailure(str(error.get("errmsg", "bulkWrite failed")), error.get("code"), error)


def _write_concern_error(detail: dict[str, Any]) -> WriteConcernError:
    return WriteConcernError(str(detail.get("errmsg", "write concern error")), detail.get("code"), detail)


# The clients whose server refused the `bulkWrite` command (by id: clients of one server compare equal), asked no
# more: each group would send one that fails before its replacements. A restart asks again (after an upgrade, say).
_REFUSING: dict[int, "weakref.ref[Any]"] = {}


def _refuses(client: Any) -> bool:
    known = _REFUSING.get(id(client))
    return known is not None and known() is client


def _remember_refusal(client: Any) -> None:
    key = id(client)
    _REFUSING[key] = weakref.ref(client, lambda _: _REFUSING.pop(key, None))


async def _each(collection: AsyncCollection, replacements: list[Conditional]) -> list[Outcome]:
    """One command each, all sent at once (the group waits for the slowest, not for their sum)."""
    return list(await asyncio.gather(*(_own_outcome(_replace_one(collection, r)) for r in replacements)))


async def _replace_one(collection: AsyncCollection, request: Conditional) -> bool:
    return not (await collection.replace_one(request.query, request.doc)).matched_count


async def _own_outcome(write: Awaitable[bool]) -> Outcome:
    try:
        return await write
    except Exception as exc:
        return exc


def _error(detail: dict[str, Any]) -> WriteError:
    """One request's write error, as a single write would have raised it."""
    kind = DuplicateKeyError if detail.get("code") == DUPLICATE_KEY else WriteError
    return kind(detail.get("errmsg", "write error"), detail.get("code"), detail)


def _unanswered(index: int) -> OperationFailure:
    return OperationFailure(f"the server answered nothing for the group's request {index}")


async def _write(collection: AsyncCollection, requests: list[Request]) -> list[Outcome]:
    """The requests written, in one command; for each, whether a unique index refused it, or its own error."""
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
        return [True]
    except BulkWriteError as exc:
        if exc.details.get("writeConcernErrors"):  # as a single write raises it: what it applied may not last
            raise _write_concern_error(exc.details["writeConcernErrors"][0]) from exc
        errors = {e["index"]: e for e in exc.details.get("writeErrors", [])}
        return [
            (errors[i].get("code") == DUPLICATE_KEY or _error(errors[i])) if i in errors else False
            for i in range(len(requests))
        ]
    return [False] * len(requests)
