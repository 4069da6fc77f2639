"""The API holds idle keep-alive connections 75 s; how many it holds at once is capped, beyond which a request is
answered 503 rather than a descriptor spent on it (the real uvicorn server, on a loopback port)."""

import asyncio

import uvicorn

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
