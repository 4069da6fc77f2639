"""Placement's service layer: what each event does to the queue and the fleet, and one scheduling loop. The queue's
storage is `queue.py`, the policy's inputs `inputs.py`, carrying decisions out `apply.py`; the engine that decides
is `policy/`."""

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from shared.clock import utcnow
from shared.events import (
    EtaEstimated,
    JobMigrateRequested,
    JobStatusChanged,
    JobSubmitted,
    JobUnplaceable,
    Message,
    Notification,
)
from shared.jobs import Phase
from shared.nodes import NodeInfo
from shared.rpc import CandidatesQuery, CandidatesReply, Catalogue
from shared.store import DocumentStore
from services.placement.apply import MAX_MEMORY_GB, apply
from services.placement.candidates import candidates
from services.placement.catalogue import catalogue
from services.placement.estimates import Estimates
from services.placement.fairshare import FairShare
from services.placement.fleet import Fleet
from services.placement.inputs import PolicyInputs
from services.placement.policy import PolicyConfig
from services.placement.policy.dryrun import OWNED_POLICIES, faster_node
from services.placement.policy.engine import Constraint, place
from services.placement.policy.hosting import as_node, ever_placeable, gpu_memory_after_oom, largest
from services.placement.providers.reconcile import pod_failed
from services.placement.queue import JobQueue, QueueItem
from services.placement.tradeoff import Tradeoff

log = logging.getLogger(__name__)
# A job whose attempt hung, or whose node was lost, avoids that node for its next attempt where another node (or a
# rental) could host it: one bad GPU or a flapping node had it back at once, every attempt, for as long as it was the
# best fit. Where only those nodes can host it, it goes back to them as before.
AVOIDED = ("hung", "node_lost")
AVOID_S = 900.0  # for so long: then any node again (the others may have gone, or be busy for days)


def acts_on(event: JobStatusChanged) -> bool:
    """Whether placement may act on a status at all (`Placement.status_changed`): a job's end frees its GPUs, its
    start (Running) is recorded, Abnormal holds its GPUs, and Pending without nodes queues it again. Its consumer's
    filter (`shared.events.PLACEMENT_STATUSES`) delivers these and spares the rest; a branch for another status
    starts here, and the walk of every status history (`tests/unit/test_status_subjects.py`) then holds the filter
    to it."""
    return (
        event.phase.is_finished()
        or event.phase in (Phase.RUNNING, Phase.ABNORMAL)
        or (event.phase == Phase.PENDING and not event.node_ids)
    )


