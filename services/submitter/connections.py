"""The API's HTTP connections: one that sends no whole request head in time is closed.

uvicorn times a connection out only between requests (after a response, `timeout_keep_alive`); one that never sends a
request, or sends half a head and stops, is held for good, and every connection held counts against the cap on
connections (`TRAINMASTER_API_MAX_CONNECTIONS`): a thousand silent sockets from anyone who can reach the port would
have answered every real request 503 for as long as they stayed open."""

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_HEAD_S = 10.0  # from the connection (or the first byte after a response) to a whole request head


class HeadTimedProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on each request head."""

    head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._serving():
            self._disarm()  # a whole head came: the request is the app's now
        elif self.head_timer is None:
            self._arm()  # the first bytes of the next head, after a response: its own deadline

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle between requests: the keep-alive timeout's

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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

    def _head_overdue(self) -> None:
        self.head_timer = None
        if self._serving() or self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # serving a request, already closing, or handed to another protocol (an upgrade)
        if self.conn.our_state != h11.ERROR:
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()
