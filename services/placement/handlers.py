"""Placement subscribers: jobs to queue, status changes that free capacity, nodes joining and leaving."""

from datetime import datetime, timedelta

from faststream.nats import NatsRouter

from shared.bus import NODE_REGISTERED, RPC_CANDIDATES, RPC_CATALOGUE, durable, retry_transient
from shared.context import Context, NatsMessage
from shared.events import (
    PLACEMENT_STATUSES,
    EtaEstimated,
    JobDeleted,
    JobEvent,
    JobStatusChanged,
    JobSubmitted,
    NodeInterrupted,
    NodeRegistered,
    NodeStateChanged,
)
from shared.handlers import HandlerTable, dispatch
from shared.jsmeta import stored_at
from shared.keyed import keyed_durable
from shared.rpc import CandidatesQuery, CandidatesReply, Catalogue
from services.placement.providers.reconcile import node_interrupted
from services.placement.service import Placement

# How far before the bus server stored a submission its submitter's clock may say it was made: a replica whose
# clock runs behind would otherwise make every job it accepts look that much older, and a job that looks as if it
# waited long enough rents at once (`policy.options.waited_s`).
SUBMISSION_SKEW = timedelta(seconds=60)


def bounded_submission(event: JobEvent, stored: datetime | None) -> JobEvent:
    """A submission whose `create_time` is at most `SUBMISSION_SKEW` before the server stored it (the server's
    clock, not the submitter's word); any other event as it is. A submission the outbox published late (a bus
    outage) counts less waiting than it did: it waits longer for owned GPUs, never rents sooner."""
    if not isinstance(event, JobSubmitted) or stored is None or event.create_time >= stored - SUBMISSION_SKEW:
        return event
    return event.model_copy(update={"create_time": stored - SUBMISSION_SKEW})


async def deleted(placement: Placement, event: JobDeleted) -> None:
    """A deleted job leaves the queue."""
    await placement.deleted(event.job_id)


async def node_registered(placement: Placement, event: NodeRegistered) -> None:
    """A node joined (or its agent restarted): what it claims, capped to its record."""
    await placement.node_registered(event.node)


async def node_state(placement: Placement, event: NodeStateChanged) -> None:
    """The monitor's liveness verdict: lost nodes get no work."""
    await placement.node_seen(None, event.node_id, event.state)


async def interrupted(placement: Placement, event: NodeInterrupted) -> None:
    """A spot node's notice: no more work there, and it is given back (its agent is stopping its tasks)."""
    if await node_interrupted(placement.fleet, event.node_id):
        placement.dirty.set()


# Queue submitted jobs; release capacity when a job ends or loses its nodes; compare each running job's estimate
# with what its owner expects.
EVENT_HANDLERS: HandlerTable[Placement] = {
    JobSubmitted: Placement.submitted,
    JobStatusChanged: Placement.status_changed,
    JobDeleted: deleted,
    NodeRegistered: node_registered,
    NodeStateChanged: node_state,
    NodeInterrupted: interrupted,
    EtaEstimated: Placement.estimated,
}

router = NatsRouter()


JOBS = keyed_durable(
    "tm.job.>",
    consumer="placement-jobs",
    event=JobEvent,
    handles=EVENT_HANDLERS,
    narrowed={JobStatusChanged: PLACEMENT_STATUSES},  # what frees, holds, requeues or starts a queued job
)


@router.subscriber(**JOBS.subscription)
@JOBS.in_order()
async def on_job_event(event: JobEvent, message: NatsMessage, placement: Placement = Context("placement")) -> None:
    """Jobs submitted, changing status and deleted: each job's in stream order, different jobs concurrently."""
    await dispatch(EVENT_HANDLERS, bounded_submission(event, stored_at(message)), placement)


@router.subscriber(**durable(NODE_REGISTERED, consumer="placement-node-registrations"))
@retry_transient
async def on_node_registered(event: NodeRegistered, placement: Placement = Context("placement")) -> None:
    """Nodes joining."""
    await dispatch(EVENT_HANDLERS, event, placement)


@router.subscriber(**durable("tm.node.evt.state", consumer="placement-nodes-state"))
@retry_transient
async def on_node_state(event: NodeStateChanged, placement: Placement = Context("placement")) -> None:
    """The monitor's verdicts on nodes."""
    await dispatch(EVENT_HANDLERS, event, placement)


@router.subscriber(**durable("tm.node.evt.*.interrupted", consumer="placement-node-interruptions"))
@retry_transient
async def on_node_interrupted(
    event: NodeInterrupted, message: NatsMessage, placement: Placement = Context("placement")
) -> None:
    """Spot nodes' notices; an agent speaks for its own node only."""
    if event.subject == message.raw_message.subject:
        await dispatch(EVENT_HANDLERS, event, placement)


@router.subscriber(**durable("tm.eta.>", consumer="placement-eta", ordered=False))
@retry_transient
async def on_estimate(event: EtaEstimated, placement: Placement = Context("placement")) -> None:
    """Running jobs' estimates."""
    await dispatch(EVENT_HANDLERS, event, placement)


@router.subscriber(RPC_CANDIDATES)
async def dry_run(query: CandidatesQuery, placement: Placement = Context("placement")) -> CandidatesReply:
    """Where a job could run, how long and at what cost; nothing is created."""
    return await placement.dry_run(query)


@router.subscriber(RPC_CATALOGUE)
async def flavors_and_pools(_: dict, placement: Placement = Context("placement")) -> Catalogue:
    """The flavors a job may name and the pools of nodes."""
    return placement.catalogue()
