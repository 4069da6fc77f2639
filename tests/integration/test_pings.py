"""`shared.pings` (the agent's heartbeat acknowledgement, the monitor's settling) on a real NATS server, its answers
held back by a relay: a PONG that comes after its waiter gave up (a time out, or a heartbeat cut off at the agent's
stop) left nats-py's read loop ended by InvalidStateError, so the connection read nothing more (no command, no
answer; a stop's drain waited out its own 10-s flush)."""

import asyncio
import contextlib

import nats
import pytest

from shared.pings import Pings
from tests.conftest import eventually
from tests.factories import unique

pytestmark = pytest.mark.integration


class Relay:
    """A TCP relay to the NATS server whose answers (server to client) can be held back, then let through."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.open = asyncio.Event()
        self.open.set()
        self.sent = bytearray()  # what the client sent, in order
        self.server: asyncio.Server | None = None
        self.pumps: set[asyncio.Task] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        for pump in (self._pump(client_r, server_w, sent=True), self._pump(server_r, client_w, sent=False)):
            task = asyncio.create_task(pump)
            self.pumps.add(task)
            task.add_done_callback(self.pumps.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, sent: bool) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                if sent:
                    self.sent += data
                else:
                    await self.open.wait()
                sink.write(data)
                await sink.drain()
        sink.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.pumps):
            task.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)


@pytest.fixture
async def relayed(bus):
    """A client connected through a relay (the errors it reported in `client.errors`), and the relay."""
    relay = Relay(bus.settings.nats_port)
    port = await relay.start()
    errors: list[Exception] = []

    async def reported(error: Exception) -> None:
        errors.append(error)

    client = await nats.connect(f"nats://127.0.0.1:{port}", user_credentials=str(bus.admin_creds()), error_cb=reported)
    client.errors = errors
    yield client, relay
    relay.open.set()
    await client.close()
    await relay.close()


async def still_reads(client) -> None:
    """The client's read loop still runs: a message it publishes comes back to its own subscription."""
    subject = unique("echo")
    subscription = await client.subscribe(subject)
    await client.publish(subject, b"ping")
    assert (await subscription.next_msg(timeout=10)).data == b"ping"
    await subscription.unsubscribe()


async def answers_held(relay: Relay, pings: int) -> None:
    """Wait until the client has sent `pings` PINGs past the connect handshake's."""

    async def sent() -> bool:
        return relay.sent.count(b"PING\r\n") >= 1 + pings

    await eventually(sent, interval_s=0.01)


async def test_an_acknowledgement_timed_out_leaves_the_connection_reading_once_its_answer_comes(relayed):
    client, relay = relayed
    pings = Pings(lambda: client)
    relay.open.clear()  # the server's answers are held back: this acknowledgement times out
    with pytest.raises(TimeoutError):
        await pings.wait(timeout_s=0.2)
    relay.open.set()  # its PONG comes late
    await pings.wait(timeout_s=10)  # the next heartbeat is acknowledged
    await still_reads(client)


async def test_an_acknowledgement_cut_off_by_the_agents_stop_leaves_the_connection_reading(relayed):
    client, relay = relayed
    pings = Pings(lambda: client)
    relay.open.clear()
    heartbeat = asyncio.create_task(pings.wait(timeout_s=30))
    await answers_held(relay, 1)
    heartbeat.cancel()  # the stop cancels the heartbeat loop while it waits
    with contextlib.suppress(asyncio.CancelledError):
        await heartbeat
    relay.open.set()
    await still_reads(client)


async def test_the_stops_drain_after_a_heartbeat_cut_off_is_answered(relayed):
    """The agent's stop: its heartbeat loop cancelled while a PING waits, then the broker drained (each subscription's
    own PING queued behind it): the first PONG met the cancelled waiter, the read loop ended, and the drain's PONG
    was never read: it waited its 10-s flush out and reported a drain timeout."""
    client, relay = relayed
    await client.subscribe(unique("commands"))  # drained at the stop: a PING of its own
    pings = Pings(lambda: client)
    relay.open.clear()
    heartbeat = asyncio.create_task(pings.wait(timeout_s=30))
    await answers_held(relay, 1)
    heartbeat.cancel()
    await asyncio.gather(heartbeat, return_exceptions=True)
    drain = asyncio.create_task(client.drain())
    await answers_held(relay, 2)
    relay.open.set()
    await drain
    assert client.is_closed and not client.errors


async def test_a_heartbeat_is_on_the_wire_before_the_ping_that_acknowledges_it(relayed):
    """nats-py writes a PING to the socket at once, a publish when its flusher next runs: the PING answered
    could have gone out ahead of the heartbeat it acknowledged."""
    client, relay = relayed
    pings = Pings(lambda: client)
    await client.publish("tm.node.evt.n1.heartbeat", b"{}")
    await pings.wait(timeout_s=10)
    assert relay.sent.index(b"PUB tm.node.evt.n1.heartbeat") < relay.sent.rindex(b"PING\r\n")
