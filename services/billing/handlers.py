"""Billing subscribers: task starts and ends, lost nodes, usage questions."""
from faststream import Context
from faststream.nats import NatsRouter
from typing import Annotated

from pydantic import Field

from shared.bus import RPC_USAGE, durable, retry_transient
from shared.events import NodeStateChanged, TaskExited, TaskStarted
from shared.rpc import UsageQuery, UsageReport
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


@router.subscriber(**durable("tm.node.evt.state", consumer="billing-nodes"))
@retry_transient
async def on_node_state(event: NodeStateChanged, billing: Billing = Context("billing")) -> None:
    """A lost node's attempts are charged up to its last heartbeat."""
    await billing.node_state(event)


@router.subscriber(RPC_USAGE)
async def usage(query: UsageQuery, billing: Billing = Context("billing")) -> UsageReport:
    """Usage totals for a project (or all), by user and by node kind."""
    return await billing.usage(query)
