"""Monitor subscribers: decode, hand to the service layer through EVENT_HANDLERS."""

import logging
import math
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from faststream.nats import NatsRouter
from nats.aio.msg import Msg

from shared.bus import RPC_MIGRATE, RPC_NODES, RPC_TERMINATE, TRANSIENT_ERRORS, durable, retry_transient
from shared.clock import utcnow
from shared.context import Context, NatsMessage
from shared.events import (
    JobEvent,
    JobMigrateRequested,
    JobPlaced,
    JobStatusChanged,
    JobSubmitted,
    JobTerminateRequested,
    JobUnplaceable,
    NodeEvent,
    NodeHeartbeat,
    NodeProvisioned,
    NodeRegistered,
    NodeReleased,
    NodeTasksLost,
    TaskExited,
    TaskHung,
    TaskPreparing,
    TaskResumed,
    TaskStarted,
)
from shared.handlers import HandlerTable, dispatch
from shared.jsmeta import stored_at
from shared.keyed import keyed_durable
from services.monitor import hangs, state
from services.monitor.service import Monitor

log = logging.getLogger(__name__)

TaskEvent = state.TaskEvent
NODES_PAGE_MAX = 1000
MAX_HEARTBEAT_BYTES = 256 * 1024  # a heartbeat lists at most 1,024 tasks and 64 GPU readings: ~100 KB
MIN_BEAT_GAP = 0.25  # of the cadence's interval: a node's heartbeats closer than this to its last one read are not
MAX_NODES_HEARD = 200_000


class TaskTransition(Protocol):
    # The event is of the table key's type, which a dict's value type cannot name (as shared.handlers' Handler).
    def __call__(self, job: state.JobState, event: Any, /, *, now: datetime) -> state.Outcome: ...


TASK_TRANSITIONS: dict[type[state.TaskEvent], TaskTransition] = {
    TaskPreparing: state.task_preparing,
    TaskStarted: state.task_started,
    TaskExited: state.task_exited,
    TaskHung: hangs.task_hung,
    TaskResumed: hangs.task_resumed,
}


async def submitted(monitor: Monitor, event: JobSubmitted) -> None:
    """A new job (a redelivered submission changes nothing); one whose termination was asked before it was known
    here is terminated at once."""
    now = utcnow()
    requested_by = monitor.early_terminates.get(event.job_id)

    def submit(job: state.JobState | None) -> state.Outcome | None:
        if job:
            return None
        new, events = state.submitted(event, now=now)
        if requested_by is None:
            return new, events
        new, more = state.terminate(new, requested_by=requested_by, now=now)
        return new, [*events, *more]

    await monitor.apply(event.job_id, submit, new=True)
    if requested_by is not None:  # applied: forgotten
        await monitor.take_terminate(event.job_id)


async def placed(monitor: Monitor, event: JobPlaced) -> None:
    """Placement chose nodes for an attempt."""
    now = utcnow()
    nodes = [a.node_id for a in event.assignments]
    gone, silences = monitor.fleet.gone(nodes), monitor.fleet.silences(nodes)
    await monitor.apply(
        event.job_id,
        lambda job: None if job is None else state.placed(job, event, now=now, gone=gone, silences=silences),
    )


async def task_changed(monitor: Monitor, event: TaskEvent) -> None:
    """An agent's word on one task of an attempt."""
    now = utcnow()
    await monitor.apply(event.job_id, lambda job: _task_change(job, event, now=now))


async def terminate(monitor: Monitor, event: JobTerminateRequested) -> None:
    """Someone asked to terminate the job (kept for its submission when it is not known here yet)."""
    await terminated(monitor, event, now=utcnow())


async def terminated(monitor: Monitor, request: JobTerminateRequested, *, now: datetime) -> bool:
    """Terminate the job; whether it is known here (one that is not is kept for its submission)."""
    known = False

    def stop(job: state.JobState | None) -> state.Outcome | None:
        nonlocal known
        known = job is not None
        return None if job is None else state.terminate(job, requested_by=request.requested_by, now=now)

    await monitor.apply(request.job_id, stop)
    if not known:
        await monitor.remember_terminate(request.job_id, request.requested_by)
    return known


