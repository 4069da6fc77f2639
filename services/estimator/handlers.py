"""Estimator subscribers: which jobs exist and declare metrics, and their output."""

from faststream.nats import NatsRouter

from shared.bus import RPC_METRICS, RPC_PREDICT, durable, retry_transient
from shared.context import Context, NatsMessage
from shared.events import (
    FINISHED_STATUSES,
    JobDeleted,
    JobEvent,
    JobPlaced,
    JobStatusChanged,
    JobSubmitted,
    LogChunk,
    TaskStarted,
    TaskTelemetry,
)
from shared.handlers import HandlerTable, dispatch
from shared.jsmeta import stored_at
from shared.keyed import keyed_durable
from shared.origin import deliveries, placements_consumer
from shared.rpc import MetricsQuery, MetricsReport, PredictQuery, PredictReply
from services.estimator.service import Estimator

# Learn each job's metrics, parse metric points out of its output and refresh the estimate; stop estimating once
# the job has finished, and forget it once it is deleted.
EVENT_HANDLERS: HandlerTable[Estimator] = {
    JobSubmitted: Estimator.submitted,
    TaskStarted: Estimator.task_started,
    JobStatusChanged: Estimator.status_changed,
    JobDeleted: Estimator.deleted,
    JobPlaced: Estimator.placed,
    LogChunk: Estimator.log_chunk,
    TaskTelemetry: Estimator.task_telemetry,
}

router = NatsRouter()


JOBS = keyed_durable(
    "tm.job.>",
    consumer="estimator-jobs",
    event=JobEvent,
    handles=EVENT_HANDLERS,
    narrowed={JobStatusChanged: FINISHED_STATUSES},  # a job's end: learnt from, tracked no more
)
# Placements, a batch at once (their records in one write), only to tell each chunk of output from its task's own
# node from anyone else's.
PLACED = placements_consumer("estimator-placed")


@router.subscriber(**JOBS.subscription)
@JOBS.in_order()
async def on_job_event(event: JobEvent, message: NatsMessage, estimator: Estimator = Context("estimator")) -> None:
    """Jobs' declared metrics, starts and ends: each job's in stream order, different jobs concurrently. A start
    is timed when the bus server stored it (the node's clock is a claim)."""
    if isinstance(event, TaskStarted) and (stored := stored_at(message)) is not None:
        event = event.model_copy(update={"started_at": stored})
    await dispatch(EVENT_HANDLERS, event, estimator)


@router.subscriber(**PLACED)
@retry_transient
async def on_placed(event: JobPlaced, estimator: Estimator = Context("estimator")) -> None:
    """Which node runs each rank of each attempt: its record, written with the others read at the same moment."""
    if estimator.origins is not None:
        await estimator.origins.placed(event)


# How long a chunk may have waited on its node (the bus away) with its lines' times kept as the node stated them.
LINE_AGE_S = 3600.0


@router.subscriber(**durable("tm.log.>", consumer="estimator-logs", batch=64))
@retry_transient
async def on_log_chunk(chunk: LogChunk, message: NatsMessage, estimator: Estimator = Context("estimator")) -> None:
    """Jobs' output, from the node each task was placed on (anything else is dropped)."""
    origins = estimator.origins  # None: no record to check the node against, so nothing is believed
    if origins is not None and await origins.admit(chunk, deliveries=deliveries(message)):
        if await origins.superseded(chunk):  # a node the job left: its late lines are the job's log, not its estimate
            return
        stored = stored_at(message)
        await dispatch(EVENT_HANDLERS, chunk if stored is None else timed_by(chunk, stored.timestamp()), estimator)


def timed_by(chunk: LogChunk, stored: float) -> LogChunk:
    """The chunk with each line's time (the node's clock: a claim) no later than when the bus stored it, and no
    earlier than `LINE_AGE_S` before: a node an attempt ran on put its lines in the future and moved the job's
    estimate (found by review); a chunk held back while the bus was away keeps its lines' order."""
    lines = [line.t for line in chunk.lines]
    if all(stored - LINE_AGE_S <= t <= stored for t in lines):
        return chunk
    return chunk.model_copy(
        update={
            "lines": tuple(
                line.model_copy(update={"t": min(max(line.t, stored - LINE_AGE_S), stored)}) for line in chunk.lines
            )
        }
    )


# Samples in any order (each stored by its own id, series sorted by time): a batch in flight, not one at a time.
@router.subscriber(**durable("tm.telemetry.>", consumer="estimator-telemetry", batch=64, ordered=False))
@retry_transient
async def on_telemetry(
    sample: TaskTelemetry, message: NatsMessage, estimator: Estimator = Context("estimator")
) -> None:
    """Running tasks' GPU samples, from the node each task was placed on (anything else is dropped), timed when
    the bus server stored them (the node's own clock is a claim)."""
    origins = estimator.origins  # None: no record to check the node against, so nothing is believed
    if origins is not None and await origins.admit(sample, deliveries=deliveries(message)):
        if await origins.superseded(sample):  # a node the job left: its readings would set its GPU memory peak
            return
        stored = stored_at(message)  # to the microsecond: samples sent in one burst keep their order
        timed = sample if stored is None else sample.model_copy(update={"t": stored.timestamp()})
        await dispatch(EVENT_HANDLERS, timed, estimator)


@router.subscriber(RPC_METRICS)
async def metrics(query: MetricsQuery, estimator: Estimator = Context("estimator")) -> MetricsReport:
    """A job's metric curves."""
    return await estimator.metrics(query)


@router.subscriber(RPC_PREDICT)
async def predict(query: PredictQuery, estimator: Estimator = Context("estimator")) -> PredictReply:
    """Duration of a job on given hardware before it starts (placement and billing ask)."""
    return estimator.predict(query)
