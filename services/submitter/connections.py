"""The API's HTTP connections: one that sends no whole request head in time, or no whole body after it, is closed.

uvicorn times a connection out only between requests (after a response, `timeout_keep_alive`); one that never sends a
request, or sends half a head and stops, is held for good, and every connection held counts against the cap on
connections (`TRAINMASTER_API_MAX_CONNECTIONS`): a thousand silent sockets from anyone who can reach the port would
have answered every real request 503 for as long as they stayed open. A head followed by a body sent a byte now and
then held its connection the same way (the app waits for the body, and uvicorn times nothing while it does)."""

import asyncio
from types import FrameType

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from shared.service import Wake

REQUEST_HEAD_S = 10.0  # from the connection (or the first byte after a response) to a whole request head
TICK_S = 1.0  # how often the server looks at its stop flag and request count between signals
REQUEST_BODY_S = 30.0  # from a whole head to the whole body it announced (1 MiB, the default cap, at 35 KB/s)


class HeadTimedProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on each request head and one on its body."""

    head_timer: asyncio.TimerHandle | None = None
    body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._serving():
            self._disarm()  # a whole head came: the request is the app's now
            if self.conn.their_state == h11.SEND_BODY:
                if self.body_timer is None:  # its body to come, within its own deadline
                    self.body_timer = self.loop.call_later(REQUEST_BODY_S, self._body_overdue)
            else:
                self._disarm_body()
        elif self.head_timer is None:
            self._arm()  # the first bytes of the next head, after a response: its own deadline

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle between requests: the keep-alive timeout's
        self._disarm_body()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        super().connection_lost(exc)

    def _serving(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self.head_timer = self.loop.call_later(REQUEST_HEAD_S, self._head_overdue)

    def _disarm(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _disarm_body(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None

    def _head_overdue(self) -> None:
        self.head_timer = None
        if self._serving() or self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # serving a request, already closing, or handed to another protocol (an upgrade)
        self._close()

    def _body_overdue(self) -> None:
        """The body is not whole in time: the connection is closed, the app's wait for it ends as a disconnect
        (no route has run on a part of a body)."""
        self.body_timer = None
        if self.conn.their_state != h11.SEND_BODY or self.transport.is_closing():
            return
        if self.transport.get_protocol() is self:
            self.transport.close()  # no response: the app has the request (h11 allows none mid-request)

    def _close(self) -> None:
        if self.conn.our_state != h11.ERROR:
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


class QuietServer(uvicorn.Server):
    """uvicorn's server, ticking once a second (the Date header's refresh, the request limit) instead of ten times a
    second, and at once when a stop signal comes: uvicorn's own loop wakes every 0.1 s to see whether it should stop
    (about 3.6 ms of CPU a second on this machine, the idle API's largest cost)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stop = Wake()

    async def main_loop(self) -> None:
        self._stop.arm()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # every tick is a whole second's: the headers are refreshed
            await self._stop.wait(TICK_S)
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._stop.set()  # uvicorn's signal handler (`signal.signal`): the loop is woken through its pipe
