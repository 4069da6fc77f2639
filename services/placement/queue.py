"""Placement's queue storage: one record per job (what it needs, where its current attempt runs), in memory and
persisted with the events each change emits (placement runs as one process: in memory is authoritative)."""

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pymongo.errors import PyMongoError

from shared.clock import utcnow
from shared.events import Assignment
from shared.jobs import CPU_JOB_MEMORY_GB, Algorithm, Resource, Spec
from shared.store import DocumentStore
from shared.stored import readable_algorithm

log = logging.getLogger(__name__)

# How long a deleted job's id is kept (`JobQueue.forget`): far past the bus's ack wait, after which a submission
# whose acknowledgement was lost is delivered again.
TOMBSTONE_S = 86400.0
PURGE_EVERY_S = 3600.0  # how often a running leader purges the ids older than that (each a scan of the records)


class QueueItem(BaseModel):
    """A job as placement keeps it: what it needs and where its current attempt runs."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    job_id: str
    project_id: str
    user_name: str
    algorithm: Algorithm
    spec: Spec
    submitted_at: datetime
    state: Literal["queued", "placed", "held", "done"] = "queued"
    attempt: int = 0
    assignments: tuple[Assignment, ...] = ()
    resource: Resource | None = Field(None, description="What the job needs now (grown after out-of-memory).")
    exclude: tuple[str, ...] = Field((), description="Nodes the next attempt must avoid (it is moving away).")
    exclude_until: datetime | None = Field(None, description="When `exclude` lapses (None: it holds).")
    left: tuple[str, ...] = Field((), description="The nodes its attempt ran on, once its node was lost (held).")
    started_at: datetime | None = Field(None, description="When the job first ran (its clock for slowness).")
    slow_checked: int = Field(0, description="The attempt last found slow (acted on once per attempt).")
    moving: bool = Field(False, description="Asked to move (pull-back); its current attempt is ending.")
    memory_gb: float | None = Field(None, description="Host memory per node its current attempt was given.")
    queued_at: datetime | None = Field(None, description="When placement last queued it again (None: submitted).")
    waited_s: float = Field(0.0, description="Seconds it waited in the queue before its current attempt.")

    def waited_until(self, now: datetime) -> float:
        """Seconds spent waiting in the queue by `now` (placement's clock), this stint and the earlier ones; the
        time an attempt held GPUs is not waiting."""
        since = self.queued_at or self.submitted_at
        return self.waited_s + max(0.0, (now - since).total_seconds())

    @property
    def needs(self) -> Resource:
        return self.resource or self.spec.resource

    @property
    def given_memory_gb(self) -> float:
        """Host memory per node its attempt holds (a record from before placement decided it: what it asked)."""
        return self.memory_gb if self.memory_gb is not None else self.needs.memory_gb or CPU_JOB_MEMORY_GB


@dataclass
class JobQueue:
    store: DocumentStore
    items: dict[str, QueueItem] = field(default_factory=dict)
    queued: set[str] = field(default_factory=set)  # jobs in state "queued" (O(1): is anything waiting?)
    dirty: asyncio.Event = field(default_factory=asyncio.Event)  # a pass is due

    async def load(self, *, now: datetime) -> None:
        await self.purge(now=now)
        async for doc in self.store.collection.find({"state": {"$ne": "done"}}):
            stored = {**doc, "algorithm": readable_algorithm(doc.get("algorithm"))}  # `shared.stored`
            item = self.items[doc["_id"]] = QueueItem.model_validate(stored)
            if item.state == "queued":
                self.queued.add(item.job_id)
        self.dirty.set()

    async def purge(self, *, now: datetime) -> None:
        """Forget the deleted jobs' ids kept longer than `TOMBSTONE_S`, and nothing else."""
        await self.store.collection.delete_many({"deleted_t": {"$lt": now.timestamp() - TOMBSTONE_S}})

    def waiting(self) -> list[QueueItem]:
        """Queued jobs, oldest first."""
        return sorted((self.items[job_id] for job_id in self.queued), key=lambda i: (i.submitted_at, i.job_id))

    def placed(self) -> list[QueueItem]:
        return [i for i in self.items.values() if i.state == "placed"]

    async def save(self, item: QueueItem, events: list) -> None:
        """Persist the item with its events; the outbox relay bumps the revision when it publishes, so a conflict is
        retried over what is stored."""
        await self.store.update(item.job_id, lambda _: (item.model_dump(), events))
        self.items[item.job_id] = item
        if item.state == "queued":
            self.queued.add(item.job_id)
        else:
            self.queued.discard(item.job_id)
        self.dirty.set()

    def keep(self, item: QueueItem) -> None:
        """The item changed in memory only, in what nothing reads after a restart: its next `save` stores it."""
        self.items[item.job_id] = item

    async def add(self, item: QueueItem) -> bool:
        """A new job's item, written only when none is stored (a redelivered submission, even of a job long done,
        changes nothing): one insert, no read."""
        if not await self.store.save(item.job_id, item.model_dump(), None, []):
            return False
        self.items[item.job_id] = item
        self.queued.add(item.job_id)
        self.dirty.set()
        return True

    async def forget(self, job_id: str, *, now: datetime) -> None:
        """A finished job's record goes, but for its id and when (one replace, as the delete was): a submission
        delivered again after the deletion (its acknowledgement died with a bus server) is then refused by the id,
        as one of a job done is, instead of queueing the deleted job again. Kept `TOMBSTONE_S` (purged at `load` and
        every `PURGE_EVERY_S` after: `purge_loop`)."""
        self.items.pop(job_id, None)
        await self.store.collection.replace_one(
            {"_id": job_id, "state": "done"}, {"_id": job_id, "state": "done", "deleted_t": now.timestamp()}
        )


async def purge_loop(queue: JobQueue, *, every_s: float = PURGE_EVERY_S) -> None:
    """A running leader's purge of old deleted-job ids (`load` purges at its start): a leader up for months kept
    every id deleted since."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await queue.purge(now=utcnow())
        except PyMongoError as exc:
            log.warning("purging deleted jobs' ids: %r (again in %.0f s)", exc, every_s)
