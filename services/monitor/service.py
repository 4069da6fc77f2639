"""The monitor's service layer: load, apply a pure transition, persist with its events, retry on conflict."""
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from shared.events import JobStatusChanged, NodeStateChanged
from shared.jobs import IllegalTransition
from shared.store import DocumentStore
from services.monitor import nodes as liveness
from services.monitor.nodes import NodeRecord
from services.monitor.state import JobState, Outcome, node_lost, snapshot

log = logging.getLogger(__name__)

MAX_CONFLICTS = 50


@dataclass
class Monitor:
    jobs: DocumentStore
    nodes: DocumentStore
    node_timeout_s: float
    started_at: datetime

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
            if await self.nodes.save(node_id, sighting.node.model_dump(), doc, events):
                break
        else:
            raise RuntimeError(f"node {node_id}: too many concurrent updates")
        if sighting.restarted:
            alive = {(t.job_id, t.attempt, t.rank) for t in sighting.node.running}
            await self._lose_tasks(node_id, cause=f"agent on {node_id} restarted", at=seen["at"], alive=alive)

    async def check_silent_nodes(self, now: datetime) -> None:
        """Declare lost every node silent past its timeout, and requeue what ran there."""
        if (now - self.started_at).total_seconds() < self.node_timeout_s:
            return  # just restarted: let heartbeats that queued up while we were down arrive first
        docs = [d async for d in self.nodes.collection.find({"state": "ready"})]
        for node in liveness.silent([NodeRecord.model_validate(d) for d in docs], now=now,
                                    timeout_s=self.node_timeout_s):
            await self._declare_lost(node)
            await self._lose_tasks(node.node_id, cause=f"node {node.node_id} lost (silent since "
                                   f"{node.last_seen.isoformat(timespec='seconds')})", at=now, alive=set())

    async def _declare_lost(self, node: NodeRecord) -> NodeStateChanged | None:
        doc = await self.nodes.load(node.node_id)
        if not doc or doc.get("state") != "ready":
            return None
        lost, event = liveness.declare_lost(NodeRecord.model_validate(doc))
        await self.nodes.save(node.node_id, lost.model_dump(), doc, [event])
        log.warning("node %s lost", node.node_id)
        return event

    async def _lose_tasks(self, node_id: str, *, cause: str, at: datetime, alive: set) -> None:
        async for doc in self.jobs.collection.find({"assignments.node_id": node_id}, {"_id": 1}):
            def lose(job: JobState | None) -> Outcome | None:
                if job is None:
                    return None
                mine = [(job.job_id, job.attempt, int(r)) for r, t in job.tasks.items() if t.node_id == node_id]
                if mine and all(key in alive for key in mine):
                    return None
                return node_lost(job, node_id, now=at, cause=cause)

            await self.apply(doc["_id"], lose)
