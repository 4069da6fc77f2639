"""Billing subscribers: jobs, placements, task starts and ends, the fleet's nodes, usage, quota and admission."""

from collections.abc import Awaitable, Callable
from operator import attrgetter
from typing import Any

from faststream.nats import NatsRouter

from shared.bus import RPC_ADMIT, RPC_QUOTAS, RPC_USAGE, durable, retry_transient
from shared.context import Context, NatsMessage
from shared.events import (
    ATTEMPT_END_STATUSES,
    JobEvent,
    JobPlaced,
    JobStatusChanged,
    JobSubmitted,
    NodeEvent,
    NodeProvisioned,
    NodeRegistered,
    NodeReleased,
    NodeStateChanged,
    TaskExited,
    TaskStarted,
)
from shared.handlers import Handler, HandlerTable, dispatch
from shared.jsmeta import stored_at
from shared.keyed import keyed_durable
from shared.rpc import AdmitQuery, AdmitReply, QuotasReply, QuotasRequest, UsageQuery, UsageReport
from services.billing.attempts import Attempts
from services.billing.lifetimes import Lifetimes
from services.billing.service import Billing

Part = Callable[[Billing], Any]


def to(part: Part, method: Callable[..., Awaitable[Any]]) -> Handler[Billing]:
    """A handler that hands the event (and its keywords) to one part of billing."""

    async def handle(billing: Billing, event: Any, **kwargs: Any) -> Any:
        return await method(part(billing), event, **kwargs)

    return handle


def each(*handlers: Handler[Billing]) -> Handler[Billing]:
    """A handler that hands the event to several, one after the other."""

    async def handle(billing: Billing, event: Any) -> None:
        for handler in handlers:
            await handler(billing, event)

    return handle


ATTEMPTS: Part = attrgetter("attempts")
LIFETIMES: Part = attrgetter("lifetimes")

# Attempts: learn whose job it is and where each attempt runs; open a ledger line when a task starts, close it when
# it ends; keep how the job's attempts ended (reconciliation closes what an end report never closed). Lifetimes:
# provisioned/registered open a node's, released/lost close it (heartbeats: no); a lost node's attempts end first.
EVENT_HANDLERS: HandlerTable[Billing] = {
    JobSubmitted: to(ATTEMPTS, Attempts.submitted),
    JobPlaced: to(ATTEMPTS, Attempts.placed),
    TaskStarted: to(ATTEMPTS, Attempts.started),
    TaskExited: to(ATTEMPTS, Attempts.exited),
    JobStatusChanged: to(ATTEMPTS, Attempts.job_status),
    NodeStateChanged: each(to(ATTEMPTS, Attempts.node_state), to(LIFETIMES, Lifetimes.node_state)),
    NodeRegistered: to(LIFETIMES, Lifetimes.registered),
    NodeProvisioned: to(LIFETIMES, Lifetimes.provisioned),
    NodeReleased: to(LIFETIMES, Lifetimes.released),
}

router = NatsRouter()


# The whole jobs stream, each job's in its order (different jobs concurrently): a placement is seen before the task
# events of its attempt (those that come first anyway wait for it), and a task event counts only from the node its
# rank was placed on.
JOBS = keyed_durable(
    "tm.job.>",
    consumer="billing-jobs",
    event=JobEvent,
    handles=EVENT_HANDLERS,
    narrowed={JobStatusChanged: ATTEMPT_END_STATUSES},  # the statuses that end an attempt
)


@router.subscriber(**JOBS.subscription)
@JOBS.in_order()
async def on_job_event(event: JobEvent, message: NatsMessage, billing: Billing = Context("billing")) -> None:
    """Jobs, placements and task starts and ends, each job's in stream order; a task's start and end are timed by
    when the bus server stored them, never by the times an agent's report states."""
    if isinstance(event, TaskStarted | TaskExited):
        timed: Callable[..., Awaitable[Any]] = EVENT_HANDLERS[type(event)]
        await timed(billing, event, seen=stored_at(message))
        return
    await dispatch(EVENT_HANDLERS, event, billing)


@router.subscriber(**durable("tm.node.evt.>", consumer="billing-fleet"))
@retry_transient
async def on_node_event(event: NodeEvent, message: NatsMessage, billing: Billing = Context("billing")) -> None:
    """Node lifetimes, in stream order; a registration is timed by when the bus server stored it, never by the
    time its agent states."""
    if isinstance(event, NodeRegistered):
        await billing.lifetimes.registered(event, seen=stored_at(message))
        return
    await dispatch(EVENT_HANDLERS, event, billing)


@router.subscriber(RPC_USAGE)
async def usage(query: UsageQuery, billing: Billing = Context("billing")) -> UsageReport:
    """Usage and spend of a project (or all), grouped as asked."""
    return await billing.reports.usage(query)


@router.subscriber(RPC_ADMIT)
async def admit(query: AdmitQuery, billing: Billing = Context("billing")) -> AdmitReply:
    """May this project and user take on this job or this paid node?"""
    return await billing.admission.admit(query)


@router.subscriber(RPC_QUOTAS)
async def quotas(request: QuotasRequest, billing: Billing = Context("billing")) -> QuotasReply:
    """Read or change a project's quotas and budgets."""
    return await billing.admission.set_quotas(request)
