"""Placement's service layer: the queue and the fleet in memory, persisted, and one scheduling loop."""
import asyncio
import logging
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.clock import utcnow
from shared.events import (
    Assignment,
    EtaEstimated,
    JobMigrateRequested,
    JobPlaced,
    JobStatusChanged,
    JobSubmitted,
    JobUnplaceable,
    Notification,
    StartTask,
)
from shared.jobs import Algorithm, Phase, Resource, Spec
from shared.nodes import NodeInfo
from shared.store import DocumentStore
from services.placement.fit import Candidate, Usage, could_ever_fit, fits, largest, schedule

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
    resource: Resource | None = Field(None, description="What the job needs now (grown after out-of-memory).")
    exclude: tuple[str, ...] = Field((), description="Nodes the next attempt must avoid (it is moving away).")
    started_at: datetime | None = Field(None, description="When the job first ran (its clock for slowness).")
    slow_checked: int = Field(0, description="The attempt last found slow (acted on once per attempt).")

    @property
    def needs(self) -> Resource:
        return self.resource or self.spec.resource


class FleetNode(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    info: NodeInfo
    state: Literal["ready", "lost"] = "ready"


@dataclass
class Placement:
    jobs: DocumentStore
    nodes: DocumentStore
    slow_factor: float = 1.5
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
        elif event.phase == Phase.RUNNING and event.start_time and item.started_at is None:
            await self._save(item.model_copy(update={"started_at": event.start_time}), [])
        elif event.attempt == item.attempt and item.state in ("placed", "held"):
            if event.phase == Phase.ABNORMAL:
                await self._save(item.model_copy(update={"state": "held", "assignments": ()}), [])
            elif event.phase == Phase.PENDING and not event.node_ids:
                await self._requeue(item, event.requeue_cause)

    async def _requeue(self, item: QueueItem, cause: str | None) -> None:
        """Back in the queue; after an out-of-memory it needs more, after a move it avoids where it was."""
        previous = [self.fleet[a.node_id].info for a in item.assignments if a.node_id in self.fleet]
        needs, exclude = item.needs, ()
        if cause == "oom_gpu":
            used = [g.memory_gb for n, a in zip(previous, item.assignments) for g in n.gpus
                    if g.index in a.gpu_indices] or [g.memory_gb for n in previous for g in n.gpus] or [0]
            needs = needs.model_copy(update={"min_gpu_memory_gb": max(used) + 0.001,
                                             "gpu_count": max(1, needs.gpu_count)})
        elif cause == "oom_host":
            needs = needs.model_copy(update={"memory_gb": needs.memory_gb * 2})
        elif cause in ("migrated", "slow", "reclaimed"):
            exclude = tuple(a.node_id for a in item.assignments)
        item = item.model_copy(update={"state": "queued", "assignments": (), "resource": needs, "exclude": exclude})
        nodes = [n.info for n in self.fleet.values()]
        if cause in ("oom_gpu", "oom_host") and not any(
                n.allows(item.spec.placement.allowed) and could_ever_fit(n, needs) for n in nodes):
            what = (f"more than {needs.min_gpu_memory_gb - 0.001:g} GB per GPU" if cause == "oom_gpu"
                    else f"{needs.memory_gb:g} GB of host memory")
            reason = (f"out of {'GPU' if cause == 'oom_gpu' else 'host'} memory: the job needs {what}; "
                      f"{largest(nodes, needs, item.spec.placement.allowed)}")
            event = JobUnplaceable(event_id=f"{item.job_id}:unplaceable:{item.attempt}", job_id=item.job_id,
                                   reason=reason)
            await self._save(item.model_copy(update={"state": "held"}), [event])
            return
        await self._save(item, [])

    async def estimated(self, event: EtaEstimated) -> None:
        """A job far slower than its owner expects moves to faster resources, or its owner hears about it."""
        item = self.queue.get(event.job_id)
        expected = item.spec.placement.expected_duration_s if item else None
        if not (item and expected and event.eta and item.state == "placed" and item.started_at
                and item.slow_checked < item.attempt):
            return
        elapsed = (event.occurred_at - item.started_at).total_seconds()
        if elapsed + event.eta.remaining_s <= self.slow_factor * expected:
            return
        current = sum(g.tflops for a in item.assignments if a.node_id in self.fleet
                      for g in self.fleet[a.node_id].info.gpus if g.index in a.gpu_indices)
        faster = self._faster_node(item, current)
        item = item.model_copy(update={"slow_checked": item.attempt})
        message = (f"expected {expected}s, estimated {elapsed + event.eta.remaining_s:.0f}s "
                   f"({self.slow_factor:g}x is the limit)")
        if faster:
            events = [JobMigrateRequested(event_id=f"{item.job_id}:migrate:slow:{item.attempt}",
                                          job_id=item.job_id, requested_by="placement", cause="slow",
                                          attempt=item.attempt)]
            log.info("job %s is slow (%s): moving to %s", item.job_id, message, faster)
        else:
            events = [Notification(event_id=f"{item.job_id}:notify:slow:{item.attempt}", project_id=item.project_id,
                                   job_id=item.job_id, user_name=item.user_name, kind="slow_no_faster_option",
                                   message=f"job is slow: {message}; no faster resources are free")]
        await self._save(item, events)

    def _faster_node(self, item: QueueItem, current_tflops: float) -> str | None:
        """A ready node, free now, where this job would run faster than where it is."""
        usage = self.usage()
        here = {a.node_id for a in item.assignments}
        for node in self.fleet.values():
            info = node.info
            if node.state != "ready" or info.node_id in here or not info.allows(item.spec.placement.allowed):
                continue
            gpus = fits(info, usage.get(info.node_id, Usage()), item.needs)
            if gpus is not None and sum(g.tflops for g in info.gpus if g.index in gpus) > current_tflops * 1.2:
                return info.node_id
        return None

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
                used.cpu += item.needs.cpu_count
                used.memory_gb += item.needs.memory_gb
        return usage

    async def schedule_once(self) -> int:
        """Place what fits now; return how many jobs were placed."""
        waiting = [Candidate(job_id=i.job_id, resource=i.needs, allowed=i.spec.placement.allowed,
                             priority=i.spec.placement.priority, submitted_at=i.submitted_at.timestamp(),
                             exclude=frozenset(i.exclude))
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
                      user_name=item.user_name, algorithm=item.algorithm,
                      spec=item.spec.model_copy(update={"resource": item.needs}))
            for a in assignments
        ]
        placed = item.model_copy(update={"state": "placed", "attempt": attempt, "assignments": assignments,
                                         "exclude": ()})
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
