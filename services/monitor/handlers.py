"""Monitor subscribers: decode, hand to the service layer."""
import logging
from datetime import datetime

from faststream import Context
from faststream.nats import NatsRouter

from shared.bus import RPC_MIGRATE, RPC_NODES, RPC_TERMINATE, durable, retry_transient
from shared.clock import utcnow
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
    NodeRegistered,
    NodeReleased,
    NodeTasksLost,
    TaskExited,
    TaskPreparing,
    TaskStarted,
)
from services.monitor import state
from services.monitor.nodes import NodeRecord
from services.monitor.service import Monitor

router = NatsRouter()
log = logging.getLogger(__name__)

TaskEvent = TaskPreparing | TaskStarted | TaskExited
TASK_TRANSITIONS = {TaskPreparing: state.task_preparing, TaskStarted: state.task_started, TaskExited: state.task_exited}


@router.subscriber(**durable("tm.job.>", consumer="monitor-jobs"))
@retry_transient
async def on_job_event(event: JobEvent, monitor: Monitor = Context("monitor")) -> None:
    """Advance the job's status for every lifecycle event."""
    now = utcnow()
    match event:
        case JobSubmitted():
            await monitor.apply(event.job_id, lambda job: None if job else state.submitted(event, now=now))
        case JobPlaced():
            await monitor.apply(event.job_id, lambda job: job and state.placed(job, event, now=now))
        case TaskPreparing() | TaskStarted() | TaskExited():
            await monitor.apply(event.job_id, lambda job: _task_change(job, event, now=now))
        case JobTerminateRequested():
            await monitor.apply(
                event.job_id, lambda job: job and state.terminate(job, requested_by=event.requested_by, now=now)
            )
        case JobMigrateRequested():
            await monitor.apply(event.job_id, lambda job: job and state.migrate(
                job, cause=event.cause, attempt=event.attempt, now=now))
        case NodeTasksLost():
            await monitor.lose_tasks(event, at=now)
        case JobUnplaceable():
            await monitor.apply(event.job_id, lambda job: job and state.unplaceable(job, reason=event.reason, now=now))


def _task_change(job: state.JobState | None, event: TaskEvent, *, now: datetime) -> state.Outcome | None:
    """An agent's word on a task counts only from the node the task's attempt was placed on: log and drop the rest."""
    if job is None:
        log.warning("%s for unknown job %s from node %s dropped", event.type, event.job_id, event.node_id)
        return None
    if not state.from_placed_node(job, event):
        log.warning("%s of job %s attempt %d rank %d from node %s dropped: that attempt was not placed there",
                    event.type, event.job_id, event.attempt, event.rank, event.node_id)
        return state.foreign_task(job, event, now=now)
    return TASK_TRANSITIONS[type(event)](job, event, now=now)


@router.subscriber(**durable("tm.node.evt.>", consumer="monitor-nodes", batch=64, ordered=False))
@retry_transient
async def on_node_event(event: NodeEvent, monitor: Monitor = Context("monitor")) -> None:
    """Track liveness from registrations and heartbeats."""
    match event:
        case NodeRegistered():
            await monitor.sighted(event.node.node_id, boot_id=event.boot_id, at=event.occurred_at,
                                  info=event.node, running=())
        case NodeHeartbeat():
            await monitor.sighted(event.node_id, boot_id=event.boot_id, at=event.occurred_at,
                                  running=event.running, gpu_utilization=event.gpu_utilization)
        case NodeReleased():
            await monitor.released(event.node_id)


@router.subscriber(RPC_NODES)
async def list_nodes(_: dict, monitor: Monitor = Context("monitor")) -> list[dict]:
    """Every node the fleet has seen, with its liveness."""
    docs = [d async for d in monitor.nodes.collection.find({}).sort("_id", 1)]
    return [NodeRecord.model_validate(d).model_dump(mode="json") for d in docs]


@router.subscriber(RPC_TERMINATE)
async def terminate_now(request: JobTerminateRequested, monitor: Monitor = Context("monitor")) -> JobStatusChanged | None:
    """Terminate synchronously so the API can answer with the new phase; None for an unknown job."""
    now = utcnow()
    await monitor.apply(request.job_id,
                        lambda job: job and state.terminate(job, requested_by=request.requested_by, now=now))
    return await monitor.snapshot(request.job_id, now=now)


@router.subscriber(RPC_MIGRATE)
async def migrate_now(request: JobMigrateRequested, monitor: Monitor = Context("monitor")) -> JobStatusChanged | None:
    """Start a migration synchronously so the API can answer with the job's state."""
    now = utcnow()
    await monitor.apply(request.job_id, lambda job: job and state.migrate(
        job, cause=request.cause, attempt=request.attempt, now=now))
    return await monitor.snapshot(request.job_id, now=now)
