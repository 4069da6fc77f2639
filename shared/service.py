"""What every service process shares: logging, liveness over request/reply, background tasks, running."""
import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker
from pydantic import BaseModel

from shared.bus import RPC_HEALTH
from shared.clock import utcnow

log = logging.getLogger(__name__)


class Health(BaseModel):
    service: str
    ok: bool = True
    pid: int
    started_at: str


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faststream").setLevel(logging.WARNING)


def add_health(broker: NatsBroker, service: str) -> None:
    """Answer liveness probes on tm.rpc.health.<service>."""
    started_at = utcnow().isoformat()

    @broker.subscriber(RPC_HEALTH.format(service=service), include_in_schema=False)
    async def health() -> Health:
        return Health(service=service, pid=os.getpid(), started_at=started_at)


class Background:
    """Long-running loops of a service, cancelled together at shutdown; a crashed loop is logged and restarted."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task] = []

    def spawn(self, name: str, factory: Any) -> None:
        self._tasks.append(asyncio.create_task(self._supervise(name, factory), name=name))

    async def _supervise(self, name: str, factory: Any) -> None:
        while True:
            try:
                coro: Coroutine = factory()
                await coro
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background loop %s crashed; restarting", name)
                await asyncio.sleep(1)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


def run(app: FastStream) -> None:
    """Run a FastStream application until SIGINT or SIGTERM (FastStream installs the handlers)."""
    asyncio.run(app.run())
