"""MongoDB access and the transactional outbox that makes "persist, then publish" survive a crash in between.

A state change and the events it emits are written in one document update (the events in `_outbox`), then
published and pulled off. A process that dies in between publishes them on restart (`relay`); the event id is
the JetStream message id, so a message relayed twice is stored once. A change is made by `DocumentStore.update`:
load, change, save on the revision read, retried when another writer got in between, `ConflictsExhausted` when it
gives up (a lone `save` only where a conflict makes the change moot).

Portability rule (checked against the embedded nx-27017 server): datetimes are written by insert or replace,
never through `$set` (it stores them as strings there), dicts are never `$push`ed, fields inside arrays
are queried but never indexed (an index there hides matching documents), and a projection names whole top-level
fields (it returns `{"status.phase": 1}` as a flat "status.phase" key). Every query but one by `_id` scans the
collection there, indexes or not: what is counted often lives in a small collection of its own.
"""

import asyncio
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import bson
from bson.codec_options import CodecOptions
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError

from shared.bus import TRANSIENT_ERRORS, dedup_id, stream_of
from shared.events import Message
from shared.grouped import collection_key, insert_grouped, replace_if, update_grouped
from shared.lru import Lru

log = logging.getLogger(__name__)

OUTBOX = "_outbox"
OUTBOX_COUNT = "_outbox_n"
REVISION = "rev"
DUPLICATE_KEY = 11000
# Documents a service that is their only writer keeps as last written (`DocumentStore(remember=...)`): a job's
# state in the monitor, placement and the estimator.
REMEMBER_JOBS = 4096
# How long after its publish an event of a job's state is pulled off its outbox (`DocumentStore(defer_pulls_s=...)`,
# where `remember` is): a job's next event mostly comes sooner, and its write drops the published ones for nothing;
# what is left (a job's last event) goes in one bulk write with every other job's of those seconds. At 0.5 s a
# burst of 8-10 jobs a second ended in about one pull write every 4 jobs in each state machine; a crash meanwhile
# leaves them to the relay, published again under the same message id (stored once within `DEDUP_WINDOW_S`).
DEFER_PULLS_S = 2.0
MAX_CONFLICTS = 50  # writers of one document are few (a service and the relay): this many lost races is a fault
# The outbox relay looks through its collections (on the embedded database a scan of every document) at its start,
# then every `RELAY_EVERY_S` while a publish failed in this process since its last look, and otherwise every
# `RELAY_IDLE_S`: what another writer left (an API replica that died; a new leader looks at once as it starts).
# Each look every 2 s whatever happened was most of a resting stack's database commands, and grows with the history.
RELAY_EVERY_S = 2.0
RELAY_IDLE_S = 30.0

Fields = dict[str, Any]
Change = Callable[[dict[str, Any] | None], tuple[Fields, Sequence[Message]] | None]


class ConflictsExhausted(RuntimeError):
    """A document changed under every one of `update`'s attempts: it gave up, nothing was written."""


def make_client(url: str) -> AsyncMongoClient:
    """One client per process and event loop, created in the service's lifespan. Writes wait for a majority of a
    replica set (a write acknowledged by a primary that then fails over is not lost) and are retried once across a
    primary election; on one server (the embedded one) both mean nothing more than an acknowledged write."""
    counts = os.environ.get(COUNTS_DIR)
    listeners = [CommandCounts(Path(counts))] if counts else []
    return AsyncMongoClient(
        url,
        tz_aware=True,
        serverSelectionTimeoutMS=5000,
        connectTimeoutMS=5000,
        w="majority",
        retryWrites=True,
        event_listeners=listeners,
    )


