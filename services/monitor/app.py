"""Monitor wiring: owns the job status projection and node liveness."""

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
        w.background.every("liveness", settings.liveness_check_s, monitor.check_liveness)
        return monitor

    return service_app(name=SERVICE, settings=settings, router=router, setup=setup)
