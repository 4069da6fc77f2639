"""Order per key, concurrency across keys, for the state machines' consumers (`durable(..., keyed=N)`).

FastStream starts one task per message of a fetched batch, but the tasks do not reach the handler in the batch's
order (measured: under load, deliveries 35-37 reached it after 38). So turns are handed out in the consumer's
delivery order (JetStream's consumer sequence, `DeliveryOrder`), then per key (`KeyedOrder`): a message waits
for the earlier ones of its key, a keyless one for all before it, and all after it for it.
"""

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

from faststream.exceptions import NackMessage, RejectMessage
from faststream.nats import NatsBroker
from nats.js.errors import NotFoundError
from pydantic import TypeAdapter

from shared.bus import (
    ACK_WAIT_S,
    TRANSIENT_ERRORS,
    checked_event,
    durable,
    stream_of,
    subjects_overlap,
    unknown_event,
)
from shared.clock import utcnow
from shared.events import Message
from shared.handlers import HandlerTable, subject_filters

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
REDELIVERY_MARGIN_S = 1.0
PATIENCE_S = 2.0  # how long a delivery waits for one before it that has not reached the handler (a lost one)
SUPERSEDED_NAK_S = 1.0  # a delivery for another version goes back to the consumer this long (below ACK_WAIT_S)
READ_SUBJECTS_KEPT = 4096  # subjects whose reading a consumer remembers (`KeyedConsumer.reads`)
JOBS_IN_FLIGHT = 32  # a state machine's jobs handled at once (`durable(..., keyed=)`), each job's events one at a time

_HOLDING: contextvars.ContextVar[bool] = contextvars.ContextVar("holding_a_turn", default=False)


class DeliveryOrder:
    """Turns in delivery order: delivery n + 1 goes only once delivery n has taken its turn or was dropped before
    the handler (`skip`: it did not decode), or after `patience_s` when n never comes. Unknown until `resume_after`
    or the first delivery seen."""

    def __init__(self, patience_s: float = PATIENCE_S) -> None:
        self.last: int | None = None
        self.patience_s = patience_s
        self._waiting: dict[int, asyncio.Future] = {}
        self._skipped: set[int] = set()

    def resume_after(self, delivered: int) -> None:
        """The consumer's last delivery before this process read from it."""
        self.last = delivered

    async def wait(self, seq: int | None) -> None:
        if seq is None or self.last is None or seq <= self.last + 1:
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting[seq] = turn
        try:
            await asyncio.wait_for(turn, self.patience_s)
        except TimeoutError:
            if self.last + 1 < seq:  # not when the turn came as the wait ran out (it said "deliveries 34-33")
                log.warning(
                    "delivery %d: deliveries %d-%d never reached the handler, going on without them",
                    seq,
                    self.last + 1,
                    seq - 1,
                )
        finally:
            self._waiting.pop(seq, None)

    def taken(self, seq: int | None) -> None:
        if seq is None:
            return
        self.last = seq if self.last is None else max(self.last, seq)
        while self.last + 1 in self._skipped:
            self._skipped.discard(self.last + 1)
            self.last += 1
        self._skipped = {s for s in self._skipped if s > self.last}  # bounded: only those still ahead
        follower = self._waiting.get(self.last + 1)
        if follower is not None and not follower.done():
            follower.set_result(None)

    def skip(self, seq: int | None) -> None:
        """A delivery that will never reach the handler (it did not decode): its followers need not wait for it,
        so a stream of malformed messages cannot stall the consumer `patience_s` each."""
        if seq is None:
            return
        if self.last is None or seq <= self.last + 1:
            self.taken(seq)
        else:
            self._skipped.add(seq)


class KeyedOrder:
    """Turns per key: a message waits for the earlier messages of its key, a keyless one for every earlier message
    (and every later one for it)."""

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Future] = {}
        self._running: set[asyncio.Future] = set()
        self._barrier: asyncio.Future | None = None

    def take(self, key: str | None) -> tuple[list[asyncio.Future], asyncio.Future]:
        """What to wait for, and this turn's own future (to be resolved by `done`)."""
        mine = asyncio.get_running_loop().create_future()
        if key is None:
            before = [*self._running, *([self._barrier] if self._barrier else [])]
            self._barrier = mine
        else:
            before = [f for f in (self._tails.get(key), self._barrier) if f is not None]
            self._tails[key] = mine
        self._running.add(mine)
        return before, mine

    def done(self, key: str | None, mine: asyncio.Future) -> None:
        mine.set_result(None)
        self._running.discard(mine)
        if key is None and self._barrier is mine:
            self._barrier = None
        elif key is not None and self._tails.get(key) is mine:
            del self._tails[key]

    def in_flight(self) -> int:
        return len(self._running)


