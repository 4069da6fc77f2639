"""Monitor wiring: owns the job status projection and node liveness."""
import asyncio

from faststream import FastStream

from shared.clock import utcnow
from shared.service import Wiring, service_app
from shared.settings import CommonSettings
from shared.store import DocumentStore, relay
from services.monitor.handlers import router
from services.monitor.service import Monitor

SERVICE = "monitor"


class MonitorSettings(CommonSettings):
    liveness_check_s: float = 1.0


def create_app(settings: MonitorSettings | None = None) -> FastStream:
    settings = settings or MonitorSettings()

    async def setup(w: Wiring) -> Monitor:
        monitor = Monitor(jobs=DocumentStore(w.db.monitor_jobs, w.broker), nodes=DocumentStore(w.db.monitor_nodes,
                          w.broker), node_timeout_s=settings.node_timeout_s, started_at=utcnow(), link=w.link)
        w.background.spawn("outbox", lambda: relay(w.broker, [monitor.jobs.collection, monitor.nodes.collection]))
        w.background.spawn("liveness", lambda: liveness_loop(monitor, settings.liveness_check_s))
        return monitor

    return service_app(name=SERVICE, settings=settings, router=router, setup=setup)


async def liveness_loop(monitor: Monitor, interval_s: float) -> None:
    """Nodes that went silent, and jobs that ran past their max_duration_s."""
    while True:
        await monitor.check_silent_nodes(utcnow())
        await monitor.expire_overdue(utcnow())
        await asyncio.sleep(interval_s)
