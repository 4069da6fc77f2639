"""The bus: JetStream streams, durable consumers, publishing with de-duplication, request/reply subjects."""

import asyncio
import functools
import hmac
import logging
import os
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from faststream.exceptions import NackMessage, RejectMessage
from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsCredentials, NatsSecurity, PullSub
from nats.errors import (
    ConnectionReconnectingError,
    Error as NatsError,
    NoRespondersError,
    StaleConnectionError,
    TimeoutError as NatsTimeoutError,
)
from nats.js.api import ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from nats.js.manager import JetStreamManager
from pymongo.errors import PyMongoError

from shared import natsheaders, pulls
from shared.buscreds import dedup_key
from shared.events import Message
from shared.replies import ReplyGuard
from shared.unknowntypes import hold_or_drop, unknown_type

log = logging.getLogger(__name__)

_DEDUP_KEYS: "weakref.WeakKeyDictionary[NatsBroker, bytes]" = weakref.WeakKeyDictionary()
ACK_WAIT_S = 10  # a message held by a process that died is redelivered after this long
# How long an idle consumer's pull request waits on the server for a message before the next is sent: a message that
# comes meanwhile is delivered at once, so a longer wait costs no latency, and each request is a message the server
# and the process handle (at 0.5 s, about two a second for every idle consumer of every process). A request lost with
# a bus server that died is sent again after this long. Not for a `max_workers` consumer, whose fetches gather a
# batch until their wait ends (`PULL_BATCH_WAIT_S`).
PULL_WAIT_S = 2.0
PULL_BATCH_WAIT_S = 0.5
DEDUP_WINDOW_S = 15 * 60  # longer than any outage a service recovers from by relaying its outbox
DECLARE_PATIENCE_S = 60.0  # a process starting while the bus restarts or elects its leaders keeps declaring this long
# What a JetStream API request meets while the server restarts or its streams' leaders are elected (not a refusal).
BUS_AWAY = (
    NatsTimeoutError,
    NoRespondersError,
    ServiceUnavailableError,
    ConnectionReconnectingError,
    StaleConnectionError,
)


def _stream(name: str, *subjects: str, **config: Any) -> JStream:
    """A stream trainmaster declares itself (FastStream would only declare the subjects it subscribes to)."""
    stream = JStream(name=name, storage=StorageType.FILE, declare=False, **config)
    stream.config.subjects = list(subjects)
    return stream


