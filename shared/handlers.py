"""What a service reacts to, in one table: event type -> handler, and the dispatch that follows the table.

Each service's `handlers.py` declares `EVENT_HANDLERS = {JobSubmitted: Billing.submitted, ...}` before its
subscriptions, which decode and call `dispatch`. A handler takes the service first, then the event, so a table
can name a service's own method (`Billing.submitted`) or a short function `(service, event)` of the module.
"""

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from shared.bus import subjects_overlap
from shared.events import Message

log = logging.getLogger(__name__)

S = TypeVar("S")
Handler = Callable[[S, Any], Awaitable[Any]]
HandlerTable = Mapping[type[Message], Handler[S]]


async def dispatch(table: HandlerTable[S], event: Message, service: S) -> Any:
    """Hand the event to its type's handler; an event of a type the table does not name is logged and dropped
    (a consumer of a whole stream sees more kinds than its service reacts to)."""
    handler = table.get(type(event))
    if handler is None:
        log.debug("%s: no handler for %s on %s; dropped", type(service).__name__, type(event).__name__, event.subject)
        return None
    return await handler(service, event)


def subject_filters(
    table: HandlerTable[Any], *, within: str, narrowed: Mapping[type[Message], Sequence[str]] | None = None
) -> tuple[str, ...]:
    """The subjects, within a consumer's subject, of the events a table handles (each `{field}` of a subject
    template a `*`, and the type's `legacy_subject`): what the consumer needs delivered, and nothing its handlers
    would drop. `narrowed`: for a type, the only subjects of it the consumer needs (the statuses of some phases:
    `shared.events.status_subjects`)."""
    filters: set[str] = set()
    for event in table:
        if narrowed and event in narrowed:
            filters.update(narrowed[event])
        else:
            filters.add(re.sub(r"\{[^}]*\}", "*", event.subject_template))
        if event.legacy_subject:  # what is still in the stream from an earlier version, narrowed or not
            filters.add(event.legacy_subject)
    return tuple(sorted(f for f in filters if subjects_overlap(f, within)))
