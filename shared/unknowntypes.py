"""An event of a type this version does not know, on a durable consumer's subject: given back for a newer replica.

A rolling deploy that adds an event type runs an old replica beside the new one for a while; what the old one
acknowledged unread would be lost. So a well-formed envelope (a `type` no event of this version has and an
`event_id`) is given back (nak, with backoff), never acknowledged, until a replica that knows it takes it; bounded
by the bus server's own clock: one stored `UNKNOWN_TYPE_PATIENCE_S` ago is dropped, logged as an error. Only where a
platform service publishes: on a subject an agent may publish (a node's own) an unknown type is dropped at once, so
an agent's garbage never holds a consumer back (agents are deployed after the services that read their new types),
and so is one among a node's commands (read by its agent alone, which no newer replica replaces). Anything else that
is no event of the consumer (no envelope, a known type that does not validate) is dropped, as before.
"""

import logging
from collections.abc import Container
from typing import Any

from faststream.exceptions import NackMessage, RejectMessage
from pydantic import ValidationError

from shared.clock import utcnow
from shared.events import Message
from shared.jsmeta import delivery_facts

log = logging.getLogger(__name__)

UNKNOWN_TYPE_PATIENCE_S = 600.0  # how long a deploy may run an old replica beside the new one
UNKNOWN_TYPE_NAK_MAX_S = 30.0  # the longest a given-back delivery waits before it is offered again


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


def hold_or_drop(message: Any, *, kind: str, held_here: bool) -> None:
    """Raise what becomes of a delivery of unknown type `kind`: given back (`NackMessage`) where `held_here` and
    while it is young enough, else dropped (`RejectMessage`, logged)."""
    subject = getattr(message.raw_message, "subject", "?")
    facts = delivery_facts(message) if held_here else None
    if facts is None:
        log.warning("dropped an event of unknown type %r on %s (not one to wait for a newer replica)", kind, subject)
        raise RejectMessage()
    deliveries, stored = facts
    delay = give_back_delay(deliveries=deliveries, age_s=(utcnow() - stored).total_seconds())
    if delay is None:
        log.error(
            "dropped an event of unknown type %r on %s: no replica that knows it took it in %g s",
            kind,
            subject,
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
