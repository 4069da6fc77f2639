"""Submitter wiring: the REST API (FastAPI) and its bus subscriptions, in one process."""

import logging
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.telemetry import TelemetryConfig
from faststream.nats import NatsBroker
from pydantic import Field, SecretStr, field_validator

from shared import egress
from shared.bus import read_up
from shared.origin import Origins
from shared.service import Wiring, running, wire
from shared.settings import CommonSettings, own_mongo_db, own_mongo_url
from shared.storage import StoragePolicy, StorageSettings
from shared.store import relay
from services.submitter import (
    apidocs,
    audit,
    dialects,
    errors,
    notifications,
    portal,
    routes_admin,
    routes_billing,
    routes_catalogue,
    routes_jobs,
    routes_users,
    sealing,
)
from services.submitter.auth import MAX_TOKENS_PER_USER, Tokens, check_admin_token
from services.submitter.caps import QueueCaps
from services.submitter.handlers import PLACED, router as bus_router
from services.submitter.intake import Intake
from services.submitter.limits import BodyLimit, RateLimiter
from services.submitter.repository import Repository
from services.submitter.rpc import Requester
from services.submitter.sealing import Sealer
from services.submitter.searches import routes as routes_searches
from services.submitter.searches.driver import Driver
from services.submitter.searches.store import SearchStore
from services.submitter.searches.trials import SubmitterPort
from services.submitter.usecases import Submitter
from services.submitter.views import SECRET_VALUES

log = logging.getLogger(__name__)
SERVICE = "submitter"
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


class SubmitterSettings(CommonSettings, StorageSettings):
    mongo_url: str = own_mongo_url(SERVICE)
    mongo_db: str = own_mongo_db(SERVICE)
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_max_connections: int = Field(
        1000,
        ge=1,
        description="Connections (and requests in progress) the API holds at once; beyond it a request is answered "
        "503 (idle keep-alive connections are held 75 s: expose the API behind a proxy that caps connections per "
        "client).",
    )
    admin_token: str | None = Field(None, description="The admin token (32+ characters); a new one revokes the old.")
    webhook_allow_hosts: str = Field(
        "",
        description="Comma-separated hosts, IPs or networks (10.0.0.0/8) webhooks "
        "may reach although they are not public.",
    )
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Larger request bodies get 413.")
    rate_per_s: float = Field(
        20,
        gt=0,
        description="Requests a second per user, all his tokens together (token bucket); the admin's are not limited.",
    )
    rate_burst: float = Field(100, ge=1, description="Requests a user may make at once.")
    max_tokens_per_user: int = Field(
        MAX_TOKENS_PER_USER,
        ge=1,
        description="Live (unexpired, unrevoked) tokens a user may hold; the admin's are not counted.",
    )
    max_queued_per_project: int = Field(1000, ge=1, description="Jobs accepted but not yet running, per project.")
    max_queued_per_user: int = Field(500, ge=1, description="Jobs accepted but not yet running, per user.")
    max_running_searches_per_project: int = Field(
        20, ge=1, description="Searches running at once per project (each keeps up to its parallelism of trials)."
    )
    log_cap_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="Stored output per job; the oldest goes.")
    search_pass_s: float = Field(2.0, gt=0, le=300, description="Seconds between the search driver's passes.")
    secrets_keys: SecretStr | None = Field(
        None,
        description="Keys that seal jobs' secrets in the database (comma-separated Fernet keys: the first seals, "
        "all open); unset: a key file made in the data directory at the first start (services/submitter/sealing.py).",
    )

    @field_validator("admin_token")
    @classmethod
    def _admin_token_long_enough(cls, value: str | None) -> str | None:
        return check_admin_token(value or None)  # empty: unset (compose passes an unset variable so)


def build_submitter(
    settings: SubmitterSettings, *, repo: Repository, broker: NatsBroker, storage: StoragePolicy
) -> Submitter:
    """The use cases, once: the repository, the intake and queue caps, the storage policy, the bus."""
    caps = QueueCaps(per_project=settings.max_queued_per_project, per_user=settings.max_queued_per_user)
    keys = settings.secrets_keys.get_secret_value() if settings.secrets_keys is not None else None
    return Submitter(
        repo=repo,
        intake=Intake(repo, caps),
        caps=caps,
        storage=storage,
        requester=Requester(broker),
        sealer=Sealer.configured(keys, data_dir=settings.data_dir),
    )


