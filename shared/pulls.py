"""A pull consumer's fetch that hands over a message as soon as the server delivers it.

nats-py's `fetch` of more than one message, once its first message has come, waits for the rest of the batch until
its pull request ends (the server's 404 or 408, or the fetch's own timeout), in some phases of its loop: a message
delivered to an idle consumer could wait up to the fetch's timeout (2 s for the state machines' consumers) before
its handler saw it (`bench.pullhold`; the first job after a start waited 0.8-1.4 s so in half the fresh stacks).
A fetch of one message returns with it. So a consumer asks for one message while none is known to wait, and for a
batch of at most as many as wait: each message says how many are still pending for its consumer
(`num_pending`, in its reply subject: free), so a burst is still read a batch at a time and a batch asked for is
there to be delivered at once. `install` (`shared.bus.make_broker` calls it) gives every pull subscription
FastStream creates in the process this `fetch` (its own, on the subscription: nats-py's class is left as it is, so
a client of nats-py alone, a test's or a tool's, fetches as nats-py does).
"""

import types
from collections.abc import Awaitable, Callable
from typing import Any

from faststream.nats.subscriber.usecases.stream_pull_subscriber import (
    ConcurrentPullStreamSubscriber,
    PullStreamSubscriber,
)
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

_PLAIN = JetStreamContext.PullSubscription.fetch
_WAITING = "_tm_waiting"  # on a pull subscription: how many messages its last fetch said were still pending


async def fetch(
    self: JetStreamContext.PullSubscription, batch: int = 1, timeout: float | None = 5, heartbeat: float | None = None
) -> list[Msg]:
    """One message while none is known to wait; else as many as wait, up to `batch`."""
    if batch <= 1:
        return await _PLAIN(self, batch, timeout, heartbeat)
    waiting = getattr(self, _WAITING, 0)
    try:
        messages = await _PLAIN(self, min(batch, waiting) if waiting > 0 else 1, timeout, heartbeat)
    except BaseException:
        setattr(self, _WAITING, 0)  # an empty wait (or a lost connection): none known to wait
        raise
    setattr(self, _WAITING, pending_after(messages))
    return messages


def pending_after(messages: list[Msg]) -> int:
    """How many messages the server still held for the consumer when it delivered the last of these (0 where it
    does not say)."""
    if not messages:
        return 0
    try:
        return max(0, int(messages[-1].metadata.num_pending))
    except (ValueError, AttributeError, IndexError, TypeError):
        return 0


def adapt(subscription: JetStreamContext.PullSubscription) -> None:
    """This subscription fetches as above."""
    subscription.fetch = types.MethodType(fetch, subscription)  # type: ignore[method-assign]


def install() -> None:
    """Every pull subscription FastStream creates from now on in this process fetches as above (idempotent)."""
    for kind in (PullStreamSubscriber, ConcurrentPullStreamSubscriber):
        create = kind.__dict__["_create_subscription"]
        if getattr(create, "_adapts", False):
            continue
        kind._create_subscription = _adapting(create)  # type: ignore[method-assign,assignment]


def _adapting(create: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    """`create`, then its subscription adapted before its consuming task first runs (no await in between)."""

    async def created(subscriber: Any) -> None:
        await create(subscriber)
        if subscriber.subscription is not None:
            adapt(subscriber.subscription)

    created._adapts = True  # type: ignore[attr-defined]
    return created
