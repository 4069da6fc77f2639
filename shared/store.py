"""MongoDB access and the transactional outbox that makes "persist, then publish" survive a crash in between.

A state change and the events it emits are written in one document update (the events in `_outbox`), then
published and pulled off. A process that dies in between publishes them on restart (`relay`); the event id is
the JetStream message id, so a message relayed twice is stored once.

Portability rule (checked against the embedded nx-27017 server): datetimes are written by insert or replace,
never through `$set` (it stores them as strings there), dicts are never `$push`ed, and fields inside arrays
are queried but never indexed (an index there hides matching documents).
"""
import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient
from pymongo.errors import DuplicateKeyError
from pymongo.asynchronous.collection import AsyncCollection

from shared.bus import TRANSIENT_ERRORS, dedup_id, stream_of
from shared.events import Message

log = logging.getLogger(__name__)

OUTBOX = "_outbox"
OUTBOX_COUNT = "_outbox_n"
REVISION = "rev"


def make_client(url: str) -> AsyncMongoClient:
    """One client per process and event loop, created in the service's lifespan."""
    return AsyncMongoClient(url, tz_aware=True, serverSelectionTimeoutMS=5000, connectTimeoutMS=5000)


def outbox_entries(events: Iterable[Message]) -> list[dict[str, Any]]:
    return [{"event_id": e.event_id, "subject": e.subject, "payload": e.model_dump(mode="json")} for e in events]


def with_outbox(fields: dict[str, Any], current: dict[str, Any] | None, events: Sequence[Message]) -> dict[str, Any]:
    """`$set` fields plus the document's pending events and the new ones, and the next revision."""
    pending = list((current or {}).get(OUTBOX, [])) + outbox_entries(events)
    return {**fields, OUTBOX: pending, OUTBOX_COUNT: len(pending), REVISION: (current or {}).get(REVISION, 0) + 1}


async def flush(
    broker: NatsBroker, collection: AsyncCollection, doc_id: Any, entries: list[dict[str, Any]] | None = None
) -> None:
    """Publish a document's pending events in order, pulling each off once the stream has it."""
    if entries is None:
        entries = ((await collection.find_one({"_id": doc_id})) or {}).get(OUTBOX, [])
    for entry in entries:
        subject = entry["subject"]
        await broker.publish(
            entry["payload"],
            subject,
            stream=stream_of(subject).name,
            headers={"Nats-Msg-Id": dedup_id(broker, subject, entry["event_id"])},
            timeout=10,
        )
        await collection.update_one(
            {"_id": doc_id, f"{OUTBOX}.event_id": entry["event_id"]},
            {"$pull": {OUTBOX: {"event_id": entry["event_id"]}}, "$inc": {OUTBOX_COUNT: -1, REVISION: 1}},
        )


async def relay(broker: NatsBroker, collections: Sequence[AsyncCollection], *, interval_s: float = 2.0) -> None:
    """Forever: publish what a crash left in any outbox."""
    while True:
        for collection in collections:
            try:
                async for doc in collection.find({OUTBOX_COUNT: {"$gt": 0}}, {"_id": 1}):
                    await flush(broker, collection, doc["_id"])
            except TRANSIENT_ERRORS as exc:
                log.warning("outbox relay on %s: %r", collection.name, exc)
        await asyncio.sleep(interval_s)


class DocumentStore:
    """Documents that change by optimistic concurrency (`rev`) and carry the events of each change."""

    def __init__(self, collection: AsyncCollection, broker: NatsBroker) -> None:
        self.collection = collection
        self.broker = broker

    async def load(self, doc_id: Any) -> dict[str, Any] | None:
        return await self.collection.find_one({"_id": doc_id})

    async def save(
        self, doc_id: Any, fields: dict[str, Any], current: dict[str, Any] | None, events: Sequence[Message]
    ) -> bool:
        """Write fields and events if nobody changed the document since `current` was read; then publish."""
        update = with_outbox(fields, current, events)
        if current is None:
            try:
                await self.collection.insert_one({"_id": doc_id, **update})
            except DuplicateKeyError:
                return False
        else:
            result = await self.collection.replace_one({"_id": doc_id, REVISION: current.get(REVISION, 0)}, update)
            if result.matched_count == 0:
                return False
        if update[OUTBOX_COUNT]:
            await flush(self.broker, self.collection, doc_id, update[OUTBOX])
        return True
