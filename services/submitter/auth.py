"""Bearer tokens: each belongs to a user and the projects it may use; stored hashed; the admin acts everywhere."""

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fastapi import Request
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from shared.buscreds import write_secret
from shared.clock import as_utc, utcnow
from shared.lru import Lru
from services.submitter.errors import NO_PERMISSION, PARAM_INVALID, UNAUTHENTICATED, ApiError
from services.submitter.limits import tokens_full

log = logging.getLogger(__name__)

ADMIN = "admin"
TOKEN_PREFIX = "tm_"
MIN_ADMIN_TOKEN = 32  # the generated ones have 43 random characters; a configured one must not be guessable
TOUCH_EVERY_S = 60.0  # "last used" to the minute: one write per token a minute, not one per request
PROJECT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a subject token and a path segment (storage prefixes)
BOOTSTRAP = ("configured", "generated")  # tokens the submitter made at start, not a person through the API
MAX_TOKENS_PER_USER = 20  # live tokens a user may hold: each is another secret that can leak and another key to audit
# A token and its user, read once, serve this long: two database commands a request saved. A revocation through
# this submitter drops its copy at once; another API replica may still accept a revoked token (or a user disabled
# in the database) this long. Expiry is checked on every request from the stored date.
CACHE_S = 5.0
CACHE_SIZE = 4096  # tokens remembered at most (a stranger's guesses are never remembered)


