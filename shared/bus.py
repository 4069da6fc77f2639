"""The bus: JetStream streams, durable consumers, publishing with de-duplication, request/reply subjects."""
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from faststream.exceptions import NackMessage
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from nats.errors import Error as NatsError
from nats.js.errors import BadRequestError
from nats.js.api import ConsumerConfig, DeliverPolicy, StorageType
from pymongo.errors import PyMongoError

from shared.events import Message

log = logging.getLogger(__name__)

ACK_WAIT_S = 10  # a message held by a process that died is redelivered after this long
DEDUP_WINDOW_S = 15 * 60  # longer than any outage a service recovers from by relaying its outbox

def _stream(name: str, subject: str, **config: Any) -> JStream:
    """A stream trainmaster declares itself (FastStream would only declare the subjects it subscribes to)."""
    stream = JStream(name=name, storage=StorageType.FILE, declare=False, **config)
    stream.config.subjects = [subject]
    return stream


# Jobs and money: file storage; the server runs with `sync_interval: always`, so an ack means on disk.
JOBS = _stream("TM_JOBS", "tm.job.>", duplicate_window=DEDUP_WINDOW_S)
NODE_COMMANDS = _stream("TM_NODE_CMD", "tm.node.cmd.>", duplicate_window=DEDUP_WINDOW_S)
NODES = _stream("TM_NODES", "tm.node.evt.>", max_age=3600, duplicate_window=60)
LOGS = _stream("TM_LOGS", "tm.log.>", max_age=7 * 86400, duplicate_window=300)
ESTIMATES = _stream("TM_ETA", "tm.eta.>", max_age=7 * 86400, duplicate_window=300)
NOTIFICATIONS = _stream("TM_NOTIFY", "tm.notify.>", max_age=30 * 86400, duplicate_window=DEDUP_WINDOW_S)
STREAMS = (JOBS, NODE_COMMANDS, NODES, LOGS, ESTIMATES, NOTIFICATIONS)
_STREAM_OF = {s.config.subjects[0].removesuffix(">"): s for s in STREAMS}

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
SERVICES = ("placement", "monitor", "estimator", "billing")
SERVICES = ("placement", "monitor", "estimator", "billing")

TRANSIENT_ERRORS = (PyMongoError, NatsError, OSError, TimeoutError)


class BusLink:
    """When this process last lost or regained the bus: silence from others then means nothing."""

    def __init__(self) -> None:
        self.connected = True
        self.changed_at = time.monotonic()

    async def disconnected(self) -> None:
        self.connected, self.changed_at = False, time.monotonic()

    async def reconnected(self) -> None:
        self.connected, self.changed_at = True, time.monotonic()

    def steady_for(self) -> float:
        """Seconds the link has been up without interruption (0 while it is down)."""
        return time.monotonic() - self.changed_at if self.connected else 0.0


def make_broker(url: str, *, name: str, link: BusLink | None = None) -> NatsBroker:
    """A broker that reconnects forever: a restarted NATS server is waited for, not fatal."""
    callbacks = {"disconnected_cb": link.disconnected, "reconnected_cb": link.reconnected} if link else {}
    return NatsBroker(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=5,
                      **callbacks)


async def connect(broker: NatsBroker) -> None:
    """Connect and make sure every stream exists with its full subject list, before any consumer starts."""
    await broker.connect()
    streams = broker.config.connection_state.stream
    for stream in STREAMS:
        try:
            await streams.add_stream(config=stream.config)
        except BadRequestError:
            await streams.update_stream(config=stream.config)


def stream_of(subject: str) -> JStream:
    return next(stream for prefix, stream in _STREAM_OF.items() if subject.startswith(prefix))


def durable(
    subject: str,
    *,
    consumer: str,
    batch: int = 32,
    ordered: bool = True,
    deliver_new: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for `@router.subscriber` making a durable pull consumer on the subject's stream.

    ordered: one message in flight at a time, so a redelivery (after a crash or a nack) can never overtake a
    later message; the state machines rely on it. Unordered consumers take up to 1000 at once.
    """
    return {
        "subject": subject,
        "stream": stream_of(subject),
        "durable": consumer,
        "pull_sub": PullSub(batch_size=1 if ordered else batch, timeout=0.5),
        "ack_policy": AckPolicy.REJECT_ON_ERROR,
        "config": ConsumerConfig(
            ack_wait=ACK_WAIT_S,
            max_ack_pending=1 if ordered else 1000,
            deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
        ),
    }


async def publish(broker: NatsBroker, message: Message) -> None:
    """Publish to JetStream and wait for the stream's ack; the event id de-duplicates retries."""
    subject = message.subject
    await broker.publish(
        message,
        subject,
        stream=stream_of(subject).name,
        headers={"Nats-Msg-Id": message.event_id},
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
