"""The monitor's service layer: load, apply a pure transition, persist with its events, retry on conflict."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Unpack

from pymongo import UpdateOne

from shared.batch import GroupCommit
from shared.bus import TRANSIENT_ERRORS, BusLink, publish
from shared.clock import utcnow
from shared.events import (
    JobStatusChanged,
    Message,
    NodeCadence,
    NodeHeartbeat,
    NodeRegistered,
    NodeTasksLost,
    TaskRef,
)
from shared.jobs import IllegalTransition, Phase
from shared.store import DocumentStore
from services.monitor import nodes as liveness
from services.monitor.cadence import Cadence
from services.monitor.dues import Dues
from services.monitor.fleet import Fleet
from services.monitor.nodes import NodeRecord, Seen, Sighting, record_of
from services.monitor.records import NodeRecords
from services.monitor.state import JobState, Outcome, exits_unstarted, expire, node_lost, snapshot, stop, stops_unheard

log = logging.getLogger(__name__)


async def _nothing() -> None:
    return None


async def _forget_nothing(node_id: str) -> None:
    return None


def restart_events(sighting: Sighting) -> list[Message]:
    """What a sighting announces: the node's new state, and the tasks an agent restart lost."""
    node = sighting.node
    events: list[Message] = [sighting.event] if sighting.event else []
    if sighting.restarted:
        events.append(
            NodeTasksLost(
                event_id=f"{node.node_id}:{node.boot_id}:tasks_lost",
                node_id=node.node_id,
                cause=f"agent on {node.node_id} restarted",
                alive=node.running,
                started_only=True,
                boot_id=node.boot_id,
            )
        )
    return events


def overdue_query(now: datetime) -> dict:
    """Running jobs whose deadline (JobState.deadline) has passed, or that were stored without one."""
    return {
        "phase": Phase.RUNNING.value,
        "$or": [
            {"deadline": {"$lt": now}},
            {"deadline": {"$exists": False}, "max_duration_s": {"$gt": 0}},
        ],
    }


def due_query(now: datetime) -> dict:
    """`overdue_query`, an exit kept for a start that is due (JobState.exits_due), or a stop no exit answered
    (JobState.stop_due)."""
    return {"$or": [overdue_query(now), {"exits_due": {"$lt": now}}, {"stop_due": {"$lt": now}}]}


EXITS_DUE = ({"exits_due": {"$ne": None}}, "exits_due")
STOPS_DUE = ({"stop_due": {"$ne": None}}, "stop_due")


def _settle_due(job: JobState, *, now: datetime) -> Outcome:
    """The exits due first (a task that completed without starting), then the stops no exit answered, then the
    deadline."""
    job, events = exits_unstarted(job, now=now)
    job, unheard = stops_unheard(job, now=now)
    job, more = expire(job, now=now)
    return job, events + unheard + more


# What overdue_query reads by: running jobs, by deadline.
DEADLINE_INDEX = [("phase", 1), ("deadline", 1)]
# What the sweep of exits kept for a start reads by (JobState.exits_due), and of stops no exit answered.
EXITS_DUE_INDEX = [("exits_due", 1)]
STOPS_DUE_INDEX = [("stop_due", 1)]
# What a node's loss reads by: its unfinished jobs (each boot id a node's agent changes is one).
NODE_JOBS_INDEX = [("assignments.node_id", 1), ("phase", 1)]
UNFINISHED = [str(p) for p in Phase if not p.is_finished()]


