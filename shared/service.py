"""What every process shares (services, the API, agents): logging, the bus, liveness over request/reply, background
loops, the database, and how they start and stop."""

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from faststream import FastStream
from faststream._internal.cli.supervisors.utils import set_exit
from faststream.nats import NatsBroker, NatsRouter
from pydantic import BaseModel, Field

from shared import bus
from shared.bus import RPC_HEALTH, SERVICES as LEASED, BusLink, connect, make_broker
from shared.buslog import quiet_expected_bus_waits
from shared.bustopology import bound
from shared.clock import utcnow
from shared.lease import Lease, LeaseLost
from shared.settings import CommonSettings
from shared.store import make_client

log = logging.getLogger(__name__)
Hook = Callable[[], Awaitable[Any]]


class Health(BaseModel):
    service: str
    ok: bool = True
    pid: int
    started_at: str
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="What the service reports of itself (its `health_details()`), e.g. the estimator's history model.",
    )


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faststream").setLevel(logging.WARNING)
    # httpx says every request's whole URL at INFO: a webhook's secret path, a signed download URL's credentials
    logging.getLogger("httpx").setLevel(logging.WARNING)
    quiet_expected_bus_waits()


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

    def every(
        self,
        name: str,
        interval_s: float | Callable[[], float],
        step: Callable[[], Awaitable[Any]],
        *,
        tolerate: tuple[type[BaseException], ...] = (Exception,),
    ) -> None:
        """Run `step` now and every `interval_s` after (a callable: asked again after each round); a failure it
        may have (`tolerate`) is logged and the next round goes on, any other restarts the loop."""

        async def loop() -> None:
            while True:
                try:
                    await step()
                except tolerate as exc:
                    log.warning("%s: %r", name, exc)
                await asyncio.sleep(interval_s() if callable(interval_s) else interval_s)

        self.spawn(name, loop)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


def run(app: FastStream) -> None:
    """Run a FastStream application until SIGINT or SIGTERM (FastStream installs the handlers); the process exits
    should the bus close its connection for good (`shared.bus.BusLink.closed`)."""
    bus.EXIT_WHEN_CLOSED = True
    asyncio.run(app.run())


@dataclass
class Wiring:
    """A process's common parts: its bus, a place for its loops, the state of its bus link, and its database
    (None for a process without one, or until `running` opens it)."""

    name: str
    broker: NatsBroker
    background: Background
    link: BusLink
    db: Any = None
    # What the process writes last at a graceful stop (what it kept to write later), once its loops and the broker
    # stopped (nothing is handed in any more) and before the database client closes; each bounds its own wait.
    closing: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)


Setup = Callable[[Wiring], Awaitable[Any]]  # builds what a process runs (its service object) once it is connected


def wire(*, name: str, settings: CommonSettings, router: NatsRouter | None = None, health: str | None = None) -> Wiring:
    """Built before a process runs: logging, its broker (not yet connected) with the router's subscribers and
    liveness answers on tm.rpc.health.<health or name>, a place for its loops."""
    configure_logging(settings.log_level)
    link = BusLink()
    broker = make_broker(
        settings.nats_url, name=name, link=link, creds=settings.nats_creds, ca_file=settings.nats_ca_file
    )
    if router is not None:
        broker.include_router(router)
    add_health(broker, health or name)
    return Wiring(name=name, broker=broker, background=Background(), link=link)


@asynccontextmanager
async def running(
    w: Wiring,
    *,
    settings: CommonSettings,
    setup: Setup | None = None,
    database: bool = True,
    start: bool = False,
    stop: Callable[[], Any] | None = None,
) -> AsyncIterator[Any]:
    """A process running: the bus connected and every consumer it reads declared (by the operator: `bound` waits for
    them, the process may not make them), one database client (`database`), what `setup` builds (in the context
    under the process's name), the broker started when `start` (a FastStream app starts its own); on exit the
    loops, the broker, what `w.closing` writes last, then the database. A replica of a service that must act once
    first waits for its leader lease; `stop` is how SIGTERM stops the process once it leads (a FastStream app's
    `exit`)."""
    leased = settings.leader_lease and w.name in LEASED
    await connect(w.broker)
    await bound(w.broker, leases=leased)
    if leased:
        await lead(w, stop=stop)
    client = make_client(settings.mongo_url) if database else None
    w.db = client[settings.mongo_db] if client is not None else None
    try:
        service = await setup(w) if setup else None
        if service is not None:
            w.broker.context.set_global(w.name, service)
        if start:
            await w.broker.start()
        yield service
    finally:
        w.link.stopping = True  # the broker's close from here on is the process's own
        await w.background.stop()
        if start:
            await w.broker.stop()
        for close in w.closing:
            try:
                await close()
            except Exception:  # the database client closes all the same
                log.exception("%s: a write at stop failed", w.name)
        if client is not None:
            await client.close()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: a supervisor starts the process again, as a replica that waits


