"""Billing wiring: the append-only ledgers of attempts and node lifetimes, quotas, budget alerts."""
import asyncio
import logging
from contextlib import asynccontextmanager

from faststream import FastStream
from pydantic import Field

from shared.bus import TRANSIENT_ERRORS, connect, make_broker, publish
from shared.events import Message
from shared.service import Background, add_health, configure_logging
from shared.settings import CommonSettings
from shared.store import make_client
from services.billing.handlers import router
from services.billing.service import Billing

SERVICE = "billing"
log = logging.getLogger(__name__)


class BillingSettings(CommonSettings):
    budget_check_s: float = Field(5.0, gt=0, description="How often running attempts are checked against budgets.")


async def check_budgets_forever(billing: Billing, *, interval_s: float) -> None:
    """Running attempts spend money without any event: look at every budget now and then."""
    while True:
        try:
            await billing.check_all_budgets()
        except TRANSIENT_ERRORS as exc:
            log.warning("budget check: %r", exc)
        await asyncio.sleep(interval_s)


def create_app(settings: BillingSettings | None = None) -> FastStream:
    settings = settings or BillingSettings()
    configure_logging(settings.log_level)
    broker = make_broker(settings.nats_url, name=SERVICE)
    broker.include_router(router)
    add_health(broker, SERVICE)
    background = Background()

    async def publish_message(message: Message) -> None:
        await publish(broker, message)

    @asynccontextmanager
    async def lifespan():
        await connect(broker)
        client = make_client(settings.mongo_url)
        db = client[settings.mongo_db]
        billing = Billing(ledger=db.billing_ledger, open=db.billing_open, nodes=db.billing_nodes,
                          nodes_open=db.billing_nodes_open, node_info=db.billing_node_info,
                          quotas=db.billing_quotas, alerts=db.billing_alerts, publish=publish_message)
        await billing.ledger.create_index([("project_id", 1), ("started_at", 1)])
        await billing.ledger.create_index([("project_id", 1), ("t0", 1)])
        await billing.ledger.create_index("ended_at")
        if backfilled := await billing.backfill_epochs():
            log.info("ledger: %d lines given Unix-second bounds", backfilled)
        await billing.open.create_index("node_id")
        await billing.nodes.create_index("ended_at")
        broker.context.set_global("billing", billing)
        background.spawn("budgets", lambda: check_budgets_forever(billing, interval_s=settings.budget_check_s))
        yield
        await background.stop()
        await client.close()

    return FastStream(broker, lifespan=lifespan)
