"""One way to ask another process over request/reply: a question nobody listens to yet is asked again while its time
lasts. Every process's first questions after a start meet it: the one asked may not have subscribed yet (the stack
starts them side by side), and nats-server 2.x answered "no responders" to about one request in 40-80 sent right
after the responder's subscription was flushed (`tests/integration/test_asking.py`)."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from nats.errors import NoRespondersError

T = TypeVar("T")

FIRST_PAUSE_S = 0.02  # the race after a subscription is over within a round trip; a starting responder takes longer
LONGEST_PAUSE_S = 0.25  # a replica taking over as leader, a service restarting: asked again four times a second
SHORTEST_WAIT_S = 0.1  # the least time a try is given, even past the deadline (an answer on its way is taken)


async def ask(send: Callable[[float], Awaitable[T]], *, timeout: float) -> T:
    """`send(seconds left)`'s answer; while the server says no one listens, asked again (after 20 ms, then twice as
    long each time up to 250 ms) until `timeout` would pass, then its `NoRespondersError` raised. Any other error
    (a timeout, a refusal) is raised at once."""
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE_S
    while True:
        try:
            return await send(max(SHORTEST_WAIT_S, deadline - time.monotonic()))
        except NoRespondersError:
            if time.monotonic() + pause >= deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)


async def request(broker: Any, payload: Any, subject: str, *, timeout: float) -> Any:
    """A FastStream broker's `request`, asked again while no one listens (`ask`)."""
    return await ask(lambda left: broker.request(payload, subject, timeout=left), timeout=timeout)