async def lead(w: Wiring, *, stop: Callable[[], Any] | None) -> None:
    """Wait for the service's leader lease, then keep it from the background; losing it ends the process at once
    (no write or publish after that point: whatever was in flight is redelivered to the next leader). A replica
    that waits holds nothing: SIGTERM or SIGINT ends it at once; once it leads, they go to `stop`."""
    lease, loop = Lease(w.broker.config.connection_state.stream, w.name), asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, os._exit, 0)
    log.info("%s: asking for the leader lease (while another replica holds it, this one waits)", w.name)
    try:
        epoch = await lease.acquire()
    finally:
        for sig in STOP_SIGNALS:
            if stop is not None:
                loop.add_signal_handler(sig, stop)
            else:
                loop.remove_signal_handler(sig)
    log.info("%s: leading, lease epoch %d", w.name, epoch)

    async def keep() -> None:
        try:
            await lease.keep()
        except LeaseLost as exc:
            log.critical("%s: leader lease lost, exiting: %s", w.name, exc)
            logging.shutdown()
            os._exit(LEASE_LOST_EXIT)

    w.background.spawn("lease", keep)


def service_app(
    *,
    settings: CommonSettings,
    name: str = "",
    router: NatsRouter | None = None,
    setup: Setup | None = None,
    wiring: Wiring | None = None,
    database: bool = True,
    after_startup: Sequence[Hook] = (),
    on_shutdown: Sequence[Hook] = (),
) -> FastStream:
    """One bus process (a service, or an agent given its `wiring` built beforehand): `wire`d, and `running` for
    as long as FastStream runs it; `after_startup` hooks run once its subscribers listen, `on_shutdown` ones before
    they stop."""
    w = wiring or wire(name=name, settings=settings, router=router)

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        async with running(w, settings=settings, setup=setup, database=database, stop=app.exit):
            yield

    app = Process(
        w.broker, lifespan=lifespan, after_startup=list(after_startup), on_shutdown=list(on_shutdown), link=w.link
    )
    return app


class Wake:
    """A stop flag that wakes the loop waiting on it, set from anywhere: the loop itself, another thread or a signal
    handler installed with `signal.signal` (through `call_soon_threadsafe`, which writes to the loop's pipe). Set
    before the wait is armed, the wait finds it set."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._early = False

    def arm(self) -> None:
        """On the loop that will wait."""
        self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
        if self._early:
            self._event.set()

    def set(self) -> None:
        loop, event = self._loop, self._event
        if loop is None or event is None:
            self._early = True
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing is left waiting
            loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout_s: float | None = None) -> None:
        """Until set, or `timeout_s` passed."""
        assert self._event is not None, "armed first"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)


class Process(FastStream):
    """A FastStream application that waits for its stop instead of looking for it: FastStream's `run` wakes every
    0.1 s to see whether `exit` was called, about 3.6 ms of CPU a second a process on this machine (half of what an
    idle service used; ten processes a stack). The same steps as FastStream's `run` otherwise: the signals call
    `exit`, the lifespan wraps start and stop. `link`: told at `exit` that the broker's close to come is the
    process's own (FastStream closes it before the lifespan ends)."""

    def __init__(self, *args: Any, link: BusLink | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop, self._link = Wake(), link

    def exit(self) -> None:
        if self._link is not None:
            self._link.stopping = True
        super().exit()
        self._stop.set()

    async def run(
        self,
        log_level: int = logging.INFO,
        run_extra_options: dict[str, Any] | None = None,
        sleep_time: float = 0.1,  # FastStream's, unused: nothing is looked for
    ) -> None:
        self._stop.arm()
        set_exit(lambda *_: self.exit(), sync=False)
        async with self.lifespan_context(**(run_extra_options or {})):
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._startup, log_level, run_extra_options)
                    await self._stop.wait()
                    await self._shutdown(log_level)
                    tg.cancel_scope.cancel()
            except ExceptionGroup as e:
                for ex in e.exceptions:
                    raise ex from None
