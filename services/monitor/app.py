"""Monitor wiring: owns the job status projection and node liveness."""
import asyncio
from contextlib import asynccontextmanager

from faststream import FastStream

from shared.bus import BusLink, connect, make_broker
from shared.clock import utcnow
from shared.service import Background, add_health, configure_logging
from shared.settings import CommonSettings
from shared.store import DocumentStore, make_client, relay
from services.monitor.handlers import router
from services.monitor.service import Monitor

SERVICE = "monitor"


class MonitorSettings(CommonSettings):
    liveness_check_s: float = 1.0


def create_app(settings: MonitorSettings | None = None) -> FastStream:
    settings = settings or MonitorSettings()
    configure_logging(settings.log_level)
    link = BusLink()
    broker = make_broker(settings.nats_url, name=SERVICE, link=link)
    broker.include_router(router)
    add_health(broker, SERVICE)
    background = Background()

    @asynccontextmanager
    async def lifespan():
        await connect(broker)
        client = make_client(settings.mongo_url)
        db = client[settings.mongo_db]
        monitor = Monitor(
            jobs=DocumentStore(db.monitor_jobs, broker),
            nodes=DocumentStore(db.monitor_nodes, broker),
            node_timeout_s=settings.node_timeout_s,
            started_at=utcnow(),
            link=link,
        )
        broker.context.set_global("monitor", monitor)
        yield
        await background.stop()
        await client.close()

    async def start_loops() -> None:
        monitor: Monitor = broker.context.get("monitor")
        background.spawn("outbox", lambda: relay(broker, [monitor.jobs.collection, monitor.nodes.collection]))
        background.spawn("liveness", lambda: liveness_loop(monitor, settings.liveness_check_s))

    return FastStream(broker, lifespan=lifespan, after_startup=[start_loops])


async def liveness_loop(monitor: Monitor, interval_s: float) -> None:
    """Nodes that went silent, and jobs that ran past their max_duration_s."""
    while True:
        await monitor.check_silent_nodes(utcnow())
        await monitor.expire_overdue(utcnow())
        await asyncio.sleep(interval_s)