# Jobs and money: file storage; the server runs with `sync_interval: always`, so an ack means on disk. Job events
# are kept JOB_EVENTS_MAX_AGE_S: every service stores what it needs of them, and a consumer reads them within the ack
# wait; without a limit the stream grew by every event of every job for ever (~15 KB a job). A service down longer
# than this would miss what came meanwhile. Declared on an existing stream without a limit, it is applied (the
# server drops older events at once), not refused: it is no setting an operator chose.
JOB_EVENTS_MAX_AGE_S = 90 * 86400
JOBS = _stream("TM_JOBS", "tm.job.>", max_age=JOB_EVENTS_MAX_AGE_S, duplicate_window=DEDUP_WINDOW_S)
# Commands to agents: a day. A start carries the job's environment (its secrets among them): kept no longer than any
# reader needs it (an agent reads its commands within seconds, a rented node's first within its boot; a node silent
# past the node timeout is declared lost and its waiting starts purged, and one that comes back fences its old
# attempts). Without a limit, every start of every job was kept on the bus's disk for ever.
NODE_COMMANDS_MAX_AGE_S = 86400
NODE_COMMANDS = _stream(
    "TM_NODE_CMD", "tm.node.cmd.>", max_age=NODE_COMMANDS_MAX_AGE_S, duplicate_window=DEDUP_WINDOW_S
)
# Node events, heartbeats excepted: a service's verdicts (`tm.node.evt.<event>`) and an agent's own node events.
# An agent's new node event (5 tokens) must be added here (tests/unit/test_heartbeats.py checks); heartbeats are
# core NATS, never stored (HEARTBEATS).
NODES = _stream(
    "TM_NODES",
    "tm.node.evt.*",
    "tm.node.evt.*.registered",
    "tm.node.evt.*.interrupted",
    max_age=3600,
    duplicate_window=60,
)
# Output: a week, and at most LOG_STREAM_MAX_BYTES of it (the oldest goes first), whatever the tasks print.
LOG_STREAM_MAX_BYTES = 4 * 1024**3
LOGS = _stream("TM_LOGS", "tm.log.>", max_age=7 * 86400, max_bytes=LOG_STREAM_MAX_BYTES, duplicate_window=300)
ESTIMATES = _stream("TM_ETA", "tm.eta.>", max_age=7 * 86400, duplicate_window=300)
# GPU telemetry of running tasks (one message per task per heartbeat): a week, and at most this much of it.
TELEMETRY_STREAM_MAX_BYTES = 1024**3
TELEMETRY = _stream(
    "TM_TELEMETRY", "tm.telemetry.>", max_age=7 * 86400, max_bytes=TELEMETRY_STREAM_MAX_BYTES, duplicate_window=60
)
NOTIFICATIONS = _stream("TM_NOTIFY", "tm.notify.>", max_age=30 * 86400, duplicate_window=DEDUP_WINDOW_S)
STREAMS = (JOBS, NODE_COMMANDS, NODES, LOGS, ESTIMATES, NOTIFICATIONS, TELEMETRY)
# Leader leases of replicated services (shared/lease.py), in the key-value layout: one key per service, each value
# forgotten LEASE_TTL_S after it was written. Declared with the others only where leases are on.
LEASE_BUCKET = "tm_leaders"
LEASE_TTL_S = 12.0  # a lost NATS server can leave the bucket without a leader for 4.5-6.2 s (measured)
LEASES = _stream(
    f"KV_{LEASE_BUCKET}",
    f"$KV.{LEASE_BUCKET}.>",
    max_age=LEASE_TTL_S,
    max_msgs_per_subject=1,
    duplicate_window=1,
    deny_delete=True,
    allow_direct=True,
)

# Request/reply subjects live outside every stream so the stream never answers in the service's place.
RPC_HEALTH = "tm.rpc.health.{service}"
RPC_NODES = "tm.rpc.monitor.nodes"
RPC_USAGE = "tm.rpc.billing.usage"
RPC_TERMINATE = "tm.rpc.monitor.terminate"
RPC_MIGRATE = "tm.rpc.monitor.migrate"
RPC_METRICS = "tm.rpc.estimator.metrics"
RPC_PREDICT = "tm.rpc.estimator.predict"
RPC_ADMIT = "tm.rpc.billing.admit"
RPC_QUOTAS = "tm.rpc.billing.quotas"
RPC_CANDIDATES = "tm.rpc.placement.candidates"
RPC_CATALOGUE = "tm.rpc.placement.catalogue"
# A node's agent asks the submitter for the secrets of a task placed on it (on its own node's subject, answered
# only into its own node's space: `shared.jobsecrets`).
RPC_SECRETS = "tm.rpc.submitter.secrets.{node_id}"
SECRETS_INBOX = "_INBOX_secrets.{node_id}"
SERVICES = ("placement", "monitor", "estimator", "billing")

