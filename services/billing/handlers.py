"""Billing subscribers: jobs, placements, task starts and ends, the fleet's nodes, usage, quota and admission."""
from faststream import Context
from faststream.nats import NatsMessage, NatsRouter

from shared.bus import RPC_ADMIT, RPC_QUOTAS, RPC_USAGE, durable, retry_transient
from shared.events import JobEvent, JobPlaced, JobStatusChanged, JobSubmitted, NodeEvent, NodeProvisioned, \
    NodeRegistered, NodeReleased, NodeStateChanged, TaskExited, TaskStarted
from shared.handlers import HandlerTable, dispatch
from shared.keyed import keyed_durable, stored_at
from shared.rpc import AdmitQuery, AdmitReply, QuotasReply, QuotasRequest, UsageQuery, UsageReport
from services.billing.service import Billing

# Learn whose job it is and where each attempt runs; open a ledger line when a task starts, close it when it ends;
# keep how the job's attempts ended (reconciliation closes what an end report never closed). Node lifetimes:
# provisioned/registered open one, released/lost close it (heartbeats: no).
EVENT_HANDLERS: HandlerTable[Billing] = {
    JobSubmitted: Billing.submitted,
    JobPlaced: Billing.placed,
    TaskStarted: Billing.started,
    TaskExited: Billing.exited,
    JobStatusChanged: Billing.job_status,
    NodeStateChanged: Billing.node_state,
    NodeRegistered: Billing.registered,
    NodeProvisioned: Billing.provisioned,
    NodeReleased: Billing.released,
}

router = NatsRouter()


# The whole jobs stream, each job's in its order (different jobs concurrently): a placement is seen before the task
# events of its attempt (those that come first anyway wait for it), and a task event counts only from the node its
# rank was placed on.
JOBS = keyed_durable("tm.job.>", consumer="billing-jobs", event=JobEvent)


@router.subscriber(**JOBS.subscription)
@JOBS.in_order()
async def on_job_event(event: JobEvent, message: NatsMessage, billing: Billing = Context("billing")) -> None:
    """Jobs, placements and task starts and ends, each job's in stream order; a task's start and end are timed by
    when the bus server stored them, never by the times an agent's report states."""
    if isinstance(event, TaskStarted | TaskExited):
        await EVENT_HANDLERS[type(event)](billing, event, seen=stored_at(message))
        return
    await dispatch(EVENT_HANDLERS, event, billing)


@router.subscriber(**durable("tm.node.evt.>", consumer="billing-fleet"))
@retry_transient
async def on_node_event(event: NodeEvent, billing: Billing = Context("billing")) -> None:
    """Node lifetimes, in stream order."""
    await dispatch(EVENT_HANDLERS, event, billing)


@router.subscriber(RPC_USAGE)
async def usage(query: UsageQuery, billing: Billing = Context("billing")) -> UsageReport:
    """Usage and spend of a project (or all), grouped as asked."""
    return await billing.usage(query)


@router.subscriber(RPC_ADMIT)
async def admit(query: AdmitQuery, billing: Billing = Context("billing")) -> AdmitReply:
    """May this project and user take on this job or this paid node?"""
    return await billing.admit(query)


@router.subscriber(RPC_QUOTAS)
async def quotas(request: QuotasRequest, billing: Billing = Context("billing")) -> QuotasReply:
    """Read or change a project's quotas and budgets."""
    return await billing.set_quotas(request)
