"""Estimator subscribers: which jobs exist and declare metrics, and their output."""
from faststream import Context
from faststream.nats import NatsRouter

from shared.bus import RPC_METRICS, RPC_PREDICT, durable, retry_transient
from shared.events import JobEvent, JobStatusChanged, JobSubmitted, LogChunk, TaskStarted
from shared.rpc import MetricsQuery, MetricsReport, PredictQuery, PredictReply
from services.estimator.service import Estimator

router = NatsRouter()


@router.subscriber(**durable("tm.job.>", consumer="estimator-jobs"))
@retry_transient
async def on_job_event(event: JobEvent, estimator: Estimator = Context("estimator")) -> None:
    """Learn each job's metrics; stop estimating once it has finished."""
    match event:
        case JobSubmitted():
            await estimator.submitted(event)
        case JobStatusChanged():
            await estimator.status_changed(event)
        case TaskStarted():
            await estimator.task_started(event)


@router.subscriber(**durable("tm.log.>", consumer="estimator-logs", batch=64))
@retry_transient
async def on_log_chunk(chunk: LogChunk, estimator: Estimator = Context("estimator")) -> None:
    """Parse metric points out of the output and refresh the estimate."""
    await estimator.log_chunk(chunk)


@router.subscriber(RPC_METRICS)
async def metrics(query: MetricsQuery, estimator: Estimator = Context("estimator")) -> MetricsReport:
    """A job's metric curves."""
    return await estimator.metrics(query)


@router.subscriber(RPC_PREDICT)
async def predict(query: PredictQuery, estimator: Estimator = Context("estimator")) -> PredictReply:
    """Duration of a job on given hardware before it starts (placement and billing ask)."""
    return estimator.predict(query)
