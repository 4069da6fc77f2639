"""The API holds idle keep-alive connections 75 s; how many it holds at once is capped, beyond which a request is
answered 503 rather than a descriptor spent on it; a connection that sends no whole request head in time is closed,
so silent sockets cannot hold the cap (the real uvicorn server, on a loopback port)."""

import asyncio
from contextlib import asynccontextmanager

import pytest
import uvicorn

from services.submitter import connections
from services.submitter.__main__ import KEEP_ALIVE_S, server_options
from services.submitter.app import SubmitterSettings


async def hello(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def status_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: the connection stays open after it
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 10)
    return int(line.split()[1])


async def test_connections_beyond_the_cap_are_answered_503_and_idle_ones_are_kept():
    settings = SubmitterSettings(api_port=0, api_max_connections=3)
    options = server_options(settings)
    assert options["timeout_keep_alive"] == KEEP_ALIVE_S
    server = uvicorn.Server(uvicorn.Config(hello, **options, lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        assert [await status_of(r, w) for r, w in held] == [200, 200]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await status_of(reader, writer) == 503  # the two idle ones are still held
        writer.close()
        for _, w in held:
            w.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


@asynccontextmanager
async def serving(cap: int):
    """The real server with the API's options on a loopback port; yields the port."""
    server = uvicorn.Server(
        uvicorn.Config(hello, **server_options(SubmitterSettings(api_port=0, api_max_connections=cap)), lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def whole_exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """One request on a kept connection, its whole response read (head and body), so the next one can follow."""
    status = await status_of(reader, writer)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return status


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection within 10 s (a reset, where it left bytes unread, or a pipe broken
    by it under a write, is a close)."""
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


async def test_silent_connections_are_closed_and_do_not_hold_the_cap(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(connections, "REQUEST_HEAD_S", 0.5)
    async with serving(cap=3) as port:
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        half = silent[0][1]
        half.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # half a head, then nothing
        assert [await closed_by_server(r) for r, _ in silent] == [True, True, True]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await whole_exchange(reader, writer) == 200  # the cap is free again
        await asyncio.sleep(1.0)  # idle after a response: the keep-alive timeout's (75 s), not the head's
        assert await whole_exchange(reader, writer) == 200
        writer.close()
        for _, w in silent:
            w.close()


async def echo_length(scope, receive, send):
    """Reads the whole body, answers its length (what a route does before it runs)."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]}
    )
    await send({"type": "http.response.body", "body": body})


async def test_a_body_that_trickles_is_closed_and_does_not_hold_the_cap(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(connections, "REQUEST_BODY_S", 1.0)
    server = uvicorn.Server(
        uvicorn.Config(
            echo_length, **server_options(SubmitterSettings(api_port=0, api_max_connections=2)), lifespan="off"
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        for _ in range(6):  # a byte every half second: never silent for long, never whole
            await asyncio.sleep(0.5)
            if writer.is_closing():
                break
            try:
                writer.write(b"x")
                await writer.drain()
            except ConnectionError:
                break
        assert await closed_by_server(reader)
        writer.close()
        # a body sent whole in time is read and answered, on the freed cap
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        assert int((await asyncio.wait_for(reader.readline(), 10)).split()[1]) == 200
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