@dataclass
class Placement:
    """The queue (`store`), the fleet and the policy's inputs, moved by events; one engine pass places them."""

    jobs: DocumentStore
    fleet: Fleet
    slow_factor: float = 1.5
    config: PolicyConfig = field(default_factory=PolicyConfig)
    waiting: dict[str, str] = field(default_factory=dict)  # job -> why it waits (last pass)
    fair: FairShare = field(default_factory=FairShare)  # recent GPU-hours per user, persisted
    tradeoff: Tradeoff = field(default_factory=Tradeoff)  # exchange rate per project ([placement] of cluster.toml)
    estimates: Estimates = field(default_factory=lambda: Estimates(broker=None))
    flavors: Sequence[Mapping[str, Any]] = ()  # the cluster file's [[flavors]]

    def __post_init__(self) -> None:
        self.store = JobQueue(self.jobs)
        self.inputs = PolicyInputs(
            fleet=self.fleet, config=self.config, fair=self.fair, tradeoff=self.tradeoff, estimates=self.estimates
        )

    @property
    def queue(self) -> dict[str, QueueItem]:
        return self.store.items

    @property
    def queued(self) -> set[str]:
        return self.store.queued

    @property
    def dirty(self) -> asyncio.Event:
        return self.store.dirty

    async def load(self) -> None:
        await self.store.load(now=utcnow())
        await self.fleet.load()
        await self.fair.load()

    async def submitted(self, event: JobSubmitted) -> None:
        if event.job_id in self.queue:
            return
        await self.store.add(
            QueueItem(
                job_id=event.job_id,
                project_id=event.project_id,
                user_name=event.user_name,
                algorithm=event.algorithm,
                spec=event.spec,
                submitted_at=event.create_time,
            )
        )

    async def status_changed(self, event: JobStatusChanged) -> None:
        item = self.queue.get(event.job_id)
        if item is None or not acts_on(event):
            return
        if event.phase.is_finished():
            self.inputs.expected_end.pop(item.job_id, None)  # the estimate of a job that ran: no end to plan by
            await self._charge_fair_share(item, event)
            await self.store.save(item.model_copy(update={"state": "done"}), [])
        elif event.phase == Phase.RUNNING and event.start_time and item.started_at is None:
            started = item.model_copy(update={"started_at": event.start_time})
            if clocked(item):
                await self.store.save(started, [])
            else:
                self.store.keep(started)  # written with its next change; a restart reads the start of none
        elif event.attempt == item.attempt and item.state in ("placed", "held"):
            if event.phase == Phase.ABNORMAL:  # its node lost: kept for its requeue to avoid (those the monitor
                # names of the nodes it ran on; from a monitor that names none, every one)
                ran_on = tuple(a.node_id for a in item.assignments)
                left = tuple(n for n in event.lost_node_ids if n in ran_on) or ran_on or item.left
                await self.store.save(item.model_copy(update={"state": "held", "assignments": (), "left": left}), [])
            elif event.phase == Phase.PENDING and not event.node_ids:
                await self._requeue(item, event.requeue_cause)

    async def _requeue(self, item: QueueItem, cause: str | None) -> None:
        """Back in the queue; after an out-of-memory it needs more, after a move it avoids where it was."""
        self.inputs.expected_end.pop(item.job_id, None)  # the last attempt's end: the next one's comes with it
        # Each rank's node as it registered (a node forgotten since is left out, its rank with it).
        previous = [(info, a) for a in item.assignments if (info := self.fleet.registration(a.node_id)) is not None]
        needs = item.needs
        exclude: tuple[str, ...] = ()
        if cause == "oom_gpu":
            used = (
                [g.memory_gb for n, a in previous for g in n.gpus if g.index in a.gpu_indices]
                or [g.memory_gb for n, _ in previous for g in n.gpus]
                or [0]
            )
            everything = self.fleet.known_nodes() + tuple(as_node(i) for i in self.fleet.catalogue)
            need = gpu_memory_after_oom(
                asked_gb=needs.min_gpu_memory_gb,
                had_gb=max(used),
                peak_gb=await self.estimates.peak_gpu_memory(item.job_id),
                largest_gb=max((n.gpu_memory_gb for n in everything if n.gpu_count), default=0.0),
            )
            needs = needs.model_copy(
                update={"min_gpu_memory_gb": min(need, 1024), "gpu_count": max(1, needs.gpu_count)}
            )
        elif cause == "oom_host":
            needs = needs.model_copy(update={"memory_gb": min(item.given_memory_gb * 2, MAX_MEMORY_GB)})
        elif cause in ("migrated", "slow", "reclaimed", *AVOIDED):  # a lost node's attempt: held with `left`
            exclude = tuple(a.node_id for a in item.assignments) or item.left
        item = item.model_copy(
            update={
                "state": "queued",
                "assignments": (),
                "resource": needs,
                "exclude": exclude,
                "exclude_until": utcnow() + timedelta(seconds=AVOID_S) if cause in AVOIDED and exclude else None,
                "left": (),
                "moving": False,
                "memory_gb": None,
                "queued_at": utcnow(),
            }
        )
        job, nodes = self.inputs.job_request(item), self.fleet.known_nodes()
        if cause in AVOIDED and exclude:  # only where a live node but those (or a rental) could host it
            live = {n.node_id for n in self.fleet.live()}
            rule = self.inputs.constraints([item]).get(item.job_id, Constraint())  # its pool, its kept nodes
            others = [n for n in nodes if n.id in live and rule.allows(n)]
            rents = rule.rents and self.config.policy not in OWNED_POLICIES
            if not ever_placeable(others, self.fleet.rentable(time.time()) if rents else (), job):
                item = item.model_copy(update={"exclude": (), "exclude_until": None})  # else back there
        if cause in ("oom_gpu", "oom_host") and not ever_placeable(nodes, self.fleet.catalogue, job):
            what = (
                f"more than {needs.min_gpu_memory_gb - 0.001:g} GB per GPU"
                if cause == "oom_gpu"
                else f"{needs.memory_gb:g} GB of host memory"
            )
            everything = nodes + tuple(as_node(i) for i in self.fleet.catalogue)
            reason = (
                f"out of {'GPU' if cause == 'oom_gpu' else 'host'} memory: the job needs {what}; "
                f"{largest(everything, job)}"
            )
            event = JobUnplaceable(
                event_id=f"{item.job_id}:unplaceable:{item.attempt}", job_id=item.job_id, reason=reason
            )
            await self.store.save(item.model_copy(update={"state": "held"}), [event])
            return
        await self.store.save(item, [])

    async def estimated(self, event: EtaEstimated) -> None:
        """A job far slower than its owner expects moves to faster resources, or its owner hears about it."""
        item = self.queue.get(event.job_id)
        if item and event.eta and item.state == "placed":
            self.inputs.expected_end[item.job_id] = event.eta.finish_time.timestamp()
        expected = item.spec.placement.expected_duration_s if item else None
        if not (
            item
            and expected
            and event.eta
            and item.state == "placed"
            and item.started_at
            and item.slow_checked < item.attempt
        ):
            return
        elapsed = (event.occurred_at - item.started_at).total_seconds()
        if elapsed + event.eta.remaining_s <= self.slow_factor * expected:
            return
        current = sum(
            g.speed
            for a in item.assignments
            if (info := self.fleet.registration(a.node_id)) is not None
            for g in info.gpus
            if g.index in a.gpu_indices
        )
        faster = self._faster_node(item, current)
        item = item.model_copy(update={"slow_checked": item.attempt})
        message = (
            f"expected {expected}s, estimated {elapsed + event.eta.remaining_s:.0f}s "
            f"({self.slow_factor:g}x is the limit)"
        )
        events: list[Message]
        if faster:
            events = [
                JobMigrateRequested(
                    event_id=f"{item.job_id}:migrate:slow:{item.attempt}",
                    job_id=item.job_id,
                    requested_by="placement",
                    cause="slow",
                    attempt=item.attempt,
                )
            ]
            log.info("job %s is slow (%s): moving to %s", item.job_id, message, faster)
        else:
            events = [
                Notification(
                    event_id=f"{item.job_id}:notify:slow:{item.attempt}",
                    project_id=item.project_id,
                    job_id=item.job_id,
                    user_name=item.user_name,
                    kind="slow_no_faster_option",
                    message=f"job is slow: {message}; no faster resources are free",
                )
            ]
        await self.store.save(item, events)

    def _faster_node(self, item: QueueItem, current_tflops: float) -> str | None:
        """A ready node, free now, where this job would run faster than where it is."""
        now = time.time()
        state = self.inputs.state(self._kept_queued(), self.store.placed(), now)
        here = frozenset(a.node_id for a in item.assignments)
        return faster_node(
            state,
            self.inputs.job_request(item),
            away_from=here,
            tflops_now=current_tflops,
            now=now,
            config=self.inputs.config_now(),
        )

    async def deleted(self, job_id: str) -> None:
        """A finished job was deleted; one placement still counts as queued or running stays."""
        item = self.queue.get(job_id)
        if item is not None and item.state != "done":
            log.warning("JobDeleted for %s ignored: it is %s here", job_id, item.state)
            return
        await self.store.forget(job_id, now=utcnow())

    async def node_registered(self, claimed: NodeInfo) -> None:
        """A registration, capped to the node's record; a pass is due as for any verdict."""
        if await self.fleet.registered(claimed) and (self.queued or self.fleet.rented()):
            self.dirty.set()

    async def pod_failed(self, node_id: str, reason: str) -> None:
        """A provider saw a rented node's machine end (its Pod failed): no more work there, a pass is due."""
        if await pod_failed(self.fleet, node_id, reason):
            self.dirty.set()

    async def node_seen(self, info: NodeInfo | None, node_id: str, state: Literal["ready", "lost"]) -> None:
        """A verdict on a node; a pass is due only if a job waits or a rented node could be pulled back from."""
        if await self.fleet.seen(node_id, info=info, state=state) and (self.queued or self.fleet.rented()):
            self.dirty.set()

    def _kept_queued(self) -> list[QueueItem]:
        """Queued jobs a node is kept for (their claim holds in a dry run)."""
        kept = {n.reserved_for for n in self.fleet.live() if n.reserved_for}
        return [self.queue[j] for j in kept if j in self.queued]

    async def schedule_once(self, now: float | None = None) -> int:
        """One pass of the policy engine over the whole queue (GPU jobs, jobs kept to nodes, moving away or in a
        pool, jobs without GPUs), and what to rent, release and pull back. Returns jobs started."""
        now = time.time() if now is None else now
        if not self.queued and not self.fleet.rented():
            return 0  # nothing waits and nothing is rented: nothing to place, release or pull back
        queued = self.store.waiting()
        await self.inputs.refresh(queued, now)
        placed = self.store.placed()
        self.fleet.update_idle({a.node_id for i in placed for a in i.assignments}, now)
        for node_id in self.fleet.overdue(now):
            await self.fleet.release(node_id, reason="never registered")
        state = self.inputs.state(queued, placed, now)
        decisions = place(state, now, self.inputs.config_now(), self.inputs.constraints(queued))
        started, self.waiting = await apply(decisions, queue=self.store, fleet=self.fleet, inputs=self.inputs)
        return started

    def catalogue(self) -> Catalogue:
        return catalogue(self.fleet.all_infos(), self.fleet.catalogue, self.flavors)

    async def dry_run(self, query: CandidatesQuery) -> CandidatesReply:
        """A dry run with the estimator asked first (bounded wait), as a queued job's duration is."""
        await self.inputs.refresh_one(query.spec, query.parameters, time.time())
        return self.candidates(query)

    def candidates(self, query: CandidatesQuery) -> CandidatesReply:
        """A dry run: what the configured policy decides for the job queued behind the jobs waiting now (with their
        constraints), at the price it decides it; the estimator's duration when it has answered."""
        now = time.time()
        job, source = self.inputs.spec_request(
            query.spec, project_id=query.project_id, user_name=query.user_name, now=now, parameters=query.parameters
        )
        pool = query.spec.resource.pool_id
        queued = list(self.store.waiting())
        return candidates(
            self.inputs.state(queued, self.store.placed(), now),
            job,
            now=now,
            config=self.inputs.config_now(),
            known=self.fleet.known_nodes(),
            source=source,
            constraint=Constraint(pool=pool) if pool else None,
            constraints=self.inputs.constraints(queued),
        )

    async def _charge_fair_share(self, item: "QueueItem", event: JobStatusChanged) -> None:
        """Recent GPU-hours per user (halved every week) order the queue fairly; persisted across restarts."""
        if not (item.started_at and event.end_time):
            return
        hours = (event.end_time - item.started_at).total_seconds() / 3600 * item.needs.gpu_count * item.needs.node_count
        await self.fair.charge(item.user_name, hours, key=item.job_id)


def clocked(item: QueueItem) -> bool:
    """Whether the job's start is read after a restart: its GPUs' expected end (the policy's running work) or its
    slowness check (an expected duration) runs from it. A job without either is not written when it starts."""
    return item.needs.gpu_count > 0 or bool(item.spec.placement.expected_duration_s)


async def scheduling_loop(placement: Placement, *, tick_s: float = 5.0) -> None:
    """Re-run the policy whenever something changed (or every tick, to be safe)."""
    while True:
        try:
            await asyncio.wait_for(placement.dirty.wait(), timeout=tick_s)
        except TimeoutError:
            pass
        placement.dirty.clear()
        await placement.schedule_once()
