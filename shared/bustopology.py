"""The bus as the platform declares it, with the operator's credentials, before any service starts: every stream and
every service's durable consumer, with the exact config its handlers read it with.

A service only binds to what is declared here (`bound`): its credentials may read its own consumers, never create
or change one, nor a stream (`shared.busroles`). A consumer's config travels in the body of the create request,
where no permission reaches: whoever may create a consumer may make it push a stream onto any subject of the
account, or read a filter the request's subject does not name.
"""

import asyncio
import functools
import logging
import time
from typing import Any

from faststream.nats import NatsBroker
from nats.js.api import ConsumerConfig, ConsumerInfo
from nats.js.errors import APIError, NotFoundError
from nats.js.manager import JetStreamManager

from shared.bus import (
    BUS_AWAY,
    DECLARE_PATIENCE_S,
    LEASES,
    LOG_STREAM_MAX_BYTES,
    NODE_COMMANDS,
    NODE_REGISTERED,
    STREAMS,
    agent_consumer,
    agent_consumer_config,
    connect,
    consumer_config,
    created_config,
    durable,
    filters_of,
    patiently,
    rented_consumer_config,
    stream_of,
    until,
)
from shared.buscreds import NAME
from shared.events import ALL_STATUSES, ATTEMPT_END_STATUSES, FINISHED_STATUSES, PLACEMENT_STATUSES
from shared.keyed import JOBS_IN_FLIGHT
from shared.origin import placements_consumer

log = logging.getLogger(__name__)
BIND_PATIENCE_S = 120.0  # a process started before the operator declared the bus waits this long, then exits
# nats-server's "consumer create" error (JSConsumerCreateErrF), with which it also refuses an update of a setting no
# update may change ("deliver policy can not be updated", "can not update push consumer to pull based"); it wraps
# other failures too (storage, a cluster's raft), so its text decides (`cannot_update`)
CONSUMER_CREATE_ERR = 10012


def jobs(consumer: str, *only: str) -> dict[str, Any]:
    """A state machine's jobs consumer (`shared.keyed.keyed_durable`): delivered only the subjects of the events
    its handler table names."""
    return durable("tm.job.>", consumer=consumer, keyed=JOBS_IN_FLIGHT, only=tuple(sorted(only)))


# role: the `durable(...)` arguments of every consumer it reads, as its handlers subscribe them (tests/unit/
# test_bus_roles.py compares each with the service's own subscriber, config for config). A new consumer, or a
# handler table that handles another event, goes here too: the operator's next declaration makes it.
CONSUMERS: dict[str, tuple[dict[str, Any], ...]] = {
    "submitter": (
        durable("tm.job.status.>", consumer="submitter-status", batch=64, ordered=False, only=ALL_STATUSES),
        durable("tm.log.>", consumer="submitter-logs", batch=64, ordered=False),
        placements_consumer("submitter-placed"),
        durable("tm.eta.>", consumer="submitter-eta", batch=64, ordered=False),
        durable("tm.notify.>", consumer="submitter-notify", ordered=False),
    ),
    "placement": (
        jobs("placement-jobs", "tm.job.deleted", *PLACEMENT_STATUSES, "tm.job.submitted"),
        durable(NODE_REGISTERED, consumer="placement-node-registrations"),
        durable("tm.node.evt.state", consumer="placement-nodes-state"),
        durable("tm.eta.>", consumer="placement-eta", ordered=False),
        durable("tm.node.evt.*.interrupted", consumer="placement-node-interruptions"),
    ),
    "monitor": (
        jobs(
            "monitor-jobs",
            "tm.job.migrate",
            "tm.job.node_lost",
            "tm.job.placed",
            "tm.job.submitted",
            "tm.job.task.*.exited",
            "tm.job.task.*.hung",
            "tm.job.task.*.preparing",
            "tm.job.task.*.resumed",
            "tm.job.task.*.started",
            "tm.job.terminate",
            "tm.job.unplaceable",
        ),
        durable("tm.node.evt.>", consumer="monitor-nodes", batch=64, ordered=False),
    ),
    "estimator": (
        jobs(
            "estimator-jobs",
            "tm.job.deleted",
            "tm.job.placed",
            *FINISHED_STATUSES,
            "tm.job.submitted",
            "tm.job.task.*.started",
        ),
        durable("tm.log.>", consumer="estimator-logs", batch=64),
        placements_consumer("estimator-placed"),
        durable("tm.telemetry.>", consumer="estimator-telemetry", batch=64, ordered=False),
    ),
    "billing": (
        jobs(
            "billing-jobs",
            "tm.job.placed",
            *ATTEMPT_END_STATUSES,
            "tm.job.submitted",
            "tm.job.task.*.exited",
            "tm.job.task.*.started",
        ),
        durable("tm.node.evt.>", consumer="billing-fleet"),
    ),
}


