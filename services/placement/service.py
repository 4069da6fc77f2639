"""Placement's service layer: the queue and the fleet in memory, persisted, and one scheduling loop."""
import asyncio
import logging
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from shared.clock import utcnow
from shared.events import Assignment, JobPlaced, JobStatusChanged, JobSubmitted, StartTask
from shared.jobs import Algorithm, Phase, Spec
from shared.nodes import NodeInfo
from shared.store import DocumentStore
from services.placement.fit import Candidate, Usage, schedule

log = logging.getLogger(__name__)
MAX_CONFLICTS = 20


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


class FleetNode(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    info: NodeInfo
    state: Literal["ready", "lost"] = "ready"


@dataclass
class Placement:
    jobs: DocumentStore
    nodes: DocumentStore
    queue: dict[str, QueueItem] = field(default_factory=dict)
    fleet: dict[str, FleetNode] = field(default_factory=dict)
    dirty: asyncio.Event = field(default_factory=asyncio.Event)

    async def load(self) -> None:
        async for doc in self.jobs.collection.find({"state": {"$ne": "done"}}):
            self.queue[doc["_id"]] = QueueItem.model_validate(doc)
        async for doc in self.nodes.collection.find({}):
            self.fleet[doc["_id"]] = FleetNode.model_validate(doc)
        self.dirty.set()

    async def submitted(self, event: JobSubmitted) -> None:
        if event.job_id in self.queue or await self.jobs.load(event.job_id):
            return
        item = QueueItem(job_id=event.job_id, project_id=event.project_id, user_name=event.user_name,
                         algorithm=event.algorithm, spec=event.spec, submitted_at=event.create_time)
        await self._save(item, [])

    async def status_changed(self, event: JobStatusChanged) -> None:
        item = self.queue.get(event.job_id)
        if item is None:
            return
        if event.phase.is_finished():
            await self._save(item.model_copy(update={"state": "done"}), [])
        elif event.attempt == item.attempt and item.state in ("placed", "held"):
            if event.phase == Phase.ABNORMAL:
                await self._save(item.model_copy(update={"state": "held", "assignments": ()}), [])
            elif event.phase == Phase.PENDING and not event.node_ids:
                await self._save(item.model_copy(update={"state": "queued", "assignments": ()}), [])

    async def deleted(self, job_id: str) -> None:
        self.queue.pop(job_id, None)
        await self.jobs.collection.delete_one({"_id": job_id, "state": "done"})

    async def node_seen(self, info: NodeInfo | None, node_id: str, state: Literal["ready", "lost"]) -> None:
        current = self.fleet.get(node_id)
        info = info or (current.info if current else None)
        if info is None:
            return
        node = FleetNode(info=info, state=state)
        if node == current:
            return
        await self.nodes.collection.replace_one({"_id": node_id}, {"_id": node_id, **node.model_dump()}, upsert=True)
        self.fleet[node_id] = node
        self.dirty.set()

    def usage(self) -> dict[str, Usage]:
        usage: dict[str, Usage] = {}
        for item in self.queue.values():
            if item.state != "placed":
                continue
            for a in item.assignments:
                used = usage.setdefault(a.node_id, Usage())
                used.gpus.update(a.gpu_indices)
                used.cpu += item.spec.resource.cpu_count
                used.memory_gb += item.spec.resource.memory_gb
        return usage

    async def schedule_once(self) -> int:
        """Place what fits now; return how many jobs were placed."""
        waiting = [Candidate(job_id=i.job_id, resource=i.spec.resource, allowed=i.spec.placement.allowed,
                             priority=i.spec.placement.priority, submitted_at=i.submitted_at.timestamp())
                   for i in self.queue.values() if i.state == "queued"]
        if not waiting:
            return 0
        ready = [n.info for n in self.fleet.values() if n.state == "ready"]
        decisions = schedule(waiting, ready, self.usage())
        for job_id, assignments in decisions:
            await self._place(self.queue[job_id], assignments)
        return len(decisions)

    async def _place(self, item: QueueItem, assignments: tuple[Assignment, ...]) -> None:
        attempt = item.attempt + 1
        now = utcnow()
        master = self.fleet[assignments[0].node_id].info.address
        port = 29500 + zlib.crc32(f"{item.job_id}:{attempt}".encode()) % 2000
        events = [JobPlaced(event_id=f"{item.job_id}:placed:{attempt}", occurred_at=now, job_id=item.job_id,
                            attempt=attempt, assignments=assignments)]
        events += [
            StartTask(event_id=f"{item.job_id}:{attempt}:{a.rank}:start", occurred_at=now, node_id=a.node_id,
                      job_id=item.job_id, attempt=attempt, rank=a.rank, world_size=len(assignments),
                      master_addr=master, master_port=port, gpu_indices=a.gpu_indices, project_id=item.project_id,
                      user_name=item.user_name, algorithm=item.algorithm, spec=item.spec)
            for a in assignments
        ]
        placed = item.model_copy(update={"state": "placed", "attempt": attempt, "assignments": assignments})
        await self._save(placed, events)
        log.info("job %s attempt %d placed on %s", item.job_id, attempt, ", ".join(a.node_id for a in assignments))

    async def _save(self, item: QueueItem, events: list) -> None:
        """Persist the item (in memory it is authoritative: placement runs as one process) with its events."""
        for _ in range(MAX_CONFLICTS):  # the outbox relay bumps the revision when it publishes
            doc = await self.jobs.load(item.job_id)
            if await self.jobs.save(item.job_id, item.model_dump(), doc, events):
                break
        else:
            raise RuntimeError(f"placement record of {item.job_id} keeps changing; is a second placement running?")
        self.queue[item.job_id] = item
        self.dirty.set()


async def scheduling_loop(placement: Placement, *, tick_s: float = 5.0) -> None:
    """Re-run the policy whenever something changed (or every tick, to be safe)."""
    while True:
        try:
            await asyncio.wait_for(placement.dirty.wait(), timeout=tick_s)
        except TimeoutError:
            pass
        placement.dirty.clear()
        await placement.schedule_once()