async def migrate(monitor: Monitor, event: JobMigrateRequested) -> None:
    """Snapshot the job and continue it elsewhere."""
    now = utcnow()
    await monitor.apply(
        event.job_id,
        lambda job: None if job is None else state.migrate(job, cause=event.cause, attempt=event.attempt, now=now),
    )


async def unplaceable(monitor: Monitor, event: JobUnplaceable) -> None:
    """No node can ever host the job as it now needs."""
    now = utcnow()
    await monitor.apply(
        event.job_id, lambda job: None if job is None else state.unplaceable(job, reason=event.reason, now=now)
    )


async def tasks_lost(monitor: Monitor, event: NodeTasksLost) -> None:
    """A node's tasks are gone (node silent, or its agent restarted)."""
    await monitor.lose_tasks(event, at=utcnow())


async def provisioned(monitor: Monitor, event: NodeProvisioned) -> None:
    """Placement rented a node: keep its record, which its registration is capped to."""
    if monitor.records is not None:
        await monitor.records.provisioned(event)


async def released(monitor: Monitor, event: NodeReleased) -> None:
    """Placement gave a node back."""
    await monitor.released(event.node_id)


def _task_change(job: state.JobState | None, event: TaskEvent, *, now: datetime) -> state.Outcome | None:
    """An agent's word on a task counts only from the node the task's attempt was placed on: log and drop the rest."""
    if job is None:
        log.warning("%s for unknown job %s from node %s dropped", event.type, event.job_id, event.node_id)
        return None
    if not state.from_placed_node(job, event):
        log.warning(
            "%s of job %s attempt %d rank %d from node %s dropped: that attempt was not placed there",
            event.type,
            event.job_id,
            event.attempt,
            event.rank,
            event.node_id,
        )
        return state.foreign_task(job, event, now=now)
    return TASK_TRANSITIONS[type(event)](job, event, now=now)


# Every lifecycle event advances its job's status; nodes register, beat (core NATS, see heartbeat_intake) and are
# released.
EVENT_HANDLERS: HandlerTable[Monitor] = {
    JobSubmitted: submitted,
    JobPlaced: placed,
    TaskPreparing: task_changed,
    TaskStarted: task_changed,
    TaskExited: task_changed,
    TaskHung: task_changed,
    TaskResumed: task_changed,
    JobTerminateRequested: terminate,
    JobMigrateRequested: migrate,
    JobUnplaceable: unplaceable,
    NodeTasksLost: tasks_lost,
    NodeRegistered: Monitor.registered,
    NodeHeartbeat: Monitor.heartbeat,
    NodeProvisioned: provisioned,
    NodeReleased: released,
}

router = NatsRouter()


# Each job's events one at a time in stream order, different jobs concurrently (`in_order`); a restart first waits
# for what a dead predecessor held (`shared.keyed.resume` in the app's setup), so nothing later overtakes it. Nothing
# is sent back to the stream from inside that order: an exit heard before its task's start is kept on the task
# (`state.task_exited`).
JOBS = keyed_durable("tm.job.>", consumer="monitor-jobs", event=JobEvent, handles=EVENT_HANDLERS)


@router.subscriber(**JOBS.subscription)
@JOBS.in_order()
async def on_job_event(event: JobEvent, message: NatsMessage, monitor: Monitor = Context("monitor")) -> None:
    """Every lifecycle event of every job, each job's in stream order."""
    await dispatch(EVENT_HANDLERS, event, monitor)