def embedded_socket(data_dir: Path, service: str) -> Path:
    """A service's embedded database's Unix socket, in its 0700 folder of the 0700 data directory (a socket path
    has at most 107 bytes: a deep data directory gets a private directory of its own instead)."""
    data_dir = data_dir.resolve()
    socket_path = data_dir / "db" / service / "mongo.sock"
    if len(str(socket_path)) < 100:
        return socket_path
    digest = hashlib.sha256(bytes(data_dir)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"trainmaster-{os.getuid()}-{digest}" / f"{service}.sock"


def embedded_url(data_dir: Path, service: str) -> str:
    """The URL of the service's embedded database `make run` starts in this data directory."""
    return "mongodb://" + quote_plus(str(embedded_socket(data_dir, service)))


COUNTS_DIR = "TRAINMASTER_DB_COMMAND_COUNTS"  # a folder: each process writes what it sent there (benchmarks)


class CommandCounts(monitoring.CommandListener):
    """Database commands this process sent, by collection and command name, written as `<pid>.json` into a folder
    at most once a second, and a second after the last one counted at the latest (a process at rest sends none that
    would write it): where a workload's database work comes from."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / f"{os.getpid()}.json"
        self.sent: Counter[str] = Counter()
        self.written = 0.0
        self._later: asyncio.TimerHandle | None = None

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        collection = event.command.get(event.command_name)
        self.sent[f"{collection if isinstance(collection, str) else '-'}.{event.command_name}"] += 1
        if time.monotonic() - self.written >= 1.0:
            self.write()
        elif self._later is None:
            try:  # the client's event loop (a client without one writes with its next command)
                self._later = asyncio.get_running_loop().call_later(1.0, self.write)
            except RuntimeError:
                pass

    def write(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
        self.written = time.monotonic()
        try:  # whole or not at all: a benchmark reads it at any moment
            partial = self.path.with_suffix(".json.partial")
            partial.write_text(json.dumps({"argv": sys.argv, "sent": dict(self.sent)}))
            partial.replace(self.path)
        except OSError as exc:
            log.warning("database command counts not written to %s: %r", self.path, exc)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def outbox_entries(events: Iterable[Message]) -> list[dict[str, Any]]:
    return [{"event_id": e.event_id, "subject": e.subject, "payload": e.model_dump(mode="json")} for e in events]


def with_outbox(fields: dict[str, Any], current: dict[str, Any] | None, events: Sequence[Message]) -> dict[str, Any]:
    """`$set` fields plus the document's pending events and the new ones, and the next revision."""
    pending = list((current or {}).get(OUTBOX, [])) + outbox_entries(events)
    return {**fields, OUTBOX: pending, OUTBOX_COUNT: len(pending), REVISION: (current or {}).get(REVISION, 0) + 1}


def unchanged(current: dict[str, Any]) -> dict[str, Any]:
    """The filter that matches the document only as `current` was read (one written before revisions has none)."""
    return {REVISION: current[REVISION]} if REVISION in current else {REVISION: {"$exists": False}}


async def flush(
    broker: NatsBroker,
    collection: AsyncCollection,
    doc_id: Any,
    entries: list[dict[str, Any]] | None = None,
    *,
    deferred: "DeferredPulls | None" = None,
) -> None:
    """Publish a document's pending events in order, pulling each off once the stream has it (`deferred`: a
    moment later, or with the document's next write)."""
    if entries is None:
        entries = ((await collection.find_one({"_id": doc_id})) or {}).get(OUTBOX, [])
    published, error = [], None
    for entry in entries:
        try:
            await _publish(broker, entry)
        except Exception as exc:  # what follows waits for the relay, in order; what went out is pulled off
            error = exc
            break
        except BaseException:  # cancelled: the relay looks again soon
            left_behind(collection)
            raise
        published.append(entry["event_id"])
    if error is not None:  # before anything else can fail: the relay looks again soon
        left_behind(collection)
    if published and deferred is not None:
        deferred.add(doc_id, published)
    elif published:
        await _pulls(collection, [pull_entry(doc_id, event_id) for event_id in published])
    if error is not None:
        raise error


# The collections where a publish failed in this process since the relay last looked through them.
_LEFT_BEHIND: set[Any] = set()


def _relay_key(collection: AsyncCollection) -> Any:
    try:
        return collection_key(collection)
    except AttributeError:  # a test's in-memory collection without a client
        return id(collection)


def without_documents(exc: BulkWriteError) -> BulkWriteError:
    """The same refusal without the refused documents (its text, built when it is made, would carry each into the
    logs: a job's sealed secrets, its spec)."""
    details = {
        **exc.details,
        "writeErrors": [{k: v for k, v in e.items() if k != "op"} for e in exc.details.get("writeErrors", [])],
    }
    return BulkWriteError(details)


def left_behind(collection: AsyncCollection) -> None:
    """Events of the collection could not be published here: the relay's next look comes at its short interval."""
    _LEFT_BEHIND.add(_relay_key(collection))


class DeferredPulls:
    """Published events of one collection's documents, taken off their outboxes later: all that were published
    within `delay_s` in one bulk write, unless the document's next write in this process drops them first (folded
    into it: no command of their own). Until then they sit in the outbox, published; a crash leaves them for the
    relay, which publishes them again under the same message id (the stream stores one) and pulls them off."""

    def __init__(
        self, collection: AsyncCollection, *, delay_s: float, pulled: Callable[[Any, set[str]], None] | None = None
    ) -> None:
        self.collection, self.delay_s, self.pulled = collection, delay_s, pulled
        self.waiting: dict[Any, set[str]] = {}  # doc id -> events published, still in its outbox
        self._timer: asyncio.Task | None = None
        _DEFERRED[collection_key(collection)] = self

    def add(self, doc_id: Any, event_ids: Iterable[str]) -> None:
        self.waiting.setdefault(doc_id, set()).update(event_ids)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._later())

    def published(self, doc_id: Any) -> set[str]:
        """The document's events published and not yet pulled off (a write may drop them from the outbox)."""
        return set(self.waiting.get(doc_id, ()))

    def dropped(self, doc_id: Any, event_ids: set[str]) -> None:
        """A write took these off the document's outbox: nothing left to pull for them."""
        left = self.waiting.get(doc_id, set()) - event_ids
        if left:
            self.waiting[doc_id] = left
        else:
            self.waiting.pop(doc_id, None)

    async def _later(self) -> None:
        await asyncio.sleep(self.delay_s)
        self._timer = None
        await self._pull_waiting()

    async def pull_now(self) -> None:
        """What waits, pulled off now (a graceful stop: the next start's relay would publish it again)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._pull_waiting()

    async def _pull_waiting(self) -> None:
        batch, self.waiting = self.waiting, {}
        if not batch:
            return
        try:
            await _pulls(
                self.collection,
                [pull_entry(doc_id, event_id) for doc_id, ids in batch.items() for event_id in sorted(ids)],
            )
        except Exception as exc:  # left in the outboxes: the relay publishes them again (stored once) and pulls
            log.warning("published events not pulled off %s: %r", self.collection.name, exc)
            return
        if self.pulled is not None:
            for doc_id, ids in batch.items():
                self.pulled(doc_id, ids)


_DEFERRED: "weakref.WeakValueDictionary[tuple[int, str], DeferredPulls]" = weakref.WeakValueDictionary()


def _deferred_of(collection: AsyncCollection) -> "DeferredPulls | None":
    try:
        return _DEFERRED.get(collection_key(collection))
    except AttributeError:  # a test's in-memory collection without a client
        return None


Pull = tuple[dict[str, Any], dict[str, Any]]  # (filter, update) of `pull_entry`


async def _pulls(collection: AsyncCollection, pulls: list[Pull]) -> None:
    """Pulls of published events, grouped (`shared.grouped`): in a burst the handlers of many jobs that published
    at the same time take their events off in one bulk write per collection; a lone pull is one update."""
    await update_grouped(collection, pulls)


async def _publish(broker: NatsBroker, entry: dict[str, Any]) -> None:
    subject = entry["subject"]
    await broker.publish(
        entry["payload"],
        subject,
        stream=stream_of(subject).name,
        headers={"Nats-Msg-Id": dedup_id(broker, subject, entry["event_id"])},
        timeout=10,
    )


def pull_entry(doc_id: Any, event_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (filter, update) that takes a published event off its document's outbox."""
    return (
        {"_id": doc_id, f"{OUTBOX}.event_id": event_id},
        {"$pull": {OUTBOX: {"event_id": event_id}}, "$inc": {OUTBOX_COUNT: -1, REVISION: 1}},
    )


