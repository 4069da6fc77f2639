"""`shared.pings` (the agent's heartbeat acknowledgement, the monitor's settling) against a fake nats-py client: one
PING in flight, its waiter never cancelled while its connection lives (a late PONG for a cancelled waiter ends
nats-py's read loop: tests/integration/test_pings.py), given up once its connection was replaced."""

import asyncio

import pytest

from shared.pings import Pings


class Client:
    """What Pings uses of nats-py's client: each flush a PING whose PONG the test sends."""

    def __init__(self) -> None:
        self.is_connected = True
        self.stats = {"reconnects": 0}
        self.pings: list[asyncio.Future] = []  # each PING's waiter, as nats-py queues them

    async def flush(self, timeout: int) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self.pings.append(waiter)
        await asyncio.wait_for(waiter, timeout)

    def pong(self) -> None:
        """The server answers the oldest PING (nats-py resolves its waiter: one cancelled raises)."""
        self.pings.pop(0).set_result(True)


async def test_a_heartbeat_waits_for_the_ping_in_flight_rather_than_giving_it_up():
    client = Client()
    pings = Pings(lambda: client)
    with pytest.raises(TimeoutError):
        await pings.wait(timeout_s=0.01)
    second = asyncio.create_task(pings.wait(timeout_s=30))
    await asyncio.sleep(0.01)
    assert len(client.pings) == 1 and not client.pings[0].cancelled()  # no second PING before the first's PONG
    client.pong()  # the late PONG finds its waiter as it left it
    await asyncio.sleep(0.01)
    assert len(client.pings) == 1  # the second heartbeat's own PING, sent after the first was answered
    client.pong()
    await second


async def test_a_heartbeat_cut_off_leaves_its_ping_waiting_for_its_pong():
    client = Client()
    pings = Pings(lambda: client)
    heartbeat = asyncio.create_task(pings.wait(timeout_s=30))
    await asyncio.sleep(0.01)
    heartbeat.cancel()
    await asyncio.gather(heartbeat, return_exceptions=True)
    assert not client.pings[0].cancelled()
    client.pong()


async def test_a_ping_of_a_connection_since_replaced_is_given_up_for_a_new_one():
    client = Client()
    pings = Pings(lambda: client)
    with pytest.raises(TimeoutError):
        await pings.wait(timeout_s=0.01)
    lost, client.pings = client.pings, []  # nats-py drops the old connection's waiters at a reconnection
    client.stats["reconnects"] += 1
    heartbeat = asyncio.create_task(pings.wait(timeout_s=30))
    await asyncio.sleep(0.01)
    assert lost[0].cancelled() and len(client.pings) == 1
    client.pong()
    await heartbeat


async def test_no_ping_while_the_connection_is_down():
    client = Client()
    client.is_connected = False
    with pytest.raises(ConnectionError):
        await Pings(lambda: client).wait(timeout_s=1)
    assert not client.pings


async def test_a_second_caller_waits_for_a_ping_not_sent_yet_rather_than_cancelling_it_as_another_connections():
    """The reconnection count of the last PING sent used to stand for a probe created but not run yet: a second
    caller in that moment, after a reconnect, cancelled it, and the first caller's wait raised CancelledError, which
    reads as its own cancellation (a heartbeat loop ends)."""
    client = Client()
    pings = Pings(lambda: client)
    first = asyncio.create_task(pings.wait(timeout_s=30))
    await asyncio.sleep(0.01)
    client.pong()
    await first
    client.stats["reconnects"] += 1  # the connection was replaced since that PING
    a, b = (asyncio.create_task(pings.wait(timeout_s=30)) for _ in range(2))
    await asyncio.sleep(0.01)
    assert len(client.pings) == 1  # one PING in flight: b waits for a's
    client.pong()
    await asyncio.sleep(0.01)
    assert a.done() and a.exception() is None and len(client.pings) == 1  # then b's own
    client.pong()
    await b


async def test_a_ping_given_up_at_close_is_a_connection_error_to_its_waiter():
    client = Client()
    pings = Pings(lambda: client)
    waiting = asyncio.create_task(pings.wait(timeout_s=30))
    await asyncio.sleep(0.01)
    await pings.close()
    with pytest.raises(ConnectionError):
        await waiting
