"""What every service process shares: logging, liveness over request/reply, background tasks, running."""
import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker, NatsRouter
from pydantic import BaseModel, Field

from shared.bus import RPC_HEALTH, BusLink, connect, make_broker
from shared.clock import utcnow
from shared.settings import CommonSettings
from shared.store import make_client

log = logging.getLogger(__name__)


class Health(BaseModel):
    service: str
    ok: bool = True
    pid: int
    started_at: str
    details: dict[str, Any] = Field(default_factory=dict, description="What the service reports of itself "
                                    "(its `health_details()`), e.g. the estimator's history model.")


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faststream").setLevel(logging.WARNING)


def add_health(broker: NatsBroker, service: str) -> None:
    """Answer liveness probes on tm.rpc.health.<service>."""
    started_at = utcnow().isoformat()

    @broker.subscriber(RPC_HEALTH.format(service=service), include_in_schema=False)
    async def health() -> Health:
        report = getattr(broker.context.get(service), "health_details", None)
        return Health(service=service, pid=os.getpid(), started_at=started_at, details=report() if report else {})


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

    def every(self, name: str, interval_s: float, step: Callable[[], Awaitable[Any]], *,
              tolerate: tuple[type[BaseException], ...] = (Exception,)) -> None:
        """Run `step` now and every `interval_s` after; a failure it may have (`tolerate`) is logged and the
        next round goes on, any other restarts the loop."""
        async def loop() -> None:
            while True:
                try:
                    await step()
                except tolerate as exc:
                    log.warning("%s: %r", name, exc)
                await asyncio.sleep(interval_s)

        self.spawn(name, loop)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


def run(app: FastStream) -> None:
    """Run a FastStream application until SIGINT or SIGTERM (FastStream installs the handlers)."""
    asyncio.run(app.run())


@dataclass
class Wiring:
    """What a service's setup gets: its database, the bus, a place for its loops, the state of its bus link."""

    db: Any
    broker: NatsBroker
    background: Background
    link: BusLink


def service_app(
    *, name: str, settings: CommonSettings, router: NatsRouter,
    setup: Callable[[Wiring], Awaitable[Any]],
) -> FastStream:
    """One service process: logging, the bus with every stream declared, its subscribers, liveness answers, one
    database client, and what `setup` builds (in the context under the service's name), all closed on exit."""
    configure_logging(settings.log_level)
    link = BusLink()
    broker = make_broker(settings.nats_url, name=name, link=link, creds=settings.nats_creds,
                         ca_file=settings.nats_ca_file)
    broker.include_router(router)
    add_health(broker, name)
    background = Background()

    @asynccontextmanager
    async def lifespan():
        await connect(broker, replicas=settings.stream_replicas)
        client = make_client(settings.mongo_url)
        service = await setup(Wiring(db=client[settings.mongo_db], broker=broker, background=background, link=link))
        broker.context.set_global(name, service)
        yield
        await background.stop()
        await client.close()

    return FastStream(broker, lifespan=lifespan)