async def flush_many(
    broker: NatsBroker,
    collection: AsyncCollection,
    items: Sequence[tuple[Any, list[dict[str, Any]]]],
    *,
    deferred: "DeferredPulls | None" = None,
) -> list[Exception | None]:
    """`flush` for many documents at once: each document's events published in order (the documents side by
    side), then every published event pulled off in one bulk write (`deferred`: a moment later, with others).
    Answers per document: None, or the error that stopped its publishing (what was not published stays in its
    outbox, for the relay)."""

    async def publish_all(doc_id: Any, entries: list[dict[str, Any]]) -> tuple[list[Pull], Exception | None]:
        pulls: list[Pull] = []
        for entry in entries:
            try:
                await _publish(broker, entry)
            except Exception as exc:  # the rest of this document's events wait for the relay, in order
                return pulls, exc
            pulls.append(pull_entry(doc_id, entry["event_id"]))
        return pulls, None

    outcomes = await asyncio.gather(*(publish_all(doc_id, entries) for doc_id, entries in items))
    if any(error is not None for _, error in outcomes):
        left_behind(collection)
    pulls = [pull for done, _ in outcomes for pull in done]
    if pulls and deferred is not None:
        for (doc_id, _), (done, _) in zip(items, outcomes):
            if done:
                deferred.add(doc_id, [pull[0][f"{OUTBOX}.event_id"] for pull in done])
    elif pulls:
        await _pulls(collection, pulls)
    return [error for _, error in outcomes]