@router.subscriber(**durable("tm.node.evt.>", consumer="monitor-nodes", batch=64, ordered=False))
@retry_transient
async def on_node_event(event: NodeEvent, message: NatsMessage, monitor: Monitor = Context("monitor")) -> None:
    """Registrations and releases (heartbeats are core NATS, never stored: see heartbeat_intake); a registration is
    timed by when the bus server stored it, not by the node's clock."""
    if isinstance(event, NodeRegistered) and (stored := stored_at(message)) is not None:
        event = event.model_copy(update={"occurred_at": stored})
    await dispatch(EVENT_HANDLERS, event, monitor)


def heartbeat_intake(
    monitor: Monitor, *, clock: Callable[[], float] = time.monotonic
) -> Callable[[Msg], Awaitable[None]]:
    """The core NATS callback for heartbeats: decode (a payload must name the node of its subject), hand over; a
    bad one is logged and dropped, a failed write retried by the node's next heartbeat.

    A heartbeat is read only when it is small enough and comes at least a quarter of the cadence after the node's
    last one read: heartbeats have no stream and no limit of their own, and one agent sending megabytes as fast as
    it could kept the intake's queue from ever emptying (no node was then ever found lost, and once the queue was
    full every node's heartbeats were dropped: all found lost when it stopped), each changed boot id a node loss
    (found by review). What is dropped is the node's own extra: its next beat in time is read."""
    last: dict[str, float] = {}

    async def on_heartbeat(msg: Msg) -> None:
        if len(msg.data) > MAX_HEARTBEAT_BYTES:
            log.warning("dropped a heartbeat on %s: %d bytes", msg.subject, len(msg.data))
            return
        now = clock()
        if now - last.get(msg.subject, -math.inf) < monitor.cadence.interval_s * MIN_BEAT_GAP:
            return
        if len(last) >= MAX_NODES_HEARD:  # only agents' own subjects reach here: a bound, not an expected size
            last.clear()
        last[msg.subject] = now
        try:
            event = NodeHeartbeat.model_validate_json(msg.data)
        except ValueError as exc:
            log.warning("dropped a heartbeat on %s: %s", msg.subject, str(exc).splitlines()[0])
            return
        if event.subject != msg.subject:
            log.warning("dropped a heartbeat of %s: it arrived on %s", event.node_id, msg.subject)
            return
        try:
            await dispatch(EVENT_HANDLERS, event, monitor)
        except TRANSIENT_ERRORS as exc:
            log.warning("heartbeat of %s not recorded (the next one will be): %r", event.node_id, exc)

    return on_heartbeat


@router.subscriber(RPC_NODES)
async def list_nodes(query: dict, monitor: Monitor = Context("monitor")) -> dict:
    """One page of the nodes the fleet has seen, by id, with their liveness: from memory, no database read."""
    offset, limit = _bounded(query, "offset", 0, 10**9), _bounded(query, "limit", NODES_PAGE_MAX, NODES_PAGE_MAX)
    total, page = monitor.fleet.page(offset=offset, limit=limit)
    return {"total": total, "offset": offset, "items": [n.model_dump(mode="json") for n in page]}


def _bounded(query: dict, name: str, default: int, most: int) -> int:
    value = query.get(name, default) if isinstance(query, dict) else default
    return min(max(value, 0), most) if isinstance(value, int) and not isinstance(value, bool) else default


@router.subscriber(RPC_TERMINATE)
async def terminate_now(
    request: JobTerminateRequested, monitor: Monitor = Context("monitor")
) -> JobStatusChanged | None:
    """Terminate synchronously so the API can answer with the new phase; None for a job not known here yet (its
    termination then kept for its submission)."""
    now = utcnow()
    return await monitor.snapshot(request.job_id, now=now) if await terminated(monitor, request, now=now) else None


@router.subscriber(RPC_MIGRATE)
async def migrate_now(request: JobMigrateRequested, monitor: Monitor = Context("monitor")) -> JobStatusChanged | None:
    """Start a migration synchronously so the API can answer with the job's state."""
    now = utcnow()
    await monitor.apply(
        request.job_id,
        lambda job: None if job is None else state.migrate(job, cause=request.cause, attempt=request.attempt, now=now),
    )
    return await monitor.snapshot(request.job_id, now=now)