# What an agent publishes carries its node id, so the server can hold each agent to its own node's subjects.
NODE_EVENT = "tm.node.evt.{node_id}.{event}"  # registered, heartbeat
TASK_EVENT = "tm.job.task.{node_id}.{event}"  # preparing, started, exited
LOG_SUBJECT = "tm.log.{node_id}.{job_id}"
TELEMETRY_SUBJECT = "tm.telemetry.{node_id}.{job_id}"  # a running task's GPUs, once a heartbeat
NODE_REGISTERED = NODE_EVENT.format(node_id="*", event="registered")
HEARTBEATS = NODE_EVENT.format(node_id="*", event="heartbeat")  # core NATS: liveness is now or never
NODE_CADENCE = "tm.node.cadence"  # core NATS: the monitor announces the heartbeat interval to every agent
# Where an event of a type this version does not know is dropped, not given back for a newer replica: what an agent
# of any version may publish (its node's own subjects: its garbage must not hold a consumer back) and a node's
# commands (read by its agent alone, which no replica of a newer version replaces).
UNKNOWN_DROPPED = (
    *(t.format(node_id="*", event="*", job_id="*") for t in (NODE_EVENT, TASK_EVENT, LOG_SUBJECT, TELEMETRY_SUBJECT)),
    "tm.node.cmd.>",
)

TRANSIENT_ERRORS = (PyMongoError, NatsError, OSError, TimeoutError)


BUS_CLOSED_EXIT = 75  # EX_TEMPFAIL: a supervisor starts the process again, with the credentials it has then
# Set by a process's entry point (`shared.service.run`, the API's main): only a whole process exits when its bus is
# gone; a library user of a broker (a test, a tool) is left to see the close itself.
EXIT_WHEN_CLOSED = False


class BusLink:
    """When this process last lost or regained the bus: silence from others then means nothing. And what happens
    when the client gives the connection up for good while the process is not stopping (the server revoked its
    credentials, say: nats-py does not reconnect after "User Authentication Revoked"): the process exits, so that
    its supervisor (`make run`'s, a container's restart policy) starts it again, with the credentials it is given
    then; a process left up without its bus answers nothing and reads nothing."""

    def __init__(self) -> None:
        self.connected = True
        self.changed_at = time.monotonic()
        self.stopping = False  # set once the process stops on purpose: its own close is no loss

    async def closed(self) -> None:
        self.connected, self.changed_at = False, time.monotonic()
        if self.stopping or not EXIT_WHEN_CLOSED:
            return
        log.critical("the bus closed this process's connection for good (its credentials revoked?): exiting")
        logging.shutdown()
        os._exit(BUS_CLOSED_EXIT)

    def callbacks(self) -> dict[str, Any]:
        """The link as a NATS client's callbacks (nats-py's `connect` options)."""
        return {"disconnected_cb": self.disconnected, "reconnected_cb": self.reconnected, "closed_cb": self.closed}

    async def disconnected(self) -> None:
        self.connected, self.changed_at = False, time.monotonic()

    async def reconnected(self) -> None:
        self.connected, self.changed_at = True, time.monotonic()

    def steady_for(self) -> float:
        """Seconds the link has been up without interruption (0 while it is down)."""
        return time.monotonic() - self.changed_at if self.connected else 0.0


def servers(url: str) -> list[str]:
    """The servers of one NATS cluster, from a comma-separated URL list (a client fails over among them)."""
    return [u.strip() for u in url.split(",") if u.strip()]


def make_broker(
    url: str, *, name: str, link: BusLink | None = None, creds: Path | None = None, ca_file: Path | None = None
) -> NatsBroker:
    """A broker that reconnects forever: a restarted NATS server is waited for, not fatal.

    creds: this process's own `.creds` file (the server refuses anonymous clients); replies come back under its
    own inbox prefix `_INBOX_<name>`, the only one its credentials may subscribe to; it answers only into such
    inboxes (`replies.ReplyGuard`). ca_file: the CA that signed the server's certificate, for a `tls://` URL.
    """
    pulls.install()  # a fetch hands over a message as soon as it comes (`shared/pulls.py`)
    natsheaders.install()  # a delivery's headers parsed in one pass (`shared/natsheaders.py`)
    options: dict[str, Any] = link.callbacks() if link else {}
    tls = ssl.create_default_context(cafile=str(ca_file) if ca_file else None) if ca_file or "tls://" in url else None
    if creds:
        options["security"] = NatsCredentials(str(creds), ssl_context=tls)
    elif tls:
        options["security"] = NatsSecurity(ssl_context=tls)
    # log_level: FastStream's two lines per message ("Received", "Processed") at DEBUG, below the INFO its access
    # logger is set to; a service logs its state changes itself.
    broker = NatsBroker(
        servers(url),
        name=name,
        max_reconnect_attempts=-1,
        connect_timeout=5,
        reconnect_time_wait=0.5,  # type: ignore[arg-type]  # seconds: nats-py takes a float
        inbox_prefix=f"_INBOX_{name}",
        log_level=logging.DEBUG,
        middlewares=(ReplyGuard,),
        **options,
    )
    if creds:
        _DEDUP_KEYS[broker] = dedup_key(creds)
    return broker