async def relay(
    broker: NatsBroker,
    collections: Sequence[AsyncCollection],
    *,
    interval_s: float = RELAY_EVERY_S,
    idle_s: float = RELAY_IDLE_S,
) -> None:
    """Forever: publish what a crash or a failed publish left in any outbox. Each collection is looked through at
    once, then after `interval_s` where a publish failed here since (`left_behind`), else after `idle_s`."""
    looked: dict[Any, float] = {}  # collection -> when it was last looked through
    while True:
        for collection in collections:
            key, now = _relay_key(collection), time.monotonic()
            if key in looked and key not in _LEFT_BEHIND and now - looked[key] < idle_s:
                continue
            _LEFT_BEHIND.discard(key)  # a publish that fails from now on calls for the next look
            looked[key] = now
            try:
                deferred = _deferred_of(collection)
                async for doc in collection.find({OUTBOX_COUNT: {"$gt": 0}}, {"_id": 1, OUTBOX: 1}):
                    entries = doc.get(OUTBOX) or []
                    if deferred is not None and {e["event_id"] for e in entries} <= deferred.published(doc["_id"]):
                        continue  # published just now, pulled off in a moment
                    await flush(broker, collection, doc["_id"], entries)
            except TRANSIENT_ERRORS as exc:
                log.warning("outbox relay on %s: %r", collection.name, exc)
                left_behind(collection)  # looked again at the short interval
        await asyncio.sleep(interval_s)


