"""Placement wiring: a single process that owns the queue and decides where each attempt runs."""
from contextlib import asynccontextmanager

from faststream import FastStream
from pydantic import Field

from shared.bus import connect, make_broker
from shared.service import Background, add_health, configure_logging
from shared.settings import CommonSettings
from shared.store import DocumentStore, make_client, relay
from services.placement.handlers import router
from services.placement.service import Placement, scheduling_loop

SERVICE = "placement"


class PlacementSettings(CommonSettings):
    schedule_tick_s: float = 5.0
    slow_factor: float = Field(1.5, gt=1, description="Estimated total beyond this times the expected: too slow.")


def create_app(settings: PlacementSettings | None = None) -> FastStream:
    settings = settings or PlacementSettings()
    configure_logging(settings.log_level)
    broker = make_broker(settings.nats_url, name=SERVICE)
    broker.include_router(router)
    add_health(broker, SERVICE)
    background = Background()

    @asynccontextmanager
    async def lifespan():
        await connect(broker)
        client = make_client(settings.mongo_url)
        db = client[settings.mongo_db]
        placement = Placement(jobs=DocumentStore(db.placement_jobs, broker),
                              nodes=DocumentStore(db.placement_nodes, broker), slow_factor=settings.slow_factor)
        await placement.load()
        broker.context.set_global("placement", placement)
        yield
        await background.stop()
        await client.close()

    async def start_loops() -> None:
        placement: Placement = broker.context.get("placement")
        background.spawn("outbox", lambda: relay(broker, [placement.jobs.collection]))
        background.spawn("schedule", lambda: scheduling_loop(placement, tick_s=settings.schedule_tick_s))

    return FastStream(broker, lifespan=lifespan, after_startup=[start_loops])