async def declare(
    broker: NatsBroker,
    *,
    node_ids: list[str],
    replicas: int = 1,
    log_max_bytes: int = LOG_STREAM_MAX_BYTES,
    shrink: bool = False,
    prune: bool = False,
    patience_s: float = DECLARE_PATIENCE_S,
) -> None:
    """As the operator: every stream (`replicas` copies each, the lease bucket included), every service's consumer
    and each static node's command consumer, created or brought to today's config (a deploy that changes a
    handler table changes its consumer's filter here, and nowhere else); a consumer that has no place on the bus is
    deleted (`unwanted`; `prune`: any it does not declare), a rented node's made to expire once unread.
    `patience_s`: how long it waits, in all, for a bus that is away."""
    deadline = time.monotonic() + patience_s
    await connect(
        broker,
        declare=True,
        replicas=replicas,
        leases=True,
        log_max_bytes=log_max_bytes,
        shrink=shrink,
        patience_s=patience_s,
    )
    streams = broker.config.connection_state.stream
    wanted = [(stream_of(s["subject"]).name, consumer_config(s)) for role in CONSUMERS.values() for s in role]
    wanted += [(NODE_COMMANDS.name, agent_consumer_config(node_id)) for node_id in node_ids]
    names = {(stream, config.name) for stream, config in wanted}
    for stream in (*STREAMS, LEASES):
        existing = functools.partial(listed, streams, stream.name)
        for info in await patiently(f"listing {stream.name}'s consumers", existing, patience_s=until(deadline)):
            await tidy(streams, stream.name, info.config, declared=names, prune=prune, deadline=deadline)
    for stream_name, config in wanted:
        create = functools.partial(streams.add_consumer, stream_name, config=config)
        await patiently(f"declaring consumer {config.name}", create, patience_s=until(deadline))


async def listed(streams: JetStreamManager, stream: str) -> list[ConsumerInfo]:
    """Every consumer of a stream, page after page."""
    found: list[ConsumerInfo] = []
    while page := await streams.consumers_info(stream, offset=len(found)):
        found += page
    return found


def rented(stream: str, config: ConsumerConfig) -> bool:
    """Whether a consumer is a pull consumer of one node's commands exactly as placement makes it for a rented
    node (with its expiry or without: made before they expired)."""
    node_id = agents_node(stream, config.name)
    return node_id is not None and not config.deliver_subject and filters_of(config) == [agent_consumer(node_id)[1]]


def agents_node(stream: str, name: str | None) -> str | None:
    """The node whose agent may read a consumer of this name (`agent-<node>` of TM_NODE_CMD), if any."""
    node_id = (name or "").removeprefix("agent-")
    is_agents = stream == NODE_COMMANDS.name and name == f"agent-{node_id}" and NAME.match(node_id) is not None
    return node_id if is_agents else None


def unwanted(
    stream: str, config: ConsumerConfig, *, declared: set[tuple[str, str | None]], prune: bool = False
) -> str | None:
    """Why an existing consumer has no place on the bus (None: it stays). A push consumer never has one, even under
    a declared name: it publishes a stream onto any subject with the server's authority. A pull consumer has one
    when declared, or a rented node's as placement makes it; under a name an agent may read (`agent-<node>`), any
    other goes, whatever it reads. Any other pull consumer no identity but the operator may read (services and
    agents read only their own names) is harmless: a newer version's (a rollback's declaration), an operator's. It
    goes only when pruning (`identities prepare --prune`); it was made by someone else (under the credentials of an
    earlier version every service could make any consumer)."""
    if config.deliver_subject:
        return f"it pushes onto {config.deliver_subject}"
    if (stream, config.name) in declared or rented(stream, config):
        return None
    if agents_node(stream, config.name) is not None:
        return "its agent may read it, and it is no rented node's consumer as placement makes it"
    return "the platform does not declare it (pruning)" if prune else None


