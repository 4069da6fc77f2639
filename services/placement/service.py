"""Placement's service layer: the queue and the fleet in memory, persisted, and one scheduling loop."""
import asyncio
import logging
import time
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
    Launch,
    Notification,
)
from shared.jobs import Algorithm, Phase, Resource, Spec
from shared.nodes import NodeInfo
from shared.store import DocumentStore
from shared.rpc import CandidatesReply, Catalogue
from services.placement.adapter import JobView, reference_tflops
from services.placement.candidates import candidates
from services.placement.catalogue import catalogue
from services.placement.fit import Candidate, Usage, catalogue_node, could_ever_fit, fits, largest
from services.placement.fit import schedule as first_fit
from services.placement.estimates import Estimates
from services.placement.fairshare import FairShare
from services.placement.fleet import Fleet
from services.placement.inputs import PolicyInputs
from services.placement.tradeoff import Tradeoff
from services.placement.policy import PolicyConfig, Provision, PullBack, Release, Start, Wait
from services.placement.policy import schedule as policy_schedule

log = logging.getLogger(__name__)


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
    moving: bool = Field(False, description="Asked to move (pull-back); its current attempt is ending.")

    @property
    def needs(self) -> Resource:
        return self.resource or self.spec.resource


@dataclass
class Placement:
    jobs: DocumentStore
    fleet: Fleet
    slow_factor: float = 1.5
    config: PolicyConfig = field(default_factory=PolicyConfig)
    queue: dict[str, QueueItem] = field(default_factory=dict)
    dirty: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[str, str] = field(default_factory=dict)  # job -> why it waits (last pass)
    fair: FairShare = field(default_factory=FairShare)  # recent GPU-hours per user, persisted
    tradeoff: Tradeoff = field(default_factory=Tradeoff)  # exchange rate per project ([placement] of cluster.toml)
    estimates: Estimates = field(default_factory=lambda: Estimates(broker=None))
    queued: set[str] = field(default_factory=set)  # jobs in state "queued" (O(1): is anything waiting?)
    flavors: list[dict] = field(default_factory=list)  # the cluster file's [[flavors]]

    def __post_init__(self) -> None:
        self.inputs = PolicyInputs(fleet=self.fleet, config=self.config, fair=self.fair, tradeoff=self.tradeoff,
                                   estimates=self.estimates)

    async def load(self) -> None:
        async for doc in self.jobs.collection.find({"state": {"$ne": "done"}}):
            item = self.queue[doc["_id"]] = QueueItem.model_validate(doc)
            if item.state == "queued":
                self.queued.add(item.job_id)
        await self.fleet.load()
        await self.fair.load()
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
            await self._charge_fair_share(item, event)
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
        previous = [self.fleet.nodes[a.node_id].info for a in item.assignments if a.node_id in self.fleet.nodes]
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
        item = item.model_copy(update={"state": "queued", "assignments": (), "resource": needs, "exclude": exclude,
                                       "moving": False})
        nodes = self.fleet.all_infos() + [catalogue_node(i) for i in self.fleet.catalogue]
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
        if item and event.eta and item.state == "placed":
            self.inputs.expected_end[item.job_id] = event.eta.finish_time.timestamp()
        expected = item.spec.placement.expected_duration_s if item else None
        if not (item and expected and event.eta and item.state == "placed" and item.started_at
                and item.slow_checked < item.attempt):
            return
        elapsed = (event.occurred_at - item.started_at).total_seconds()
        if elapsed + event.eta.remaining_s <= self.slow_factor * expected:
            return
        current = sum(g.tflops for a in item.assignments if a.node_id in self.fleet.nodes
                      for g in self.fleet.nodes[a.node_id].info.gpus if g.index in a.gpu_indices)
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
        for info in self.fleet.ready_infos():
            if info.node_id in here or not info.allows(item.spec.placement.allowed):
                continue
            gpus = fits(info, usage.get(info.node_id, Usage()), item.needs)
            if gpus is not None and sum(g.tflops for g in info.gpus if g.index in gpus) > current_tflops * 1.2:
                return info.node_id
        return None

    async def deleted(self, job_id: str) -> None:
        """A finished job was deleted; one placement still counts as queued or running stays."""
        item = self.queue.get(job_id)
        if item is not None and item.state != "done":
            log.warning("JobDeleted for %s ignored: it is %s here", job_id, item.state)
            return
        self.queue.pop(job_id, None)
        await self.jobs.collection.delete_one({"_id": job_id, "state": "done"})

    async def node_seen(self, info: NodeInfo | None, node_id: str, state: Literal["ready", "lost"]) -> None:
        """A verdict on a node; a pass is due only if a job waits or a rented node could be pulled back from."""
        if await self.fleet.seen(node_id, info=info, state=state) and (self.queued or self.fleet.rented()):
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

    async def schedule_once(self, now: float | None = None) -> int:
        """One pass: the policy places GPU jobs (and decides what to rent, release and pull back); jobs that
        need no GPU, or must avoid the nodes they left, go where they fit first. Returns jobs started."""
        now = time.time() if now is None else now
        if not self.queued and not self.fleet.rented():
            return 0  # nothing waits and nothing is rented: nothing to place, release or pull back
        queued = [self.queue[job_id] for job_id in self.queued]
        await self.inputs.refresh(queued, now)
        kept = {n.reserved_for for n in self.fleet.live() if n.reserved_for}
        by_policy = [i for i in queued if i.needs.gpu_count > 0 and not i.exclude and not i.needs.pool_id
                     and i.job_id not in kept]
        usage = self.usage()
        self.fleet.update_idle({a.node_id for i in self.queue.values() if i.state == "placed"
                                for a in i.assignments}, now)
        for node_id in self.fleet.overdue(now):
            await self.fleet.release(node_id, reason="never registered")
        started = await self._apply(self._policy_pass(by_policy, usage, now), now)  # also renting, release, pull-back
        rest = [i for i in queued if i not in by_policy and self.queue[i.job_id].state == "queued"]
        if rest:
            candidates = [Candidate(job_id=i.job_id, resource=i.needs, allowed=i.spec.placement.allowed,
                                    priority=i.spec.placement.priority, submitted_at=i.submitted_at.timestamp(),
                                    exclude=self._not_for(i)) for i in rest]
            for job_id, assignments in first_fit(candidates, self.fleet.ready_infos(), self.usage()):
                for assignment in assignments:
                    await self.fleet.claimed(assignment.node_id)
                await self._place(self.queue[job_id], assignments)
                started += 1
        return started

    def _not_for(self, item: "QueueItem") -> frozenset[str]:
        """Nodes a first-fit placement must avoid: those it left, those kept for other jobs, and all but the
        ones kept for it (a pull-back reserves its owned node)."""
        nodes = self.fleet.live()  # a reservation on a lost or released node holds nothing
        mine = {n.node_id for n in nodes if n.reserved_for == item.job_id}
        if mine:
            return frozenset(n.node_id for n in nodes if n.node_id not in mine)
        others = {n.node_id for n in nodes if n.reserved_for}
        pooled = {n.node_id for n in nodes if n.info and item.needs.pool_id
                  and n.info.labels.get("pool") != item.needs.pool_id}
        return frozenset(item.exclude) | others | pooled

    def _policy_pass(self, items: list["QueueItem"], usage: dict[str, Usage], now: float) -> list:
        placed = [i for i in self.queue.values() if i.state == "placed"]
        state, config = self.inputs.state(items, placed, usage, now)
        return policy_schedule(state, now, config)

    async def _apply(self, decisions: list, now: float) -> int:
        started = 0
        self.waiting.clear()
        for decision in decisions:
            match decision:
                case Start(job_id=job_id, node_ids=node_ids, gpu_indices=gpus):
                    item = self.queue.get(job_id)
                    if item is None or item.state != "queued":
                        continue
                    assignments = tuple(Assignment(rank=r, node_id=n, gpu_indices=self.inputs.gpu_ids(n, g))
                                        for r, (n, g) in enumerate(zip(node_ids, gpus)))
                    for node_id in node_ids:
                        await self.fleet.claimed(node_id)
                    await self._place(item, assignments)
                    started += 1
                case Provision(instance_type=name, count=count, job_id=job_id):
                    item = self.queue[job_id]
                    await self.fleet.provision(name, count, job_id=job_id, project_id=item.project_id,
                                               user_name=item.user_name, expected_hours=self.inputs.hours(item))
                case Release(node_id=node_id):
                    await self.fleet.release(node_id, reason="idle")
                case PullBack(job_id=job_id, from_node_id=source, to_node_id=target):
                    await self._pull_back(job_id, source, target)
                case Wait(job_id=job_id, reason=reason):
                    self.waiting[job_id] = reason
        for node in list(self.fleet.nodes.values()):
            if node.release_when_idle and node.node_id in self.fleet.idle_since:
                await self.fleet.release(node.node_id, reason="pulled back")
        return started

    def catalogue(self) -> Catalogue:
        return catalogue(self.fleet.all_infos(), self.fleet.catalogue, self.flavors)

    def candidates(self, spec: Spec) -> CandidatesReply:
        infos = self.fleet.ready_infos()
        return candidates(spec=spec, nodes=infos, usage=self.usage(), catalogue=self.fleet.catalogue,
                          reference_tflops=reference_tflops(infos), known=self.fleet.all_infos())

    async def _pull_back(self, job_id: str, source: str, target: str) -> None:
        """Snapshot the job on the rented node and keep the owned one for it; the rented node goes once empty."""
        item = self.queue.get(job_id)
        if item is None or item.state != "placed" or item.moving:
            return
        await self.fleet.reserve(target, job_id)
        await self.fleet.release_when_idle(source)
        event = JobMigrateRequested(event_id=f"{job_id}:migrate:reclaimed:{item.attempt}", job_id=job_id,
                                    requested_by="placement", cause="reclaimed", attempt=item.attempt)
        await self._save(item.model_copy(update={"moving": True}), [event])
        log.info("pulling %s back from %s to %s", job_id, source, target)

    def _job_view(self, item: "QueueItem") -> JobView:
        return self.inputs.job_view(item)

    async def _charge_fair_share(self, item: "QueueItem", event: JobStatusChanged) -> None:
        """Recent GPU-hours per user (halved every week) order the queue fairly; persisted across restarts."""
        if not (item.started_at and event.end_time):
            return
        hours = (event.end_time - item.started_at).total_seconds() / 3600 * item.needs.gpu_count * \
            item.needs.node_count
        await self.fair.charge(item.user_name, hours)

    async def _place(self, item: QueueItem, assignments: tuple[Assignment, ...]) -> None:
        attempt = item.attempt + 1
        now = utcnow()
        master = self.fleet.nodes[assignments[0].node_id].info.address
        port = 29500 + zlib.crc32(f"{item.job_id}:{attempt}".encode()) % 2000
        launch = Launch(master_addr=master, master_port=port, algorithm=item.algorithm,
                        spec=item.spec.model_copy(update={"resource": item.needs}))
        events = [JobPlaced(event_id=f"{item.job_id}:placed:{attempt}", occurred_at=now, job_id=item.job_id,
                            attempt=attempt, assignments=assignments, launch=launch)]
        placed = item.model_copy(update={"state": "placed", "attempt": attempt, "assignments": assignments,
                                         "exclude": (), "moving": False})
        await self._save(placed, events)
        log.info("job %s attempt %d placed on %s", item.job_id, attempt, ", ".join(a.node_id for a in assignments))

    async def _save(self, item: QueueItem, events: list) -> None:
        """Persist the item (in memory it is authoritative: placement runs as one process) with its events; the
        outbox relay bumps the revision when it publishes, so a conflict is retried over what is stored."""
        await self.jobs.update(item.job_id, lambda _: (item.model_dump(), events))
        self.queue[item.job_id] = item
        if item.state == "queued":
            self.queued.add(item.job_id)
        else:
            self.queued.discard(item.job_id)
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
