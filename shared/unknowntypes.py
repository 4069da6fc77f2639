"""An event of a type this version does not know, on a durable consumer's subject: given back for a newer replica.

A rolling deploy that adds an event type runs an old replica beside the new one for a while; what the old one
acknowledged unread would be lost. So a well-formed envelope (a `type` no event of this version has and an
`event_id`) is given back (nak, with backoff), never acknowledged, until a replica that knows it takes it; bounded
by the bus server's own clock: one stored `UNKNOWN_TYPE_PATIENCE_S` ago is dropped, logged as an error. Only where a
platform service publishes: on a subject an agent may publish (a node's own) an unknown type is dropped at once, so
an agent's garbage never holds a consumer back (agents are deployed after the services that read their new types),
and so is one among a node's commands (read by its agent alone, which no newer replica replaces). Anything else that
is no event of the consumer (no envelope, a known type that does not validate) is dropped, as before.

A held delivery keeps one of its consumer's in-flight slots (the server counts a nak'ed message as pending), and
placement, the monitor, the estimator and billing read only while they lead, so a newer replica takes what is held
only once this one has stopped. So a consumer holds at most `HOLD_SHARE` of its slots (an ordered consumer's one),
and for at most `UNKNOWN_TYPE_PATIENCE_S` of this process's life in all (`Holds`): a replica whose successor does
not come in that time (a rollback, the publishers deployed long before the readers) drops what it does not know
from then on, instead of stalling its consumer once per event.
"""

import logging
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

from faststream.exceptions import NackMessage, RejectMessage
from pydantic import ValidationError

from shared.clock import utcnow
from shared.events import Message
from shared.jsmeta import delivery_facts

log = logging.getLogger(__name__)

UNKNOWN_TYPE_PATIENCE_S = 600.0  # how long a deploy may run an old replica beside the new one
UNKNOWN_TYPE_NAK_MAX_S = 30.0  # the longest a given-back delivery waits before it is offered again
HOLD_SHARE = 0.25  # at most this share of a consumer's in-flight slots held for a newer replica (at least one)


def unknown_type(payload: Any, *, known: Container[str]) -> str | None:
    """The type an event envelope names, when no event of this version has it (None for a known type or for
    anything that is no envelope: a JetStream API answer has a `type` but no `event_id`)."""
    if not isinstance(payload, dict) or not isinstance(kind := payload.get("type"), str) or kind in known:
        return None
    try:
        Message.model_validate(payload)
    except ValidationError:
        return None
    return kind[:100]


def give_back_delay(*, deliveries: int, age_s: float) -> float | None:
    """How long an unknown type's delivery (its `deliveries`-th, stored `age_s` ago) waits before it is offered
    again: 1 s, doubling, at most `UNKNOWN_TYPE_NAK_MAX_S`; None once it is too old to wait for."""
    if age_s >= UNKNOWN_TYPE_PATIENCE_S:
        return None
    return min(2.0 ** min(max(deliveries - 1, 0), 16), UNKNOWN_TYPE_NAK_MAX_S)


@dataclass
class _Book:
    since: float | None = None  # when this consumer began holding what it holds now (this process's clock)
    held: dict[int, float] = field(default_factory=dict)  # stream sequence -> when last delivered here
    spent: bool = False  # it held past the patience once: it holds nothing more


@dataclass
class Holds:
    """What each consumer of this process holds for a newer replica, and whether it may hold one more."""

    clock: Callable[[], float] = time.monotonic
    books: dict[str, _Book] = field(default_factory=dict)

    def may_hold(self, consumer: str, seq: int, *, slots: int) -> bool:
        """Whether the consumer may (go on) hold(ing) the delivery `seq`: never once it has held past the
        patience in all; a new one only while fewer than `HOLD_SHARE` of its `slots` are held. A delivery not
        offered here again for a while is forgotten (a newer replica took it, or it was dropped)."""
        now = self.clock()
        book = self.books.setdefault(consumer, _Book())
        forget = now - 2 * UNKNOWN_TYPE_NAK_MAX_S - 5.0
        book.held = {s: seen for s, seen in book.held.items() if seen >= forget}
        if not book.held:
            book.since = None
        if book.since is not None and now - book.since >= UNKNOWN_TYPE_PATIENCE_S:
            book.spent = True
        if book.spent or (seq not in book.held and len(book.held) >= max(1, int(slots * HOLD_SHARE))):
            book.held.pop(seq, None)
            return False
        book.held[seq] = now
        book.since = now if book.since is None else book.since
        return True


HOLDS = Holds()


def _consumer_and_seq(message: Any) -> tuple[str, int] | None:
    try:
        meta = message.raw_message.metadata
        return f"{meta.stream}/{meta.consumer}", int(meta.sequence.stream)
    except (AttributeError, TypeError, ValueError):
        return None


def hold_or_drop(message: Any, *, kind: str, held_here: bool, slots: int = 1) -> None:
    """Raise what becomes of a delivery of unknown type `kind`: given back (`NackMessage`) where `held_here`, while
    it is young enough and its consumer (`slots` in flight) may hold it (`HOLDS`), else dropped (`RejectMessage`,
    logged)."""
    subject = getattr(message.raw_message, "subject", "?")
    facts = delivery_facts(message) if held_here else None
    if facts is None:
        log.warning("dropped an event of unknown type %r on %s (not one to wait for a newer replica)", kind, subject)
        raise RejectMessage()
    deliveries, stored = facts
    delay = give_back_delay(deliveries=deliveries, age_s=(utcnow() - stored).total_seconds())
    where = _consumer_and_seq(message)
    if delay is None or (where is not None and not HOLDS.may_hold(where[0], where[1], slots=slots)):
        log.error(
            "dropped an event of unknown type %r on %s: no replica that knows it took it in %g s, or its consumer "
            "holds all it may (%g of its slots, %g s in all)",
            kind,
            subject,
            UNKNOWN_TYPE_PATIENCE_S,
            HOLD_SHARE,
            UNKNOWN_TYPE_PATIENCE_S,
        )
        raise RejectMessage()
    (log.warning if deliveries == 1 else log.debug)(
        "gave back an event of unknown type %r on %s (delivery %d) for a replica of a newer version",
        kind,
        subject,
        deliveries,
    )
    raise NackMessage(delay=delay)