@dataclass
class Monitor:
    jobs: DocumentStore
    nodes: DocumentStore
    node_timeout_s: float
    started_at: datetime
    link: BusLink | None = None
    records: NodeRecords | None = None  # what each node may be; None: registrations as said (in-memory tests)
    fleet: Fleet = field(default_factory=Fleet)
    dues: Dues = field(default_factory=Dues)  # when the sweeps of due and hung jobs can find one (a read each)
    backlog: Callable[[], int] = lambda: 0  # heartbeats received and not yet read (the intake's queue)
    settle: Callable[[], Awaitable[None]] = _nothing  # a round trip to the bus server (`shared.pings`: a PING answered)
    # Drop the start commands still queued for a node (shared.bus.forget_starts); nodes whose purge failed are
    # retried at each liveness check while they stay lost.
    forget_starts: Callable[[str], Awaitable[None]] = _forget_nothing
    unforgotten: set[str] = field(default_factory=set)
    # The heartbeat interval agents are told, grown with the fleet (0 heartbeats a second: never adapted), and
    # the node timeout that goes with it.
    heartbeat_interval_s: float = 2.0
    heartbeats_per_s: float = 0.0
    wall: Callable[[], datetime] = utcnow  # the monitor's own clock: when a node was heard (a node's is its claim)
    # Terminations asked of jobs whose submission this monitor has not read yet (job id -> who asked): applied as
    # the submission comes. Asked before, they were dropped and the job ran, billed, after the API answered 202
    # (found by review). Kept in `early` (None: in memory only), read at start.
    early: Any = None
    early_terminates: dict[str, str] = field(default_factory=dict)
    cadence: Cadence = field(init=False, repr=False)
    # Nodes never stored before, written in groups: a fleet coming up registers thousands at once.
    first_writes: GroupCommit[tuple[str, dict, list], bool] = field(init=False, repr=False)
    # Writes a heartbeat calls for run beside the intake, one at a time per node (`_beside`).
    _writing: set[str] = field(default_factory=set, init=False, repr=False)
    _background: set[asyncio.Task] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.first_writes = GroupCommit(self._store_new_nodes)
        self.cadence = Cadence(
            base_interval_s=self.heartbeat_interval_s,
            base_timeout_s=self.node_timeout_s,
            budget_per_s=self.heartbeats_per_s,
        )

    def timeout(self) -> float:
        """The silence after which a ready node is lost, now (it grows with the heartbeat interval)."""
        return self.cadence.timeout(self.fleet.clock())

    async def announce_cadence(self) -> None:
        """Size the heartbeat interval to the fleet and tell every agent (on a change, else now and then)."""
        now = self.fleet.clock()
        nodes = self.fleet.size()
        changed = self.cadence.update(nodes, now)
        if changed:
            log.info(
                "heartbeat interval %.1f s, node timeout %.0f s for %d nodes",
                self.cadence.interval_s,
                self.cadence.timeout(now),
                nodes,
            )
        if self.cadence.due(now, changed=changed):
            await publish(
                self.nodes.broker,
                NodeCadence(
                    event_id=f"cadence:{self.cadence.interval_s}",
                    interval_s=self.cadence.interval_s,
                    timeout_s=self.cadence.timeout(now),
                ),
            )

    async def apply(
        self, job_id: str, change: Callable[[JobState | None], Outcome | None], *, new: bool = False
    ) -> None:
        """Apply a transition to one job; idempotent because the transition sees the stored state (`new`: the
        job's first event, written without a read; a stored job refuses it and is read)."""

        token = self.dues.begin()

        def write(doc: dict | None) -> tuple[dict, list] | None:
            current = JobState.model_validate(doc) if doc else None
            try:
                outcome = change(current)
            except IllegalTransition as exc:
                log.error("job %s: refused illegal transition: %s", job_id, exc)
                return None
            if outcome is None:
                return None
            new, events = outcome
            if new == current and not events:
                return None
            self.dues.writing(token, new)
            return new.model_dump(), events

        try:
            await self.jobs.update(job_id, write, new=new)
        finally:
            self.dues.end(token)

    async def snapshot(self, job_id: str, *, now: datetime) -> JobStatusChanged | None:
        doc = await self.jobs.load(job_id)
        return snapshot(JobState.model_validate(doc), now=now) if doc else None

    def health_details(self) -> dict:
        """Node liveness as `GET /healthz` shows it: how many nodes, and whether heartbeats are read as they come."""
        states = [r.state for r in self.fleet.records.values()]
        return {
            "nodes": len(states),
            "nodes_ready": states.count("ready"),
            "nodes_lost": states.count("lost"),
            "heartbeat_backlog": self.backlog(),
            "heartbeats_read_s_ago": round(self.fleet.clock() - self.fleet.caught_up_at, 3),
        }

    async def remember_terminate(self, job_id: str, requested_by: str) -> None:
        """A termination of a job not known here yet, kept for its submission."""
        if job_id in self.early_terminates:
            return
        if self.early is not None:
            await self.early.replace_one({"_id": job_id}, {"_id": job_id, "by": requested_by}, upsert=True)
        self.early_terminates[job_id] = requested_by

    async def take_terminate(self, job_id: str) -> str | None:
        """Who asked to terminate the newly submitted job before it was known here (None: nobody); forgotten."""
        requested_by = self.early_terminates.pop(job_id, None)
        if requested_by is not None and self.early is not None:
            await self.early.delete_one({"_id": job_id})
        return requested_by

    async def load_early(self) -> None:
        if self.early is not None:
            self.early_terminates.update({d["_id"]: d.get("by", "") async for d in self.early.find({})})

    async def load_fleet(self) -> int:
        """At start: every stored node into memory, each heard now (silence counts from this start). A last_seen
        ahead of now is a node's own clock, as monitors before this one stored it: it becomes now (it hid every
        later heartbeat of that boot)."""
        now = self.wall()
        async for doc in self.nodes.collection.find({}):
            node = record_of(doc)
            if node.last_seen > now:
                node = node.model_copy(update={"last_seen": now})
                seen = {"last_seen": now, "last_seen_s": now.timestamp()}
                await self.nodes.collection.update_one({"_id": node.node_id}, {"$set": seen})
            self.fleet.loaded(node)
        # The agents of a large fleet still heartbeat at the interval they were told: time them by it at once.
        self.cadence.update(self.fleet.size(), self.fleet.clock())
        return len(self.fleet.records)

    async def registered(self, event: NodeRegistered) -> None:
        """An agent (re)started; a registration read long after it was sent (a replay) says nothing of now. It is
        timed by when the bus server stored it (`handlers.on_node_event`), never later than now: the time the node
        states is its claim. What it claims is capped to the node's record; a node without one is stored without
        what it offers (placement gives it no work) and with the refusal, for the admin to see."""
        node_id, received = event.node.node_id, self.wall()
        at = min(event.occurred_at, received)
        info, refused = (event.node, {}) if self.records is None else await self.records.admit(event.node)
        await self.sighted(
            node_id,
            boot_id=event.boot_id,
            at=at,
            silences=event.silences,
            info=info,
            running=(),
            claims_refused=refused,
        )
        if (received - at).total_seconds() < self.timeout():
            self.fleet.hear(node_id)

    async def heartbeat(self, event: NodeHeartbeat) -> None:
        """A heartbeat (core NATS, read as it arrives): in memory only, unless it changes more than the clock; then
        the write goes on beside the intake, which reads the next heartbeat at once (a fleet coming up sends
        thousands of first heartbeats: waiting for each node's write would leave the others unread). The node is
        seen when the monitor received the heartbeat, on its own clock: the time the heartbeat states is the node's
        claim (a clock ahead, or a lie) and decides neither liveness, nor a fence's time, nor a loss's."""
        received = self.wall()
        self.fleet.hear(event.node_id)
        if event.node_id not in self._writing:  # else its write in flight stores it; this beat is the clock only
            current = self.fleet.records.get(event.node_id)
            seen: Seen = {
                "boot_id": event.boot_id,
                "at": received,
                "silences": event.silences,
                "running": event.running,
                "gpu_utilization": event.gpu_utilization,
                "gpus": event.gpus,
            }
            sighting = liveness.sighted(current, node_id=event.node_id, **seen)
            if sighting.event or sighting.restarted or liveness.changed(current, sighting.node):
                self._beside(event.node_id, self.sighted(event.node_id, **seen))
            elif self.fleet.beat(sighting.node):  # now and then, not on every beat: fence what still runs there
                fence = self._fence(event.node_id, sighting.node.running, now=received, as_stored=True)
                self._beside(event.node_id, fence)
        if self.backlog() == 0:
            self.fleet.caught_up()

    def _beside(self, node_id: str, write: Coroutine[Any, Any, None]) -> None:
        """Run a heartbeat's write as a task of its own; the node's heartbeats meanwhile only refresh its clock, and
        the first one after it re-reads what was stored (heartbeats say the whole state each time)."""
        self._writing.add(node_id)

        async def run() -> None:
            try:
                await write
            except TRANSIENT_ERRORS as exc:
                log.warning("heartbeat of %s not recorded (the next one will be): %r", node_id, exc)
            except Exception:
                log.exception("heartbeat of %s not recorded", node_id)
            finally:
                self._writing.discard(node_id)

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def written(self) -> None:
        """Wait for the writes heartbeats called for (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background))

    async def persist_seen(self) -> int:
        """Write the last_seen of nodes whose stored one is stale, in bulk (Unix seconds: `record_of`)."""
        nodes = self.fleet.take_dirty()
        for i in range(0, len(nodes), 500):
            await self.nodes.collection.bulk_write(
                [
                    UpdateOne({"_id": n.node_id}, {"$set": {"last_seen_s": n.last_seen.timestamp()}})
                    for n in nodes[i : i + 500]
                ],
                ordered=False,
            )
        return len(nodes)

    async def sighted(self, node_id: str, **seen: Unpack[Seen]) -> None:
        """Record a registration or heartbeat; an agent restart loses the tasks it no longer runs. A node never
        stored goes out with the others that first spoke at the same moment (one insert for a burst); one that
        someone stored meanwhile is read and updated as any other."""
        if node_id not in self.fleet.records and await self._first_sighting(node_id, seen):
            return
        read: list[tuple[NodeRecord | None, Sighting]] = []  # what each attempt read, and what it made of it

        def write(doc: dict | None) -> tuple[dict, list] | None:
            current = record_of(doc) if doc else None
            sighting = liveness.sighted(current, node_id=node_id, **seen)
            read.append((current, sighting))
            return None if sighting.node == current else (sighting.node.model_dump(), restart_events(sighting))

        written = await self.nodes.update(node_id, write)
        current, sighting = read[-1]
        if not written:
            if current is not None:
                self.fleet.stored(current)
            return
        self.fleet.stored(sighting.node)
        if sighting.event or sighting.restarted or current is None:
            log.info("node %s %s", node_id, "restarted" if sighting.restarted else "ready")
        await self._fence(node_id, sighting.node.running, now=seen["at"])

    async def _first_sighting(self, node_id: str, seen: Seen) -> bool:
        """Store a node never stored before, in a group; False when it was stored already (nothing written)."""
        sighting = liveness.sighted(None, node_id=node_id, **seen)
        if not await self.first_writes((node_id, sighting.node.model_dump(), restart_events(sighting))):
            return False
        self.fleet.stored(sighting.node)
        log.info("node %s ready", node_id)
        await self._fence(node_id, sighting.node.running, now=seen["at"])
        return True

    async def _store_new_nodes(self, items: list[tuple[str, dict, list]]) -> list[bool | Exception]:
        """Insert a group of new nodes with their events in one command, then publish the events side by side;
        per node whether it was inserted (an event that could not be published stays for the relay)."""
        pending = await self.nodes.insert_many(items)
        stored = [(node_id, entries) for (node_id, _, _), entries in zip(items, pending) if entries]
        for error in await self.nodes.flush_many(stored):
            if error is not None:
                log.warning("a new node's events are left to the outbox relay: %r", error)
        return [entries is not None for entries in pending]

    async def _fence(
        self, node_id: str, running: tuple[TaskRef, ...], *, now: datetime, as_stored: bool = False
    ) -> None:
        """Stop tasks a node still runs for attempts that were superseded (the node was taken for lost). Each job is
        judged as this process last wrote it where it remembers it (the monitor and its relay are the jobs' only
        writers), else as stored; `as_stored`: every one as stored (the look now and then while the running set
        stays the same, which a remembered copy gone stale, after a hand-over, cannot mislead)."""
        if not running:
            return
        ids = list({t.job_id for t in running})
        docs = {} if as_stored else {i: doc for i in ids if (doc := self.jobs.remembered(i)) is not None}
        if unread := [i for i in ids if i not in docs]:
            docs.update({d["_id"]: d async for d in self.jobs.collection.find({"_id": {"$in": unread}})})
        jobs = {job_id: JobState.model_validate(doc) for job_id, doc in docs.items()}
        for ref in running:
            job = jobs.get(ref.job_id)
            if job is None or job.attempt < ref.attempt:
                continue  # not caught up with this attempt yet
            superseded = job.attempt > ref.attempt or job.phase.is_finished() or str(ref.rank) not in job.tasks
            if superseded:
                await publish(
                    self.jobs.broker,
                    stop(ref.job_id, ref.attempt, node_id, rank=ref.rank, reason="fenced", grace_s=0, now=now),
                )

    async def check_liveness(self) -> None:
        """Nodes that went silent, jobs that ran past their max_duration_s, and exits whose start never came."""
        await self.check_silent_nodes(utcnow())
        await self.expire_due(utcnow())

    async def expire_due(self, now: datetime) -> None:
        """Terminate running jobs past their max_duration_s and apply the exits kept for a start that did not come
        by their due time (those tasks completed without having started): only the jobs with one due are read,
        in one query a check (`due_query`: the embedded database reads the whole collection for each)."""
        if not self.dues.due(now):
            return  # no job this process wrote (nor any its last sweep read) is due yet: nothing to read
        self.dues.due_sweep_begins(now)
        due = [d["_id"] async for d in self.jobs.collection.find(due_query(now), {"_id": 1})]
        for job_id in due:
            await self.apply(job_id, lambda job: None if job is None else _settle_due(job, now=now))
        # after a sweep that found some, the next one looks again (one it could not settle is still due, as a job an
        # older version stored without its deadline is: each second, as before); else it reads when the next is due
        self.dues.due_swept(now if due else await self._next_stored_due())

    async def _next_stored_due(self) -> datetime | None:
        """When the first stored job is due: the earliest deadline of a running job, exit kept for its start and
        stop no exit answered (a document each)."""
        times = []
        running = ({"phase": Phase.RUNNING.value, "deadline": {"$ne": None}}, "deadline")
        for query, key in (running, EXITS_DUE, STOPS_DUE):
            async for doc in self.jobs.collection.find(query, {key: 1}).sort(key, 1).limit(1):
                times.append(doc[key])
        return min(times) if times else None

    async def released(self, node_id: str) -> None:
        """An on-demand node was given back: it is gone on purpose, not lost."""
        released: list[NodeRecord] = []

        def release(doc: dict | None) -> tuple[dict, list] | None:
            if not doc or doc.get("state") == "released":
                return None
            released.append(record_of(doc).model_copy(update={"state": "released", "running": ()}))
            return released[-1].model_dump(), []

        if await self.nodes.update(node_id, release):
            self.fleet.stored(released[-1])
            log.info("node %s released", node_id)

    async def check_silent_nodes(self, now: datetime) -> None:
        """Declare lost every node silent past its timeout, and requeue what ran there."""
        if self.unforgotten:
            await self._forget_starts()
        timeout = self.timeout()
        if (now - self.started_at).total_seconds() < timeout:
            return  # just restarted: let heartbeats that queued up while we were down arrive first
        if self.link and self.link.steady_for() < timeout:
            return  # the bus was away: nodes could not speak, that is not their fault
        if self.backlog() == 0:
            self.fleet.caught_up()
        if not self.fleet.overdue(timeout) or not await self._settled():
            return
        for node_id in self.fleet.overdue(timeout):
            await self._declare_lost(node_id)

    async def _settled(self) -> bool:
        """Whether every heartbeat the bus server sent before now has been read: heartbeats still in the server's
        outbound buffer or in our socket are not yet in the intake's queue, so an empty queue alone proves nothing
        to a starved process. The server answers a ping after everything it sent before it."""
        try:
            await self.settle()
        except TRANSIENT_ERRORS as exc:
            log.warning("no verdict on silent nodes: the bus did not answer a ping (%r)", exc)
            return False
        return self.backlog() == 0

    async def _declare_lost(self, node_id: str) -> None:
        doc = await self.nodes.load(node_id)
        still_silent = self.fleet.overdue(self.timeout(), among=(node_id,))  # heard while we read?
        if not doc or doc.get("state") != "ready" or not still_silent:
            return
        node = record_of(doc)
        node = node.model_copy(update={"last_seen": max(node.last_seen, self.fleet.records[node_id].last_seen)})
        lost, event = liveness.declare_lost(node)
        cause = f"node {node_id} lost (silent since {node.last_seen.isoformat(timespec='seconds')})"
        tasks_lost = NodeTasksLost(event_id=f"{event.event_id}:tasks_lost", node_id=node_id, cause=cause)
        if await self.nodes.save(node_id, lost.model_dump(), doc, [event, tasks_lost]):
            self.fleet.stored(lost)
            log.warning("node %s lost: silent since %s", node_id, node.last_seen.isoformat(timespec="seconds"))
            self.unforgotten.add(node_id)
            await self._forget_starts()

    async def _forget_starts(self) -> None:
        """Drop the starts still queued for lost nodes, before the requeue their loss causes can place the work
        again: an agent that comes back would otherwise run an attempt already given to another node (the monitor
        fences a superseded start only once it is reported, and a short task runs through before the stop). A node
        heard again since is left alone: what is queued for it now is its new work."""
        for node_id in sorted(self.unforgotten):
            record = self.fleet.records.get(node_id)
            if record is None or record.state != "lost":
                self.unforgotten.discard(node_id)
                continue
            try:
                await self.forget_starts(node_id)
            except TRANSIENT_ERRORS as exc:
                log.warning("node %s: its queued starts not dropped yet (%r); retried", node_id, exc)
                continue
            self.unforgotten.discard(node_id)

    async def lose_tasks(self, event: NodeTasksLost, *, at: datetime) -> None:
        """Requeue the jobs whose current attempt ran on the node, unless their task there is still alive."""
        node_id, cause = event.node_id, event.cause
        alive = {(t.job_id, t.attempt, t.rank) for t in event.alive}
        query = {"assignments.node_id": node_id, "phase": {"$in": UNFINISHED}}  # not every job the node ever ran
        ids = [doc["_id"] async for doc in self.jobs.collection.find(query, {"_id": 1})]
        for job_id in ids:

            def lose(job: JobState | None) -> Outcome | None:
                if job is None:
                    return None
                mine = [
                    (job.job_id, job.attempt, int(r))
                    for r, t in job.tasks.items()
                    if t.node_id == node_id
                    and (t.state == "running" or not event.started_only)
                    and not (event.boot_id and t.boot_id == event.boot_id)  # started by the run that is up
                ]
                if not mine or all(key in alive for key in mine):
                    return None
                return node_lost(job, node_id, now=at, cause=cause)

            await self.apply(job_id, lose)