def keyed_anew(broker: NatsBroker, creds: Path) -> None:
    """The broker's message ids keyed by the seed in `creds` from now on (an agent that traded its start identity:
    the start seed, which others have read, must not predict its ids)."""
    _DEDUP_KEYS[broker] = dedup_key(creds)


async def connect(
    broker: NatsBroker,
    *,
    declare: bool = False,
    replicas: int = 1,
    leases: bool = False,
    log_max_bytes: int = LOG_STREAM_MAX_BYTES,
    shrink: bool = False,
    patience_s: float = DECLARE_PATIENCE_S,
) -> None:
    """Connect; with `declare` (the operator's credentials only: `shared.bustopology.declare`), also make sure every
    stream exists with its full subject list and limits. A service's credentials may not create or change streams.

    replicas: copies of each stream (3 on a 3-server cluster: any one server may fail).
    leases: the leader-lease bucket too (replicated services).
    log_max_bytes: what the output stream keeps at most.
    shrink: an existing stream's size or copies may be made smaller (`Shrinking`).
    patience_s: how long the declaration waits, in all, for a bus that is away (`patiently`)."""
    deadline = time.monotonic() + patience_s
    await broker.connect()
    if not declare:
        return
    streams = broker.config.connection_state.stream
    for stream in STREAMS + ((LEASES,) if leases else ()):
        config = stream.config.evolve(num_replicas=replicas)
        if stream is LOGS:
            config = config.evolve(max_bytes=log_max_bytes)
        await declare_stream(streams, config, patience_s=until(deadline), shrink=shrink)


class Shrinking(ValueError):
    """A declaration that would make an existing stream keep less (the server drops the excess at once) or fewer
    copies than it has: refused unless asked for."""


# The limits a declaration takes from the operator's settings, and the setting each comes from.
OPERATOR_LIMITS = {
    "max_bytes": "TRAINMASTER_LOG_STREAM_MAX_BYTES (bus-prepare --log-max-bytes)",
    "num_replicas": "TRAINMASTER_STREAM_REPLICAS (bus-prepare --replicas)",
}


def shrunk_limits(existing: StreamConfig, wanted: StreamConfig) -> list[str]:
    """What `wanted` would shrink of `existing`, one sentence a limit (a limit of -1 or None: none)."""
    found = []
    for limit, setting in OPERATOR_LIMITS.items():
        now, then = getattr(existing, limit), getattr(wanted, limit)
        if now is None or now < 0:
            now = float("inf") if limit == "max_bytes" else 1
        if then is not None and 0 <= then < now:
            found.append(f"{existing.name} has {limit}={now}, this declaration would make it {then} ({setting})")
    return found


