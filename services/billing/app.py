"""Billing wiring: the append-only usage ledger."""
from contextlib import asynccontextmanager

from faststream import FastStream

from shared.bus import connect, make_broker
from shared.service import add_health, configure_logging
from shared.settings import CommonSettings
from shared.store import make_client
from services.billing.handlers import router
from services.billing.service import Billing

SERVICE = "billing"


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
        billing = Billing(ledger=db.billing_ledger, open=db.billing_open)
        await billing.ledger.create_index([("project_id", 1), ("started_at", 1)])
        await billing.open.create_index("node_id")
        broker.context.set_global("billing", billing)
        yield
        await client.close()

    return FastStream(broker, lifespan=lifespan)
