"""Billing subscribers: task starts and ends, the fleet's nodes, usage, quota and admission questions."""
from typing import Annotated

from faststream import Context
from faststream.nats import NatsRouter
from pydantic import Field

from shared.bus import RPC_ADMIT, RPC_QUOTAS, RPC_USAGE, durable, retry_transient
from shared.events import NodeEvent, NodeProvisioned, NodeRegistered, NodeReleased, NodeStateChanged, TaskExited, \
    TaskStarted
from shared.rpc import AdmitQuery, AdmitReply, QuotasReply, QuotasRequest, UsageQuery, UsageReport
from services.billing.service import Billing

router = NatsRouter()

TaskEvent = Annotated[TaskStarted | TaskExited, Field(discriminator="type")]


@router.subscriber(**durable("tm.job.task.>", consumer="billing-tasks"))
@retry_transient
async def on_task_event(event: TaskEvent, billing: Billing = Context("billing")) -> None:
    """Open a ledger line when a task starts, close it when it ends."""
    match event:
        case TaskStarted():
            await billing.started(event)
        case TaskExited():
            await billing.exited(event)


@router.subscriber(**durable("tm.node.evt.>", consumer="billing-fleet"))
@retry_transient
async def on_node_event(event: NodeEvent, billing: Billing = Context("billing")) -> None:
    """Node lifetimes in stream order: provisioned/registered open one, released/lost close it (heartbeats: no)."""
    match event:
        case NodeStateChanged():
            await billing.node_state(event)
        case NodeRegistered():
            await billing.registered(event)
        case NodeProvisioned():
            await billing.provisioned(event)
        case NodeReleased():
            await billing.released(event)


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