@dataclass(frozen=True)
class Principal:
    user_name: str
    projects: frozenset[str]
    is_admin: bool = False
    token_id: str = ""
    expires_s: float | None = None  # when the token this request came with stops working (None: never)

    def require_project(self, project_id: str) -> None:
        if not PROJECT_ID.match(project_id):
            raise ApiError(
                400, PARAM_INVALID, f"param[project_id] invalid: {project_id[:80]!r} must match {PROJECT_ID.pattern}"
            )
        if not self.is_admin and project_id not in self.projects:
            raise ApiError(403, NO_PERMISSION, f"no operation permission on project {project_id}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise ApiError(403, NO_PERMISSION, "only the admin may do this")

    def require_self_or_admin(self, user_name: str) -> None:
        if self.user_name != user_name:
            self.require_admin()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_token_id() -> str:
    return "tk_" + secrets.token_hex(8)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_admin_token(value: str | None) -> str | None:
    """A configured admin token must be long enough not to be guessed."""
    if value is not None and len(value) < MIN_ADMIN_TOKEN:
        raise ValueError(
            f"TRAINMASTER_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN} characters (it has "
            f"{len(value)}); leave it unset to have one generated"
        )
    return value


def iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def public(doc: dict) -> dict:
    """What a token's owner and the admin may see of it: never the secret nor its hash."""
    return {
        "token_id": doc["token_id"],
        "user_name": doc["user_name"],
        "created": iso(doc.get("created_s")),
        "expires": iso(doc.get("expires_s")),
        "last_used": iso(doc.get("last_used_s")),
        "source": doc.get("source", "api"),
    }


class Tokens:
    def __init__(
        self,
        users: AsyncCollection,
        tokens: AsyncCollection,
        *,
        clock: Callable[[], float] = time.time,
        max_per_user: int = MAX_TOKENS_PER_USER,
        cache_s: float = CACHE_S,
    ) -> None:
        self.users, self.tokens, self.clock, self.max_per_user = users, tokens, clock, max_per_user
        self.cache_s = cache_s
        self._known: Lru[str, tuple[float, dict, dict]] = Lru(CACHE_SIZE if cache_s > 0 else 0)
        self.revoked_at_start: list[str] = []  # admin token ids a changed admin token replaced (for the audit log)
        self._issuing = asyncio.Lock()  # the count of a user's live tokens and the insert are one step (one submitter)

    async def prepare(self) -> None:
        """A public id for tokens stored before tokens had one, then the indexes."""
        async for doc in self.tokens.find({}):
            if not doc.get("token_id"):
                created = doc.get("created_at")
                created_s = as_utc(created).timestamp() if isinstance(created, datetime) else self.clock()
                await self.tokens.update_one(
                    {"_id": doc["_id"]}, {"$set": {"token_id": new_token_id(), "created_s": created_s}}
                )
        await self.tokens.create_index("token_id", unique=True)
        await self.tokens.create_index("user_name")

    async def issue(
        self,
        user_name: str,
        *,
        expires_in: int | None = None,
        source: str = "api",
        capped: bool = True,
        not_after: float | None = None,
    ) -> tuple[str, dict]:
        """A new token for the user (the secret, returned once) and what may be shown of it, expiring by
        `not_after` at the latest; 409 (406035) when `capped` and the user already holds `max_per_user` live
        tokens."""
        async with self._issuing:
            token, now = new_token(), self.clock()
            if capped:
                refusal = tokens_full(
                    user_name=user_name, live=await self.live_count(user_name, now=now), cap=self.max_per_user
                )
                if refusal is not None:
                    raise refusal
            doc = {
                "_id": digest(token),
                "token_id": new_token_id(),
                "user_name": user_name,
                "created_at": utcnow(),
                "created_s": now,
                "expires_s": _earlier(now + expires_in if expires_in else None, not_after),
                "last_used_s": None,
                "source": source,
            }
            await self.tokens.insert_one(doc)
        return token, public(doc)

    async def live_count(self, user_name: str, *, now: float) -> int:
        """The user's tokens that still work (a revoked one is deleted; an expired one is kept until revoked)."""
        return await self.tokens.count_documents(
            {"user_name": user_name, "$or": [{"expires_s": None}, {"expires_s": {"$gt": now}}]}
        )

    async def principal(self, token: str) -> Principal | None:
        """Who holds the token; None when it is unknown or its user is gone; 401 when it has expired."""
        key, now = digest(token), self.clock()
        found = await self._lookup(key, now=now)
        if found is None:
            return None
        record, user = found
        if record.get("expires_s") is not None and now >= record["expires_s"]:
            raise ApiError(401, UNAUTHENTICATED, f"token {record.get('token_id', '')} has expired")
        if now - (record.get("last_used_s") or 0) >= TOUCH_EVERY_S:
            await self.tokens.update_one({"_id": record["_id"]}, {"$set": {"last_used_s": now}})
            record["last_used_s"] = now  # the remembered copy too: one touch a minute, not one per cache miss
        return Principal(
            user_name=user["_id"],
            projects=frozenset(user.get("projects", [])),
            is_admin=bool(user.get("admin")),
            token_id=record.get("token_id", ""),
            expires_s=record.get("expires_s"),
        )

    async def _lookup(self, key: str, *, now: float) -> tuple[dict, dict] | None:
        """The token's record and its user: remembered for `cache_s`, else read (and remembered when valid)."""
        known = self._known.get(key)
        if known is not None and 0 <= now - known[0] < self.cache_s:
            return known[1], known[2]
        self._known.pop(key)
        record = await self.tokens.find_one({"_id": key})
        if record is None:
            return None
        user = await self.users.find_one({"_id": record["user_name"]})
        if user is None or user.get("disabled"):
            return None
        self._known.put(key, (now, record, user))
        return record, user

    async def user(self, user_name: str) -> dict | None:
        return await self.users.find_one({"_id": user_name})

    async def all_users(self) -> list[dict]:
        """Every user, by name."""
        return [d async for d in self.users.find({}).sort("_id", 1)]

    async def add_user(self, user: dict) -> None:
        """Store a new user; DuplicateKeyError when the name is taken."""
        await self.users.insert_one(user)

    async def of_user(self, user_name: str) -> list[dict]:
        """The user's tokens, oldest first, without secrets."""
        docs = [d async for d in self.tokens.find({"user_name": user_name})]
        return [public(d) for d in sorted(docs, key=lambda d: d.get("created_s") or 0)]

    async def revoke(self, user_name: str, token_id: str) -> bool:
        """Delete the token; it stops working here at once (another API replica: within `cache_s`)."""
        doc = await self.tokens.find_one_and_delete({"user_name": user_name, "token_id": token_id})
        if doc is not None:
            self._known.pop(doc["_id"])
        return doc is not None

    async def bootstrap_admin(self, *, configured: str | None, data_dir: Path) -> str | None:
        """Make sure the admin exists with a token; return a newly generated token (to print once), else None.

        A configured token replaces every token made at an earlier start (a changed one revokes the old); without
        one, a token configured earlier is revoked and the generated one (kept in the data directory) is used, one
        replica at a time (`generating`)."""
        check_admin_token(configured)
        if configured:
            return await self._bootstrap_admin(configured=configured, data_dir=data_dir)
        async with generating(data_dir):
            return await self._bootstrap_admin(configured=None, data_dir=data_dir)

    async def _bootstrap_admin(self, *, configured: str | None, data_dir: Path) -> str | None:
        await self.users.update_one(
            {"_id": ADMIN}, {"$setOnInsert": {"projects": [], "admin": True, "created_at": utcnow()}}, upsert=True
        )
        made_at_start = [
            d async for d in self.tokens.find({"user_name": ADMIN}) if d.get("source") in (*BOOTSTRAP, None)
        ]  # None: stored before tokens had a source
        keep = digest(configured) if configured else None
        if not configured:
            path = data_dir / "admin-token"
            on_file = digest(path.read_text().strip()) if path.is_file() else None
            keep = on_file if any(d["_id"] == on_file for d in made_at_start) else None
        for doc in made_at_start:
            if doc["_id"] != keep:
                await self.tokens.delete_one({"_id": doc["_id"]})
                self._known.pop(doc["_id"])
                self.revoked_at_start.append(doc.get("token_id", ""))
                log.warning("admin token %s revoked: the admin token changed", doc.get("token_id", "?"))
        if configured:
            if not await self.tokens.find_one({"_id": keep}):
                now = self.clock()
                with contextlib.suppress(DuplicateKeyError):  # another replica starting beside it stored it first
                    await self.tokens.insert_one(
                        {
                            "_id": keep,
                            "token_id": new_token_id(),
                            "user_name": ADMIN,
                            "created_at": utcnow(),
                            "created_s": now,
                            "expires_s": None,
                            "last_used_s": None,
                            "source": "configured",
                        }
                    )
            return None
        if keep:
            return None
        token, _ = await self.issue(ADMIN, source="generated", capped=False)
        write_secret(data_dir / "admin-token", token + "\n", private_folder=False)
        return token


@contextlib.asynccontextmanager
async def generating(data_dir: Path) -> AsyncIterator[None]:
    """The data directory's lock on the generated admin token, held while a replica reads, revokes and makes it.
    Two API replicas of `make run` start together on one data directory: one stored its token, the other read it
    as a stale token not on file, revoked it, made its own, and the first then wrote its revoked token to the file
    (the admin locked out until the next start). Replicas on other machines have other data directories: they
    need a configured token (TRAINMASTER_ADMIN_TOKEN)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(data_dir / "admin-token.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with it


def _earlier(a: float | None, b: float | None) -> float | None:
    """The earlier of two expiries, None being never."""
    return b if a is None else a if b is None else min(a, b)


async def authenticate(request: Request) -> Principal:
    """FastAPI dependency: the caller, from `Authorization: Bearer <token>` (looked up once per request)."""
    known = getattr(request.state, "principal", None)
    if known is not None:
        return known
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, UNAUTHENTICATED, "missing Authorization: Bearer <token> header")
    principal = await request.app.state.tokens.principal(token.strip())
    if principal is None:
        raise ApiError(401, UNAUTHENTICATED, "token is not valid")
    if not principal.is_admin:  # requests per user, whatever his tokens (limits.py); the operator is not limited
        request.app.state.rate.charge(principal.user_name, time.monotonic())
    request.state.principal = principal
    return principal