async def open_api(app: FastAPI, w: Wiring, settings: SubmitterSettings, storage: StoragePolicy) -> None:
    """The API's stores (indexes made), the first admin token and the API's loops; in app.state for the routes."""
    db = w.db
    repo = Repository(
        db=db,
        broker=w.broker,
        log_cap_bytes=settings.log_cap_bytes,
        origins=Origins(placements=db.api_placements, all_read=lambda: read_up(w.broker, PLACED)),
    )
    tokens = Tokens(db.api_users, db.api_tokens, max_per_user=settings.max_tokens_per_user)
    audit_log = audit.AuditLog(db.api_audit)
    searches = SearchStore(db.api_searches, max_running_per_project=settings.max_running_searches_per_project)
    await repo.create_indexes()
    log.info("%d jobs accepted and not yet running", await repo.rebuild_views())
    await searches.create_indexes()
    await tokens.prepare()
    await audit_log.prepare()
    w.broker.context.set_global("repo", repo)  # the bus handlers' store
    w.closing.append(repo.views.close)  # the view entries that wait, once the bus handlers stopped
    w.closing.append(repo.store.pull_now)  # the announcements published and not yet pulled off their outboxes
    await bootstrap_admin(tokens, audit_log, settings)
    app.state.tokens, app.state.audit, app.state.searches = tokens, audit_log, searches
    app.state.submitter = submitter = build_submitter(settings, repo=repo, broker=w.broker, storage=storage)
    # keys that cannot open what the other replicas sealed stop the start here, before a job is sealed with them
    holders = [sealing.Holder(db.api_jobs), sealing.Holder(db.api_searches, version="version")]
    sealed = sealing.SealedStore(db.api_sealing, holders, field=SECRET_VALUES)
    await sealed.agree(submitter.sealer)
    w.broker.context.set_global("sealer", submitter.sealer)  # opens a job's secrets for its node (`handlers`)
    w.background.spawn("reseal", lambda: sealed.reseal(submitter.sealer))
    w.background.spawn("outbox", lambda: relay(w.broker, [db.api_jobs]))
    w.background.spawn("webhooks", lambda: notifications.deliver_forever(repo.notifications, policy=app.state.egress))
    w.background.spawn(
        "searches", Driver(store=searches, port=SubmitterPort(submitter), interval_s=settings.search_pass_s).run_forever
    )


async def bootstrap_admin(tokens: Tokens, audit_log: audit.AuditLog, settings: SubmitterSettings) -> None:
    """The admin's token: a generated one shown once, a rotated one's predecessors revoked and audited."""
    generated = await tokens.bootstrap_admin(configured=settings.admin_token, data_dir=settings.data_dir)
    if generated:  # the path, not the token: this output is the API's log file under `make run` and compose
        print(f"\n  trainmaster admin token generated: {settings.data_dir / 'admin-token'} (0600)\n", flush=True)
    for token_id in tokens.revoked_at_start:
        await audit_log.begin(
            principal=None,
            action="admin_token.rotate",
            method="",
            path="",
            template="",
            project_id=None,
            target_id=token_id,
            client_ip="",
            state="done",
        )


def create_app(settings: SubmitterSettings | None = None) -> FastAPI:
    settings = settings or SubmitterSettings()
    w = wire(name=SERVICE, settings=settings, router=bus_router)
    storage = settings.storage_policy(settings.data_dir)  # the URLs jobs may use, as the agents check

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with running(w, settings=settings, setup=lambda w: open_api(app, w, settings, storage), start=True):
            yield

    app = FastAPI(
        title="trainmaster",
        version="0.1.0",
        lifespan=lifespan,
        dependencies=[Depends(audit.record)],
        docs_url=None,
        redoc_url=None,
        description="Run AI training jobs on a hybrid fleet of owned, reserved and on-demand GPU nodes.",
        # No OpenTelemetry here: FastAPI would look up the global providers (environment reads) on every request
        # to learn that none is set, about 3% of the API's CPU under a burst.
        telemetry=NO_TELEMETRY,
    )
    app.state.rate = RateLimiter(rate=settings.rate_per_s, burst=settings.rate_burst)
    app.state.egress = egress.Policy.parse(settings.webhook_allow_hosts.split(","))  # webhooks only
    app.add_middleware(audit.AuditMiddleware)  # inside the body limit: a refused body changes nothing
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(portal.SecurityHeaders)
    errors.install(app)
    app.include_router(routes_jobs.router)
    app.include_router(routes_searches.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_users.router)
    app.include_router(audit.router)
    app.include_router(routes_billing.router)
    app.include_router(routes_catalogue.router)
    app.include_router(notifications.router)
    app.include_router(dialects.router)
    app.include_router(portal.router)
    app.include_router(apidocs.router)  # /docs and /redoc, from the files the portal serves
    return app
