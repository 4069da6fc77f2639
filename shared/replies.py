"""Where a process may answer: only into an identity's own inbox (`_INBOX_<identity>.…`), never onto a platform
subject. A reply subject is chosen by whoever sends the message, so without this check a request (or an event
carrying a `reply_to` header, which FastStream answers too) aimed at `tm.job.status` or `tm.node.cmd.<node>.stop`
would have the receiver publish there with its own rights."""

import logging
import re
from typing import Any

from faststream import BaseMiddleware
from faststream.message import StreamMessage

log = logging.getLogger(__name__)

INBOX = re.compile(r"^_INBOX_[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]+)+$")  # busroles.inbox(identity) + its tokens


def is_inbox(subject: str) -> bool:
    """Whether a reply subject lies in some identity's own inbox (no wildcard, no platform subject)."""
    return bool(INBOX.match(subject))


class ReplyGuard(BaseMiddleware):
    """Every subscriber of a broker: a request whose reply subject is not an inbox is neither handled nor
    answered; an event (JetStream) with such a `reply_to` header is handled but never answered."""

    async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
        reply = msg.reply_to
        if not reply or is_inbox(reply):
            return await call_next(msg)
        msg.reply_to = ""  # FastStream publishes the handler's result to this after the handler returns
        subject = getattr(msg.raw_message, "subject", "?")
        if getattr(msg.raw_message, "reply", None) == reply:  # a core request: refused, nothing done
            log.warning("refused a request on %s: its reply subject %.200r is not an inbox", subject, reply)
            return None
        log.warning("a message on %s asked for a reply on %.200r (not an inbox): handled, not answered", subject, reply)
        return await call_next(msg)
