"""Estimator subscribers: which jobs exist and declare metrics, and their output."""
from faststream import Context
from faststream.nats import NatsRouter

from shared.bus import RPC_METRICS, durable, retry_transient
from shared.events import JobEvent, JobStatusChanged, JobSubmitted, LogChunk
from shared.rpc import MetricsQuery, MetricsReport
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


@router.subscriber(**durable("tm.log.>", consumer="estimator-logs", batch=64))
@retry_transient
async def on_log_chunk(chunk: LogChunk, estimator: Estimator = Context("estimator")) -> None:
    """Parse metric points out of the output and refresh the estimate."""
    await estimator.log_chunk(chunk)


@router.subscriber(RPC_METRICS)
async def metrics(query: MetricsQuery, estimator: Estimator = Context("estimator")) -> MetricsReport:
    """A job's metric curves."""
    return await estimator.metrics(query)
