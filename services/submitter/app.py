"""Submitter wiring: the REST API (FastAPI) and its bus subscriptions, in one process."""
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from pydantic import Field

from shared.bus import connect, make_broker
from shared.service import Background, add_health, configure_logging
from shared.settings import CommonSettings
from shared.store import make_client, relay
from services.submitter import errors, notifications, routes_admin, routes_billing, routes_catalogue, routes_jobs
from services.submitter import dialects, portal
from services.submitter.auth import Tokens
from services.submitter.handlers import router as bus_router
from services.submitter.repository import Repository

log = logging.getLogger(__name__)
SERVICE = "submitter"


class SubmitterSettings(CommonSettings):
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    admin_token: str | None = Field(None, description="Becomes the admin token on first start when set.")


def create_app(settings: SubmitterSettings | None = None) -> FastAPI:
    settings = settings or SubmitterSettings()
    configure_logging(settings.log_level)
    broker = make_broker(settings.nats_url, name=SERVICE)
    broker.include_router(bus_router)
    add_health(broker, SERVICE)
    background = Background()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = make_client(settings.mongo_url)
        db = client[settings.mongo_db]
        repo = Repository(db=db, broker=broker)
        tokens = Tokens(db.api_users, db.api_tokens)
        await repo.create_indexes()
        broker.context.set_global("repo", repo)
        await connect(broker)
        await broker.start()
        generated = await tokens.bootstrap_admin(configured=settings.admin_token, data_dir=settings.data_dir)
        if generated:
            print(f"\n  trainmaster admin token (shown once, also in {settings.data_dir / 'admin-token'}):\n"
                  f"  {generated}\n", flush=True)
        app.state.repo, app.state.tokens, app.state.broker = repo, tokens, broker
        background.spawn("outbox", lambda: relay(broker, [db.api_jobs]))
        background.spawn("webhooks", lambda: notifications.deliver_forever(db))
        yield
        await background.stop()
        await broker.stop()
        await client.close()

    app = FastAPI(title="trainmaster", version="0.1.0", lifespan=lifespan,
                  description="Run AI training jobs on a hybrid fleet of owned, reserved and on-demand GPU nodes.")
    errors.install(app)
    app.include_router(routes_jobs.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_billing.router)
    app.include_router(routes_catalogue.router)
    app.include_router(notifications.router)
    app.include_router(dialects.router)
    app.include_router(portal.router)
    return app
