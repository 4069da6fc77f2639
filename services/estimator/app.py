"""Estimator wiring: remaining-time estimates from each job's own metric curve."""
from contextlib import asynccontextmanager

from faststream import FastStream

from shared.bus import connect, make_broker
from shared.service import add_health, configure_logging
from shared.settings import CommonSettings
from shared.store import make_client
from services.estimator.handlers import router
from services.estimator.service import Estimator

SERVICE = "estimator"


def create_app(settings: CommonSettings | None = None) -> FastStream:
    settings = settings or CommonSettings()
    configure_logging(settings.log_level)
    broker = make_broker(settings.nats_url, name=SERVICE)
    broker.include_router(router)
    add_health(broker, SERVICE)

    @asynccontextmanager
    async def lifespan():
        await connect(broker)
        client = make_client(settings.mongo_url)
        db = client[settings.mongo_db]
        estimator = Estimator(broker=broker, jobs=db.estimator_jobs, points=db.estimator_points)
        await estimator.points.create_index([("job_id", 1), ("t", 1)])
        broker.context.set_global("estimator", estimator)
        yield
        await client.close()

    return FastStream(broker, lifespan=lifespan)
