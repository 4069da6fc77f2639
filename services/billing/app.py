"""Billing wiring: the append-only ledgers of attempts and node lifetimes, quotas, budget alerts."""

import logging
from pathlib import Path

from faststream import FastStream
from pydantic import Field

from shared.bus import TRANSIENT_ERRORS
from shared.noderecords import limits_from_file
from shared.service import Wiring, service_app
from shared.settings import CommonSettings, own_mongo_db, own_mongo_url
from shared.store import DocumentStore, relay
from services.billing.attempts import move_open_lines
from services.billing.handlers import JOBS, router
from services.billing.placements import Placements
from services.billing.service import Billing, build

SERVICE = "billing"
log = logging.getLogger(__name__)


class BillingSettings(CommonSettings):
    mongo_url: str = own_mongo_url(SERVICE)
    mongo_db: str = own_mongo_db(SERVICE)
    budget_check_s: float = Field(5.0, gt=0, description="How often running attempts are checked against budgets.")
    reconcile_s: float = Field(15.0, gt=0, description="How often open attempts are checked against job statuses.")
    cluster_file: Path = Field(
        Path("cluster.toml"),
        description="Its [[nodes]] are the static nodes' records: "
        "a registration is charged as its entry says, not as the agent claims.",
    )
    reconcile_grace_s: float = Field(
        30.0,
        ge=0,
        description="How long a status must have said an attempt ended "
        "before billing, with no end report of its own, closes it at that end.",
    )


def create_app(settings: BillingSettings | None = None) -> FastStream:
    settings = settings or BillingSettings()

    async def setup(w: Wiring) -> Billing:
        db = w.db
        billing = build(
            ledger=db.billing_ledger,
            ends=db.billing_ends,
            nodes=db.billing_nodes,
            nodes_open=db.billing_nodes_open,
            node_info=db.billing_node_info,
            quotas=db.billing_quotas,
            alerts=DocumentStore(db.billing_alerts, w.broker),
            placements=Placements(jobs=db.billing_jobs, attempts=db.billing_attempts, parked=db.billing_parked),
            reconcile_grace_s=settings.reconcile_grace_s,
            static=limits_from_file(settings.cluster_file),
        )
        attempts = billing.attempts
        await attempts.ledger.create_index([("project_id", 1), ("started_at", 1)])
        await attempts.ledger.create_index([("project_id", 1), ("t0", 1)])
        await attempts.ledger.create_index("ended_at")
        if backfilled := await attempts.backfill_epochs():
            log.info("ledger: %d lines given Unix-second bounds or a stamp", backfilled)
        await attempts.ledger.create_index("open")  # the open lines, read at the start
        if moved := await move_open_lines(db.billing_open, attempts.ledger):
            log.info("ledger: %d open lines moved in from billing_open", moved)
        log.info("%d attempts running", await attempts.load())
        await attempts.placements.jobs.create_index([("project_id", 1), ("finished", 1)])  # max_gpus: queued jobs
        await db.billing_parked.create_index("attempt_key")
        await db.billing_parked.create_index("parked_at")
        await billing.lifetimes.nodes.create_index("ended_at")
        # Running attempts spend money without any event: look at every budget now and then.
        w.background.every("budgets", settings.budget_check_s, billing.alerts.check_all, tolerate=TRANSIENT_ERRORS)
        # A close lost when a service is killed mid-ack would leave an attempt open (and charged) for ever.
        w.background.every("reconcile", settings.reconcile_s, attempts.reconcile, tolerate=TRANSIENT_ERRORS)
        w.background.spawn("outbox", lambda: relay(w.broker, [billing.alerts.store.collection]))
        await JOBS.resume(w.broker)  # before any job event is read
        return billing

    return service_app(name=SERVICE, settings=settings, router=router, setup=setup)
