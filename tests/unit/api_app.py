"""The submitter's real FastAPI app (middleware, dependencies, routes) on in-memory collections, without the bus."""

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from cryptography.fernet import Fernet

from shared.egress import Policy
from services.submitter.app import SubmitterSettings, build_submitter, create_app
from services.submitter.audit import AuditLog
from services.submitter.auth import Tokens
from services.submitter.repository import Repository
from tests.memory import MemoryCollection

ADMIN_TOKEN = "unit-admin-token-0123456789abcdef0123"


@dataclass
class FakeBroker:
    """Answers request/reply with canned payloads per subject."""

    answers: dict[str, Any] = field(default_factory=dict)

    async def request(self, payload, subject: str, timeout: float = 0):
        answer = self.answers[subject]
        return SimpleNamespace(decode=lambda: _async(answer))


async def _async(value):
    return value


class Db(SimpleNamespace):
    def __getattr__(self, name: str) -> MemoryCollection:  # any collection, created on first use
        collection = MemoryCollection(name)
        setattr(self, name, collection)
        return collection


async def make_app(*, allow: list[str] | None = None, clock=None, broker=None, repo=None):
    """(app, db, tokens) with the admin's token ADMIN_TOKEN; nothing listens, requests go through ASGI. The use
    cases (`app.state.submitter`) work on `repo` (a Repository on the in-memory collections unless given) and ask
    over `broker` (a FakeBroker unless given)."""
    # a key of its own: never the key file of the checkout's data directory
    settings = SubmitterSettings(
        admin_token=ADMIN_TOKEN, nats_url="nats://127.0.0.1:1", secrets_keys=Fernet.generate_key().decode()
    )
    app = create_app(settings)
    db = Db()
    tokens = Tokens(db.api_users, db.api_tokens, **({"clock": clock} if clock else {}))
    await tokens.prepare()
    await tokens.bootstrap_admin(configured=ADMIN_TOKEN, data_dir=Path("/nonexistent"))  # configured: never read
    app.state.tokens, app.state.audit = tokens, AuditLog(db.api_audit)
    broker = broker or FakeBroker()
    app.state.submitter = build_submitter(
        settings,
        repo=repo or Repository(db=db, broker=broker),
        broker=broker,
        storage=settings.storage_policy(settings.data_dir),
    )
    app.state.egress = Policy.parse(allow or [])
    return app, db, tokens


def client(app, token: str | None = ADMIN_TOKEN) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("203.0.113.7", 40000)),
        base_url="http://api.test",
        headers=headers,
    )


async def add_user(
    tokens: Tokens, name: str, projects: list[str], *, admin: bool = False, expires_in: int | None = None
) -> str:
    await tokens.users.insert_one({"_id": name, "projects": projects, "admin": admin})
    token, _ = await tokens.issue(name, expires_in=expires_in)
    return token


__all__ = ["ADMIN_TOKEN", "FakeBroker", "add_user", "client", "make_app"]