def cannot_update(exc: APIError) -> bool:
    """Whether the server refused a consumer's update for a setting no update may change, not for a passing
    trouble (a cluster changing leaders answers 500 too)."""
    text = (exc.description or "").lower()
    return exc.err_code == CONSUMER_CREATE_ERR and ("can not be updated" in text or "can not update" in text)


async def tidy(
    streams: JetStreamManager,
    stream: str,
    config: ConsumerConfig,
    *,
    declared: set[tuple[str, str | None]],
    prune: bool = False,
    deadline: float,
) -> None:
    """Delete an existing consumer that is `unwanted`; give a rented node's its expiry (one whose config no update
    can bring to a rented node's is deleted too; any other refusal fails the declaration, to be run again)."""
    name, reason = config.name or "", unwanted(stream, config, declared=declared, prune=prune)
    mine = (stream, name) in declared
    if reason is None and not mine and rented(stream, config) and not config.inactive_threshold:
        reason = await expire(streams, stream, name, deadline=deadline)
    if reason is None and not mine and not rented(stream, config):
        log.warning(
            "keeping consumer %s of %s: the platform does not declare it, and only the operator may read it (a newer "
            "version's, an operator's); `python -m services.stack.identities prepare --prune` deletes it",
            name,
            stream,
        )
    if reason is not None:
        log.warning("deleting consumer %s of %s: %s", name, stream, reason)
        delete = functools.partial(streams.delete_consumer, stream, name)
        await patiently(f"deleting consumer {name}", delete, patience_s=until(deadline))


async def expire(streams: JetStreamManager, stream: str, name: str, *, deadline: float) -> str | None:
    """Give a rented node's consumer made before they expired its expiry; why it has to go when no update can."""
    config = rented_consumer_config(name.removeprefix("agent-"))
    try:
        update = functools.partial(streams.add_consumer, stream, config=config)
        await patiently(f"giving consumer {name} an expiry", update, patience_s=until(deadline))
    except APIError as exc:
        if not cannot_update(exc):
            log.error("consumer %s of %s kept, its expiry not given: %r (declare again)", name, stream, exc)
            raise
        return f"it is not a rented node's consumer as placement makes it ({exc.description})"
    return None


def durable_subscribers(broker: NatsBroker) -> dict[tuple[str, str], list[str]]:
    """(stream, consumer) -> the filter subjects this process reads it with, for each of its durable subscribers."""
    found = {}
    for subscriber in broker.subscribers:
        stream, config, subject = (getattr(subscriber, a, None) for a in ("stream", "config", "subject"))
        if stream is not None and config is not None and subject is not None and config.durable_name:
            created = created_config(config, name=config.durable_name, subject=subject.broker_address)
            found[(stream.name, config.durable_name)] = filters_of(created)
    return found


async def bound(broker: NatsBroker, *, leases: bool = False, patience_s: float = BIND_PATIENCE_S) -> None:
    """Before a process's subscribers start: wait until every consumer they read (and the lease bucket, `leases`)
    is declared, saying what is missing while it waits; after `patience_s`, raise (the supervisor starts the
    process again). A consumer declared with other filters than this version reads is missing too: it was declared
    for another version (the deploy declares the bus again, or replaces this process)."""
    streams, deadline = broker.config.connection_state.stream, time.monotonic() + patience_s
    readers = durable_subscribers(broker)
    while True:
        missing = []
        for (stream, consumer), only in readers.items():
            try:
                info = await streams.consumer_info(stream, consumer)
            except NotFoundError:
                missing.append(f"consumer {consumer} of {stream}")
                continue
            except BUS_AWAY:
                missing.append(f"consumer {consumer} of {stream} (the bus did not answer)")
                continue
            declared = filters_of(info.config)
            if declared != only:  # another version's: reading it, this one would take events it cannot handle
                missing.append(f"consumer {consumer} of {stream} as this version reads it ({only}; not {declared})")
        if leases:
            try:
                await streams.stream_info(LEASES.name)
            except (NotFoundError, *BUS_AWAY):
                missing.append(f"stream {LEASES.name}")
        if not missing:
            return
        problem = (
            f"the bus is not declared yet: {', '.join(missing)} missing (the operator declares it: `make run` at "
            f"start, compose's bus-prepare: `python -m services.stack.identities prepare`)"
        )
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{problem}; gave up after {patience_s:g} s")
        log.warning("%s; waiting", problem)
        await asyncio.sleep(2.0)