async def declare_stream(
    streams: JetStreamManager, config: StreamConfig, *, patience_s: float, shrink: bool = False
) -> None:
    """Create a stream, or bring an existing one to `config` (`patiently`); a smaller size or fewer copies than the
    stream has are refused (`Shrinking`) unless `shrink`."""

    async def create_or_update() -> None:
        try:
            await streams.add_stream(config=config)
        except BadRequestError:
            smaller = shrunk_limits((await streams.stream_info(config.name or "")).config, config)
            if smaller and not shrink:
                raise Shrinking(
                    f"refused: {'; '.join(smaller)}. The server would drop what is over the new limit at once: set "
                    "the setting to what the stream has, or declare with --shrink to mean it"
                ) from None
            for line in smaller:
                log.warning("shrinking: %s", line)
            await streams.update_stream(config=config)

    await patiently(f"declaring stream {config.name}", create_or_update, patience_s=patience_s)


def until(deadline: float) -> float:
    """The seconds left before a `time.monotonic()` deadline (0 once past): one bound for many `patiently` calls."""
    return max(0.0, deadline - time.monotonic())


async def patiently(what: str, call: Callable[[], Awaitable[Any]], *, patience_s: float) -> Any:
    """A JetStream API call, through a bus that is away (restarting, electing leaders) for up to `patience_s`, so a
    process started in that moment starts instead of exiting; a refusal is raised at once."""
    deadline, pause = time.monotonic() + patience_s, 0.2
    while True:
        try:
            return await call()
        except BUS_AWAY as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("%s: the bus is away (%r); trying again in %.1f s", what, exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)


def subjects_overlap(a: str, b: str) -> bool:
    """Whether two NATS subjects (with `*` and `>` wildcards) can match one subject."""
    left, right = a.split("."), b.split(".")
    for i, (x, y) in enumerate(zip(left, right)):
        if x == ">" or y == ">":
            return True
        if x != y and "*" not in (x, y):
            return False
        if i == len(left) - 1 or i == len(right) - 1:
            return len(left) == len(right)
    return False


@functools.lru_cache(maxsize=65536)  # every publish asks (an agent's heartbeat too): a scan of the streams' subjects
def stream_for(subject: str) -> JStream | None:
    """The stream that stores a subject (or, for a filter, overlaps it); None for a core NATS subject."""
    return next((s for s in STREAMS if any(subjects_overlap(subject, x) for x in s.config.subjects or ())), None)


def stream_of(subject: str) -> JStream:
    stream = stream_for(subject)
    if stream is None:
        raise LookupError(f"no stream stores {subject}")
    return stream


