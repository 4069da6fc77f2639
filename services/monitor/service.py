"""The monitor's service layer: load, apply a pure transition, persist with its events, retry on conflict."""
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from shared.bus import BusLink, publish
from shared.clock import utcnow
from shared.events import JobStatusChanged, NodeTasksLost, TaskRef
from shared.jobs import IllegalTransition, Phase
from shared.store import DocumentStore
from services.monitor import nodes as liveness
from services.monitor.nodes import NodeRecord
from services.monitor.state import JobState, Outcome, expire, node_lost, snapshot, stop

log = logging.getLogger(__name__)

MAX_CONFLICTS = 50


@dataclass
class Monitor:
    jobs: DocumentStore
    nodes: DocumentStore
    node_timeout_s: float
    started_at: datetime
    link: BusLink | None = None

    async def apply(self, job_id: str, change: Callable[[JobState | None], Outcome | None]) -> None:
        """Apply a transition to one job; idempotent because the transition sees the stored state."""
        for _ in range(MAX_CONFLICTS):
            doc = await self.jobs.load(job_id)
            current = JobState.model_validate(doc) if doc else None
            try:
                outcome = change(current)
            except IllegalTransition as exc:
                log.error("job %s: refused illegal transition: %s", job_id, exc)
                return
            if outcome is None:
                return
            new, events = outcome
            if new == current and not events:
                return
            if await self.jobs.save(job_id, new.model_dump(), doc, events):
                return
        raise RuntimeError(f"job {job_id}: too many concurrent updates")

    async def snapshot(self, job_id: str, *, now: datetime) -> JobStatusChanged | None:
        doc = await self.jobs.load(job_id)
        return snapshot(JobState.model_validate(doc), now=now) if doc else None

    async def sighted(self, node_id: str, **seen) -> None:
        """Record a registration or heartbeat; an agent restart loses the tasks it no longer runs."""
        for _ in range(MAX_CONFLICTS):
            doc = await self.nodes.load(node_id)
            current = NodeRecord.model_validate(doc) if doc else None
            sighting = liveness.sighted(current, node_id=node_id, **seen)
            if sighting.node == current:
                return
            events = [sighting.event] if sighting.event else []
            if sighting.restarted:
                events.append(NodeTasksLost(event_id=f"{node_id}:{sighting.node.boot_id}:tasks_lost", node_id=node_id,
                                            cause=f"agent on {node_id} restarted", alive=sighting.node.running,
                                            started_only=True))
            if await self.nodes.save(node_id, sighting.node.model_dump(), doc, events):
                break
        else:
            raise RuntimeError(f"node {node_id}: too many concurrent updates")
        await self._fence(node_id, sighting.node.running, now=seen["at"])

    async def _fence(self, node_id: str, running: tuple[TaskRef, ...], *, now: datetime) -> None:
        """Stop tasks a node still runs for attempts that were superseded (the node was taken for lost)."""
        if not running:
            return
        ids = list({t.job_id for t in running})
        jobs = {d["_id"]: JobState.model_validate(d) async for d in self.jobs.collection.find({"_id": {"$in": ids}})}
        for ref in running:
            job = jobs.get(ref.job_id)
            if job is None or job.attempt < ref.attempt:
                continue  # not caught up with this attempt yet
            superseded = job.attempt > ref.attempt or job.phase.is_finished() or str(ref.rank) not in job.tasks
            if superseded:
                await publish(self.jobs.broker, stop(ref.job_id, ref.attempt, node_id, rank=ref.rank,
                                                     reason="fenced", grace_s=0, now=now))

    async def check_liveness(self) -> None:
        """Nodes that went silent, and jobs that ran past their max_duration_s."""
        await self.check_silent_nodes(utcnow())
        await self.expire_overdue(utcnow())

    async def expire_overdue(self, now: datetime) -> None:
        """Terminate running jobs past their max_duration_s."""
        overdue = [d["_id"] async for d in self.jobs.collection.find(
            {"phase": Phase.RUNNING.value, "max_duration_s": {"$gt": 0}}, {"_id": 1})]
        for job_id in overdue:
            await self.apply(job_id, lambda job: job and expire(job, now=now))

    async def released(self, node_id: str) -> None:
        """An on-demand node was given back: it is gone on purpose, not lost."""
        doc = await self.nodes.load(node_id)
        if doc and doc.get("state") != "released":
            node = NodeRecord.model_validate(doc).model_copy(update={"state": "released", "running": ()})
            await self.nodes.save(node_id, node.model_dump(), doc, [])

    async def check_silent_nodes(self, now: datetime) -> None:
        """Declare lost every node silent past its timeout, and requeue what ran there."""
        if (now - self.started_at).total_seconds() < self.node_timeout_s:
            return  # just restarted: let heartbeats that queued up while we were down arrive first
        if self.link and self.link.steady_for() < self.node_timeout_s:
            return  # the bus was away: nodes could not speak, that is not their fault
        docs = [d async for d in self.nodes.collection.find({"state": "ready"})]
        for node in liveness.silent([NodeRecord.model_validate(d) for d in docs], now=now,
                                    timeout_s=self.node_timeout_s):
            await self._declare_lost(node)

    async def _declare_lost(self, node: NodeRecord) -> None:
        doc = await self.nodes.load(node.node_id)
        if not doc or doc.get("state") != "ready":
            return
        lost, event = liveness.declare_lost(NodeRecord.model_validate(doc))
        cause = f"node {node.node_id} lost (silent since {node.last_seen.isoformat(timespec='seconds')})"
        tasks_lost = NodeTasksLost(event_id=f"{event.event_id}:tasks_lost", node_id=node.node_id, cause=cause)
        await self.nodes.save(node.node_id, lost.model_dump(), doc, [event, tasks_lost])
        log.warning("node %s lost", node.node_id)

    async def lose_tasks(self, event: NodeTasksLost, *, at: datetime) -> None:
        """Requeue the jobs whose current attempt ran on the node, unless their task there is still alive."""
        node_id, cause = event.node_id, event.cause
        alive = {(t.job_id, t.attempt, t.rank) for t in event.alive}
        ids = [doc["_id"] async for doc in self.jobs.collection.find({"assignments.node_id": node_id}, {"_id": 1})]
        for job_id in ids:
            def lose(job: JobState | None) -> Outcome | None:
                if job is None:
                    return None
                mine = [(job.job_id, job.attempt, int(r)) for r, t in job.tasks.items() if t.node_id == node_id
                        and (t.state == "running" or not event.started_only)]
                if not mine or all(key in alive for key in mine):
                    return None
                return node_lost(job, node_id, now=at, cause=cause)

            await self.apply(job_id, lose)
