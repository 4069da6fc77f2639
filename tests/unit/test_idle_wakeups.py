"""An idle process sleeps until it has something to do: a bus process (`shared.service.Process`) waits for its stop
instead of looking for it ten times a second as FastStream's `run` does, and the API's server (`QuietServer`) ticks
once a second instead of ten times, and stops at once on a signal. Each poll cost ~3.6 ms of CPU a second a process
(an idle stack 64 -> 43 ms of CPU a second, ten processes)."""

import asyncio
import signal
import socket
import subprocess
import sys
import time

import anyio
import pytest
import uvicorn
from faststream.nats import NatsBroker, TestNatsBroker

from shared.service import Process
from services.submitter import connections
from services.submitter.__main__ import server_options
from services.submitter.app import SubmitterSettings
from services.submitter.connections import QuietServer
from tests.conftest import free_port

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # TestNatsBroker's notice about its own parsing


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Every `anyio.sleep` (what FastStream's `run` looks for its stop with)."""
    calls: list[float] = []
    real = anyio.sleep

    async def counted(delay: float = 0, *args, **kwargs):
        calls.append(delay)
        return await real(delay, *args, **kwargs)

    monkeypatch.setattr(anyio, "sleep", counted)
    return calls


async def test_a_bus_process_waits_for_its_stop_without_looking_and_stops_when_told(sleeps):
    broker = NatsBroker()
    started: list[int] = []

    async def ready() -> None:
        started.append(1)

    app = Process(broker, after_startup=[ready])
    async with TestNatsBroker(broker):
        running = asyncio.create_task(app.run())
        for _ in range(200):
            if started:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # idle: FastStream's run looked five times by now
        assert started == [1] and not running.done()
        assert sleeps == []
        app.exit()
        await asyncio.wait_for(running, 10)


async def test_a_bus_process_told_to_stop_before_it_runs_stops_once_started():
    broker = NatsBroker()
    app = Process(broker)
    app.exit()
    async with TestNatsBroker(broker):
        await asyncio.wait_for(app.run(), 10)


async def hello(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class CountedServer(QuietServer):
    ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)


async def test_the_api_server_ticks_once_a_second_keeps_its_date_and_stops_at_once_on_a_signal(monkeypatch):
    settings = SubmitterSettings(api_port=0)
    server = CountedServer(uvicorn.Config(hello, **server_options(settings), lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        first = dict(server.server_state.default_headers)[b"date"]
        await asyncio.sleep(2.2)
        assert 2 <= server.ticks <= 4  # uvicorn's own loop: 22 or 23
        assert dict(server.server_state.default_headers)[b"date"] != first  # refreshed at each tick
        monkeypatch.setattr(connections, "TICK_S", 60.0)  # the next wait would outlast the test's
        await asyncio.sleep(1.1)  # the loop is in a 60-s wait now
        stop(server)
        await asyncio.wait_for(asyncio.shield(serving), 10)
    finally:
        if not serving.done():
            stop(server)
        await asyncio.wait_for(serving, 70)


def stop(server: QuietServer) -> None:
    """A SIGTERM as the server's handler gets it, not raised again in the test's process once the server stopped
    (uvicorn does that with the signals it caught)."""
    server.handle_exit(signal.SIGTERM, None)
    server._captured_signals.clear()


SERVE = """
import sys
from services.submitter.__main__ import serve

async def hello(scope, receive, send):
    pass

serve(hello, {"host": "127.0.0.1", "port": int(sys.argv[1]), "log_level": "warning", "lifespan": "off"})
print("stopped", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_api_stopped_by_a_signal_exits_cleanly(sig):
    """As `uvicorn.run`: uvicorn raises the signal it caught again once stopped, and a SIGINT raised so would end
    the process with a traceback (KeyboardInterrupt) and status 130."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # listening
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
                time.sleep(0.1)
        process.send_signal(sig)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert "Traceback" not in err, err
    if sig == signal.SIGINT:
        assert (process.returncode, out) == (0, "stopped\n"), err
    else:  # uvicorn raises SIGTERM again: the process ends by it, as under `uvicorn.run`
        assert process.returncode == -signal.SIGTERM, err