class DocumentStore:
    """Documents that change by optimistic concurrency (`rev`) and carry the events of each change.

    remember: how many documents this process keeps as it last wrote them (0: none), so that the next change of
    one starts from memory instead of a read. Only for a collection whose every writer goes through a store or
    the outbox relay (a write that bypasses the revision would be undone by a change made from memory); a
    remembered copy that is stale costs one failed conditional write, then a read, as any lost race.

    defer_pulls_s: published events are pulled off this long after (`DeferredPulls`: one bulk write for all the
    collection's, or none where the document's next write drops them); 0: at once, after each publish. Only with
    the same writers as `remember` (a write that keeps an outbox it read from another process would keep them).
    """

    def __init__(
        self, collection: AsyncCollection, broker: NatsBroker, *, remember: int = 0, defer_pulls_s: float = 0.0
    ) -> None:
        self.collection = collection
        self.broker = broker
        self._remembered: Lru[Any, bytes] = Lru(remember)  # doc id -> the stored document, as BSON
        self._deferred = (
            DeferredPulls(collection, delay_s=defer_pulls_s, pulled=self._pulled) if defer_pulls_s > 0 else None
        )

    async def load(self, doc_id: Any) -> dict[str, Any] | None:
        return await self.collection.find_one({"_id": doc_id})

    async def current(self, doc_id: Any) -> dict[str, Any] | None:
        """The document as this process last wrote it where it remembers it (no read), else as stored."""
        remembered = self._recall(doc_id)
        return remembered if remembered is not None else await self.load(doc_id)

    def remembered(self, doc_id: Any) -> dict[str, Any] | None:
        """The document as this process last wrote it, where it remembers it (no read); else None."""
        return self._recall(doc_id)

    async def delete(self, doc_id: Any) -> None:
        """The document goes, its remembered copy with it (and the events still in its outbox)."""
        self._remembered.pop(doc_id)
        await self.collection.delete_one({"_id": doc_id})

    async def update(self, doc_id: Any, change: Change, *, attempts: int = MAX_CONFLICTS, new: bool = False) -> bool:
        """Load (or recall), change, save until no one wrote in between; `change` returns None when there is
        nothing to write. Returns whether it wrote; raises ConflictsExhausted after `attempts` lost races.
        `new`: the document is most likely not stored yet (a job's first event), so the first try inserts what
        `change(None)` gives without reading; a stored one refuses the insert and the next try reads it."""
        for attempt in range(attempts):
            guessed = new and attempt == 0
            if guessed:
                current = None
            else:  # a lost race reads what the other writer stored
                current = await (self.current(doc_id) if attempt == 0 else self.load(doc_id))
            outcome = change(current)
            if outcome is None and guessed:
                continue  # nothing to make of nothing: what is stored decides
            if outcome is None:
                return False
            fields, events = outcome
            if await self.save(doc_id, fields, current, events):
                return True
        raise ConflictsExhausted(
            f"{self.collection.name} {doc_id!r}: changed by another writer {attempts} times in a row"
        )

    async def save(
        self, doc_id: Any, fields: Fields, current: dict[str, Any] | None, events: Sequence[Message]
    ) -> bool:
        """Write fields and events if nobody changed the document since `current` was read; then publish."""
        self._remembered.pop(doc_id)
        try:
            update = await self._write(doc_id, fields, current, events)
        except BaseException:  # it may have landed with its answer lost: the relay looks again soon, not in 30 s
            left_behind(self.collection)
            raise
        if update is None:
            return False
        pending = update[OUTBOX]
        if pending:
            await self.flush(doc_id, pending)
        if self._remembered.size and self._deferred is not None:  # as stored: its events pulled off later
            self._keep(doc_id, {"_id": doc_id, **update})
        elif self._remembered.size:  # as stored once every event is pulled off: each took one off, added a revision
            self._keep(
                doc_id,
                {"_id": doc_id, **update, OUTBOX: [], OUTBOX_COUNT: 0, REVISION: update[REVISION] + len(pending)},
            )
        return True

    def _pulled(self, doc_id: Any, event_ids: set[str]) -> None:
        """Deferred pulls written: the remembered copy as they left it (each took one event off, added a revision);
        forgotten when they did not all find their event (a write dropped it first)."""
        doc = self._recall(doc_id)
        if doc is None:
            return
        outbox = doc.get(OUTBOX, [])
        if not event_ids <= {e["event_id"] for e in outbox}:
            self._remembered.pop(doc_id)
            return
        kept = [e for e in outbox if e["event_id"] not in event_ids]
        self._keep(doc_id, {**doc, OUTBOX: kept, OUTBOX_COUNT: len(kept), REVISION: doc[REVISION] + len(event_ids)})

    def _keep(self, doc_id: Any, doc: dict[str, Any]) -> None:
        self._remembered.put(doc_id, bson.encode(doc, codec_options=self._codec()))

    def _recall(self, doc_id: Any) -> dict[str, Any] | None:
        """The document as this process last stored it (decoded as a read would: lists, aware datetimes)."""
        raw = self._remembered.get(doc_id)
        return None if raw is None else bson.decode(raw, codec_options=self._codec())

    def _codec(self) -> CodecOptions:
        return getattr(self.collection, "codec_options", None) or CodecOptions(tz_aware=True)

    async def write(
        self, doc_id: Any, fields: Fields, current: dict[str, Any] | None, events: Sequence[Message]
    ) -> list[dict[str, Any]] | None:
        """Write fields and events (a new document when `current` is None) without publishing; returns the
        pending outbox entries, or None when the document changed since `current` was read (or already exists)."""
        update = await self._write(doc_id, fields, current, events)
        return None if update is None else update[OUTBOX]

    async def _write(
        self, doc_id: Any, fields: Fields, current: dict[str, Any] | None, events: Sequence[Message]
    ) -> dict[str, Any] | None:
        """`write`, answering the whole document as stored (None: not written). Events already published and
        waiting for their deferred pull are dropped from the outbox here (folded into this write)."""
        deferred = self._deferred if current is not None else None
        published = deferred.published(doc_id) if deferred is not None else set()
        kept = (
            current
            if current is None or not published
            else {**current, OUTBOX: [e for e in current.get(OUTBOX, []) if e["event_id"] not in published]}
        )
        update = with_outbox({k: v for k, v in fields.items() if k != "_id"}, kept, events)
        if current is None:
            if not await insert_grouped(self.collection, {"_id": doc_id, **update}):
                return None  # stored already
        else:
            if not await replace_if(self.collection, {"_id": doc_id, **unchanged(current)}, update):
                return None
        if deferred is not None and published:
            deferred.dropped(doc_id, published)
        return update

    async def insert_many(
        self, items: Sequence[tuple[Any, Fields, Sequence[Message]]]
    ) -> list[list[dict[str, Any]] | None]:
        """`write` of many new documents in one command: per item its pending outbox entries, or None where a
        unique index refused it (the others are written all the same)."""
        updates = [
            with_outbox({k: v for k, v in fields.items() if k != "_id"}, None, events) for _, fields, events in items
        ]
        refused: set[int] = set()
        try:
            await self.collection.insert_many(
                [{"_id": doc_id, **update} for (doc_id, _, _), update in zip(items, updates)], ordered=False
            )
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(error.get("code") != DUPLICATE_KEY for error in errors):
                left_behind(self.collection)
                raise without_documents(exc) from None
            refused = {error["index"] for error in errors}
        except BaseException:  # it may have landed with its answer lost: the relay looks again soon, not in 30 s
            left_behind(self.collection)
            raise
        return [None if i in refused else update[OUTBOX] for i, update in enumerate(updates)]

    async def flush(self, doc_id: Any, entries: list[dict[str, Any]] | None = None) -> None:
        """Publish the document's pending events (those given, or those stored) and pull them off."""
        await flush(self.broker, self.collection, doc_id, entries, deferred=self._deferred)

    async def flush_many(self, items: Sequence[tuple[Any, list[dict[str, Any]]]]) -> list[Exception | None]:
        return await flush_many(self.broker, self.collection, items, deferred=self._deferred)

    async def pull_now(self) -> None:
        """The published events waiting for their deferred pull, pulled off now (at a graceful stop)."""
        if self._deferred is not None:
            await self._deferred.pull_now()