def job_key(event: Any) -> str | None:
    """A job's events in order; one without a job (a node's lost tasks) after all before it, before all after."""
    return getattr(event, "job_id", None)


def delivery_seq(message: Any) -> int | None:
    """A JetStream message's consumer sequence (None for one that is not: an in-memory test broker's)."""
    try:
        return int(message.raw_message.metadata.sequence.consumer)
    except Exception:  # noqa: BLE001 - anything without JetStream metadata is simply not sequenced
        return None


def in_order(
    key: Callable[[Any], str | None],
    *,
    deliveries: DeliveryOrder | None = None,
    event: str = "event",
    message: str = "message",
    retry_s: float = 0.5,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Wrap the handler of a `durable(..., keyed=N)` consumer, whose parameters `event` (the decoded event) and
    `message` (`Context("message")`) are read (`deliveries`: the consumer's, for `resume`): the messages of one key
    (`key(event)`, e.g. its job id; None: wait for all) are handled one at a time in stream order, different keys
    concurrently. A passing failure (database or bus down) is retried in place, never nacked, so no later message of
    its key overtakes it; a handler error is raised (the message is rejected, as everywhere)."""

    def wrap(handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        turns, order = KeyedOrder(), deliveries or DeliveryOrder()

        @functools.wraps(handler)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            if _HOLDING.get():  # delivered inline from inside a handler (an in-memory test broker): no turn
                return await handler(*args, **kwargs)
            seq = delivery_seq(kwargs.get(message))
            await order.wait(seq)
            k = key(kwargs[event] if event in kwargs else args[0])
            before, mine = turns.take(k)
            order.taken(seq)
            held = _HOLDING.set(True)
            try:
                for earlier in before:
                    await asyncio.shield(earlier)
                delay = retry_s
                while True:
                    try:
                        return await handler(*args, **kwargs)
                    except TRANSIENT_ERRORS as exc:
                        log.warning("%s: transient failure, retrying in %.1f s: %r", handler.__name__, delay, exc)
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 5.0)
            finally:
                _HOLDING.reset(held)
                turns.done(k, mine)

        wrapper.turns = turns  # type: ignore[attr-defined]
        return wrapper

    return wrap


class KeyedConsumer:
    """A state machine's jobs consumer (`keyed_durable`): its subscription, with a decoder that checks the subject
    and the event type up front so a delivery that will not reach the handler is skipped in the delivery order,
    not waited for; `in_order` for its handler and `resume` for its process's start.

    The server delivers only the subjects this version's handler table names. A delivery of another subject means
    the operator declared the consumer for another version (a deploy's declaration, while this replica still
    runs): it is given back (nak), never acknowledged, and so is every later one, so this replica neither drops
    what the new version handles nor handles a job's later event before it; the new version's replica takes them.
    An event of a type this version does not know, on a subject it reads, is given back too where a platform
    service published it (`shared.unknowntypes`); it is skipped in the delivery order, so its job's later events
    are not held behind it."""

    def __init__(self, subscription: dict[str, Any], event: Any) -> None:
        self.deliveries = DeliveryOrder()
        self.subscription = {**subscription, "decoder": self.decode}
        self._event = TypeAdapter(event)
        self._reads = subscription["config"].filter_subjects or [subscription["subject"]]
        self.slots = subscription["config"].max_ack_pending or 1
        self.superseded_by: str | None = None  # the first subject delivered that this version does not read
        self._read: dict[str, bool] = {}  # subject delivered → whether a filter of this version reads it

    def reads(self, subject: str) -> bool:
        """Whether this version's filters read `subject` (each subject looked at once: a jobs stream's subjects are
        its statuses and its nodes', a bounded set; forgotten past `READ_SUBJECTS_KEPT`)."""
        known = self._read.get(subject)
        if known is None:
            if len(self._read) >= READ_SUBJECTS_KEPT:
                self._read.clear()
            known = self._read[subject] = any(subjects_overlap(subject, s) for s in self._reads)
        return known

    def superseded(self, msg: Any) -> bool:
        """Whether this consumer was declared for another version (the server filters: an in-memory broker's
        deliveries, without JetStream metadata, say nothing)."""
        if delivery_seq(msg) is None:
            return False
        subject = getattr(msg.raw_message, "subject", "")
        if self.superseded_by is None and not self.reads(subject):
            self.superseded_by = subject
            log.error(
                "%s delivered %s, which this version does not read: the consumer was declared for another "
                "version; every delivery is given back for it from now on (replace this process)",
                self.subscription["durable"],
                subject,
            )
        return self.superseded_by is not None

    async def decode(self, msg: Any, decode: Callable[[Any], Awaitable[Any]]) -> Any:
        if self.superseded(msg):
            self.deliveries.skip(delivery_seq(msg))
            raise NackMessage(delay=SUPERSEDED_NAK_S)
        try:
            payload = await decode(msg)
            # validated once, as the type it names; the handler's parameter takes the event as it is
            known = checked_event(msg, payload)
            if known is None:
                unknown_event(msg, payload, slots=self.slots)
            event = self._event.validate_python(known or payload)
        except NackMessage:  # a type of a newer version, given back for its replica (`shared.unknowntypes`)
            self.deliveries.skip(delivery_seq(msg))
            raise
        except Exception as exc:  # noqa: BLE001 - anything that would stop it before the handler
            self.deliveries.skip(delivery_seq(msg))
            if not isinstance(exc, RejectMessage):
                log.warning(
                    "dropped a message on %s that is no event of this consumer: %s",
                    getattr(msg.raw_message, "subject", "?"),
                    str(exc).splitlines()[0][:200],
                )
            raise RejectMessage() from exc
        return event

    def in_order(self, key: Callable[[Any], str | None] = job_key) -> Callable:
        return in_order(key, deliveries=self.deliveries)

    async def resume(self, broker: NatsBroker) -> int:
        return await resume(broker, self.subscription, self.deliveries)


def keyed_durable(
    subject: str,
    *,
    consumer: str,
    event: Any,
    handles: HandlerTable[Any],
    width: int = JOBS_IN_FLIGHT,
    narrowed: Mapping[type[Message], Sequence[str]] | None = None,
) -> KeyedConsumer:
    """`durable(subject, consumer=..., keyed=width)` for handlers of `event` (a type or a union) kept in order per
    job, delivered only the subjects of the events its service's table `handles` (`subject_filters`; `narrowed`:
    of a type, only these subjects)."""
    only = subject_filters(handles, within=subject, narrowed=narrowed)
    return KeyedConsumer(durable(subject, consumer=consumer, keyed=width, only=only), event)


async def resume(broker: NatsBroker, subscription: dict[str, Any], deliveries: DeliveryOrder) -> int:
    """Before a keyed consumer starts (`subscription`: its `durable(...)` arguments; `deliveries`: the order its
    `in_order` keeps): take up the delivery order where the consumer left it, and when a previous instance died holding
    messages (unacknowledged), wait until they are due again (`ACK_WAIT_S`), so the server hands them out first,
    in order, before anything newer; a later message of their key can then never be handled before them.
    Returns how many there were."""
    consumer, streams = subscription["durable"], broker.config.connection_state.stream
    stream = stream_of(subscription["subject"]).name
    try:
        info = await streams.consumer_info(stream, consumer)
    except NotFoundError:
        return 0
    deliveries.resume_after(info.delivered.consumer_seq)
    if info.num_ack_pending:
        wait = redelivery_wait(info.delivered.last_active, now=utcnow())
        log.info(
            "%s: %d messages of a previous run unacknowledged: waiting %.1f s for their redelivery",
            consumer,
            info.num_ack_pending,
            wait,
        )
        await asyncio.sleep(wait)
    return info.num_ack_pending or 0


def redelivery_wait(last_delivered: datetime | None, *, now: datetime) -> float:
    """Seconds until every message a dead reader held is due again: each is redelivered ACK_WAIT_S after it was
    delivered, and none was delivered after the consumer's last delivery (the server's clock: 1 s of margin).
    A replica that takes over once the leader's lease ran out (6 s) waits ~5 s more, not the whole ACK_WAIT_S."""
    if last_delivered is None:
        return ACK_WAIT_S + 1.0
    if last_delivered.tzinfo is None:
        last_delivered = last_delivered.replace(tzinfo=UTC)
    due = (last_delivered - now).total_seconds() + ACK_WAIT_S + REDELIVERY_MARGIN_S
    return min(ACK_WAIT_S + 1.0, max(0.0, due))
