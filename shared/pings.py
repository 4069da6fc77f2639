"""A PING the bus server answered: it has read everything this client sent before it and sent everything it had
for this client before its PONG (the server handles a connection in order). The agent's fence counts from the last
heartbeat acknowledged this way (heartbeats are core NATS, with no acknowledgement of their own); the monitor
judges silent nodes only once it has read every heartbeat the server sent before such a PONG.

nats-py's `flush` cannot be bounded safely: it queues a waiter for its PING's PONG, and a waiter given up before the
PONG came (the flush timed out, or its caller was cancelled: a heartbeat cut off at the agent's stop) is still
queued; the late PONG then resolves that cancelled waiter, `InvalidStateError` ends the client's read loop, and
the connection reads nothing more (no command, no heartbeat, no answer; every later flush returns at once without
asking, a stop's drain waits out its own 10-s flush) until nats-py finds it stale minutes later. So one PING is in
flight at a time, and none is given up while its connection lives: a caller that stops waiting for it leaves it
running, and the next caller waits for it again before sending its own. One queued on a connection since replaced
(its waiters were dropped with it) is cancelled, which is safe there; one not yet sent is waited for like any.
Each Pings has one caller at a time in practice (the heartbeat, the liveness loop); a second one is safe too.

Left as it is: nats-py's own reconnect sends a flush with its default timeout (`_attempt_reconnect`); a server that
answers it too late can still end the read loop that way. Only a fix in nats-py (or in its `_pongs` handling) ends
that.

nats-py writes a PING to the socket at once but a publish only when its flusher task next runs: a flush called
right after a publish sent its PING ahead of it. The PING goes out from a task of its own, which runs after the
flusher the publish woke. A flusher still writing earlier output (the socket full) can still be overtaken; what
was published is then the next thing on the wire, and only a connection lost in between has the agent's fence
count from a heartbeat the server never read (at most one interval late).
"""

import asyncio
from collections.abc import Callable
from typing import Protocol

# What nats-py's flush is given to wait: no bound of its own (a bound cancels its waiter); callers bound theirs.
UNBOUNDED_S = 365 * 24 * 3600


class Connection(Protocol):
    """What is used of nats-py's client."""

    stats: dict[str, int]

    @property
    def is_connected(self) -> bool: ...

    async def flush(self, timeout: int) -> None: ...


class Pings:
    """One PING in flight at a time on a bus connection, never cancelled while that connection lives."""

    def __init__(self, connection: Callable[[], Connection]) -> None:
        self.connection = connection
        self.probe: asyncio.Task[None] | None = None
        self.sent_on: int | None = None  # the connection's reconnection count when the probe's PING was queued; None
        # while the probe has not run (no PING queued: waited for, never cancelled as another connection's)

    async def wait(self, *, timeout_s: float) -> None:
        """Return once the server has answered a PING sent after everything this client sent so far, within
        `timeout_s`; else raise (ConnectionError while the connection is down, TimeoutError past the time)."""
        client = self.connection()
        if not client.is_connected:  # reconnecting: nats-py's flush would return without asking the server
            raise ConnectionError("not connected to the bus")
        deadline = asyncio.get_running_loop().time() + timeout_s
        probe = self.probe
        if probe is not None and not probe.done():
            if self.sent_on is None or self.sent_on == client.stats["reconnects"]:
                await _until(probe, deadline)  # its PONG comes first; a second PING waits for it
            else:  # queued on a connection since replaced: its PONG never comes, and no read loop holds its waiter
                probe.cancel()
        latest = self.probe
        if latest is None or latest is probe:  # not replaced by another caller meanwhile
            latest = asyncio.get_running_loop().create_task(self._ping(client))
            self.probe, self.sent_on = latest, None
        await _until(latest, deadline)

    async def close(self) -> None:
        """Once the connection is closed (its read loop ended): a PING still in flight is given up."""
        if self.probe is not None:
            self.probe.cancel()

    async def _ping(self, client: Connection) -> None:
        # the state looked at and the PING's waiter queued in one step: nothing runs between them
        if not client.is_connected:
            raise ConnectionError("not connected to the bus")
        self.sent_on = client.stats["reconnects"]
        await client.flush(timeout=UNBOUNDED_S)


async def _until(probe: asyncio.Task[None], deadline: float) -> None:
    """The probe's outcome, waited for until `deadline` (loop time) without cancelling it."""
    await asyncio.wait([probe], timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
    if not probe.done():
        raise TimeoutError("the bus server has not answered a PING in time")
    if probe.cancelled():  # given up as another connection's (by another caller, or at close): not our cancellation
        raise ConnectionError("the PING was given up: its connection was replaced or closed")
    probe.result()