@functools.cache
def _event_types() -> dict[str, type[Message]]:
    """Every event class by its `type` (all are imported with shared.events)."""
    found, pending = {}, list(Message.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        kind = cls.model_fields.get("type")
        if kind is not None and isinstance(kind.default, str):
            found[kind.default] = cls
    return found


def parse_event(payload: Any) -> Message | None:
    """The event a payload names, validated once as its own type (None when it names no known event or does not
    parse)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        return None
    cls = _event_types().get(payload["type"])
    try:
        event = cls.model_validate(payload) if cls else None
        return event if event is None or event.subject else None
    except (ValueError, KeyError, AttributeError):
        return None


def checked_event(msg: StreamMessage, payload: Any) -> Message | None:
    """The payload's event (`parse_event`), rejected when it arrived on another subject than the one it implies
    (or its type's `legacy_subject`, where an earlier version published it), so whoever may publish only on their
    own subjects (an agent: its node's) cannot speak for another node in a payload."""
    event = parse_event(payload)
    subject = msg.raw_message.subject
    if event is not None and subject not in (event.subject, event.legacy_subject):
        log.warning(
            "dropped %s event: it arrived on %s, its payload belongs on %s",
            payload.get("type"),
            subject,
            event.subject,
        )
        raise RejectMessage()
    return event


def subject_checker(slots: int) -> Callable[[StreamMessage, Callable[[StreamMessage], Awaitable[Any]]], Awaitable[Any]]:
    """Decoder of every durable consumer (`slots`: its messages in flight): an event must arrive on the subject its
    payload implies (`checked_event`); one of a type this version does not know is given back for a newer replica
    where a platform service published it, dropped elsewhere (`shared.unknowntypes`)."""

    async def check_subject(msg: StreamMessage, decode: Callable[[StreamMessage], Awaitable[Any]]) -> Any:
        payload = await decode(msg)
        if checked_event(msg, payload) is None:
            unknown_event(msg, payload, slots=slots)
        return payload

    return check_subject


def unknown_event(msg: StreamMessage, payload: Any, *, slots: int = 1) -> None:
    """Raise what becomes of an event of a type this version does not know: given back for a newer replica where a
    platform service published it, dropped elsewhere (`UNKNOWN_DROPPED`; `shared.unknowntypes`). Nothing for any
    other payload."""
    if (kind := unknown_type(payload, known=_event_types())) is not None:
        subject = msg.raw_message.subject
        dropped_here = any(subjects_overlap(subject, s) for s in UNKNOWN_DROPPED)
        hold_or_drop(msg, kind=kind, held_here=not dropped_here, slots=slots)


def durable(
    subject: str,
    *,
    consumer: str,
    batch: int = 32,
    ordered: bool = True,
    keyed: int = 0,
    deliver_new: bool = False,
    only: Sequence[str] = (),
    wait_s: float = PULL_WAIT_S,
) -> dict[str, Any]:
    """Keyword arguments for `@router.subscriber` making a durable pull consumer on the subject's stream.

    ordered: one message in flight at a time, so a redelivery (after a crash or a nack) can never overtake a
    later message; the state machines rely on it. Unordered consumers take up to 1000 at once.
    keyed: up to this many messages in flight, handled concurrently; the handler must be wrapped in
    `shared.keyed.in_order`, which keeps the messages of one key (a job) in stream order and retries a passing
    failure in place.
    only: the subjects the consumer is delivered (the server filters; stream order is kept), so messages its
    handlers would drop are never sent, acknowledged or decoded; all of `subject` when empty. Within `subject` (what
    an in-memory test broker routes by), but for a subject an earlier version published on (`legacy_subject`).
    wait_s: how long each pull request waits for a message (`PULL_WAIT_S`).
    """
    in_flight = keyed if keyed > 1 else 1 if ordered else 1000
    return {
        "subject": subject,
        "stream": stream_of(subject),
        "durable": consumer,
        "inbox_prefix": None,  # delivered into the connection's own inbox, the only one its identity may read
        "pull_sub": PullSub(batch_size=keyed if keyed > 1 else 1 if ordered else batch, timeout=wait_s),
        "ack_policy": AckPolicy.REJECT_ON_ERROR,
        "decoder": subject_checker(in_flight),
        "no_reply": True,  # an event is never answered, whatever `reply_to` header its publisher put on it
        "config": ConsumerConfig(
            ack_wait=ACK_WAIT_S,
            max_ack_pending=in_flight,
            deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
            filter_subjects=list(only) or None,
        ),
    }


async def read_up(broker: NatsBroker, subscription: dict[str, Any]) -> bool:
    """Whether a durable consumer (`subscription`: its `durable(...)` arguments) has been delivered and has
    acknowledged every message its stream holds for it so far; False when the server does not say."""
    try:
        info = await broker.config.connection_state.stream.consumer_info(
            subscription["stream"].name, subscription["durable"]
        )
    except (NatsError, TimeoutError, NotFoundError):
        return False
    return not info.num_pending and not info.num_ack_pending


def agent_consumer(node_id: str) -> tuple[str, str]:
    """The durable consumer through which a node's agent receives its commands, and its filter."""
    return f"agent-{node_id}", f"tm.node.cmd.{node_id}.>"


def agent_subscription(node_id: str) -> dict[str, Any]:
    """`@broker.subscriber` keyword arguments of an agent's command consumer (created for it beforehand)."""
    consumer, subject = agent_consumer(node_id)
    return durable(subject, consumer=consumer, batch=8)


def created_config(config: ConsumerConfig, *, name: str, subject: str) -> ConsumerConfig:
    """What nats-py's `pull_subscribe` would create for a durable subscriber (`config`, durable `name`, subscribed
    to `subject`) were its consumer missing: the one config the platform declares for it, so a process binds to it
    unchanged (`pull_subscribe` creates only what is missing, and a service may not)."""
    return config.evolve(name=name, durable_name=name, filter_subject=None if config.filter_subjects else subject)


def consumer_config(subscription: dict[str, Any]) -> ConsumerConfig:
    """The consumer a durable subscription (`durable(...)` arguments) reads, as the platform declares it."""
    return created_config(subscription["config"], name=subscription["durable"], subject=subscription["subject"])


def filters_of(config: ConsumerConfig) -> list[str]:
    """The subjects a consumer is delivered, sorted (its filter subjects, or its one filter subject)."""
    return sorted(config.filter_subjects or ()) or [config.filter_subject or ""]


def agent_consumer_config(node_id: str) -> ConsumerConfig:
    """A node's command consumer: made on the privileged side (the operator's declaration for static nodes,
    placement's minted identity for rented ones), so the agent needs no right to create consumers."""
    return consumer_config(agent_subscription(node_id))


# A rented node's agent that has not asked for its commands this long was declared lost long before (the monitor's
# node timeout) and its work placed elsewhere: the server deletes its consumer (on a cluster, one Raft group each).
RENTED_CONSUMER_INACTIVE_S = 3600.0


def rented_consumer_config(node_id: str, *, boot_s: float = 0.0) -> ConsumerConfig:
    """A rented node's command consumer: a static node's, forgotten by the server once unread for
    `RENTED_CONSUMER_INACTIVE_S` plus `boot_s` (the latest its agent may start: a Pod pending for GPUs that long is
    still waited for). The server keeps one threshold throughout, so after the first read it is that sum too."""
    return agent_consumer_config(node_id).evolve(inactive_threshold=RENTED_CONSUMER_INACTIVE_S + max(boot_s, 0.0))


async def forget_starts(broker: NatsBroker, node_id: str) -> None:
    """Drop the start commands still waiting for a node in its command stream (stops stay: stopping what does not
    run is harmless). The monitor does it when it declares the node lost and requeues its work: an agent that comes
    back must not run an attempt the platform has already given to another node."""
    await broker.config.connection_state.stream.purge_stream(NODE_COMMANDS.name, subject=f"tm.node.cmd.{node_id}.start")


def dedup_id(broker: NatsBroker, subject: str, event_id: str) -> str:
    """The JetStream message id of an event: stable across retries and restarts of the publisher, and keyed by
    its own secret (`buscreds.dedup_key`), so no other publisher into the stream (an agent) can predict it and
    pre-empt the event by sending its id first."""
    key = _DEDUP_KEYS.get(broker)
    if key is None:
        return event_id
    return f"{event_id}#{hmac.new(key, f'{subject}#{event_id}'.encode(), 'sha256').hexdigest()[:24]}"


async def publish(broker: NatsBroker, message: Message) -> None:
    """Publish to JetStream and wait for the stream's ack; the event id de-duplicates retries. A subject no stream
    stores (a heartbeat) goes out on core NATS: fire and forget."""
    subject = message.subject
    if stream_for(subject) is None:
        await broker.publish(message, subject)
        return
    await broker.publish(
        message,
        subject,
        stream=stream_of(subject).name,
        headers={"Nats-Msg-Id": dedup_id(broker, subject, message.event_id)},
        timeout=10,
    )


P = ParamSpec("P")
R = TypeVar("R")


def retry_transient(handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Redeliver a message whose handling failed for a passing reason (database or bus down); drop poison."""

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await handler(*args, **kwargs)
        except TRANSIENT_ERRORS as exc:
            log.warning("%s: transient failure, will retry: %r", handler.__name__, exc)
            raise NackMessage(delay=1) from exc

    return wrapper
