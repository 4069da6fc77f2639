"""Bearer tokens: each belongs to a user and the projects it may use; stored hashed; the admin acts everywhere."""
import hashlib
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from pymongo.asynchronous.collection import AsyncCollection

from services.submitter.errors import NO_PERMISSION, UNAUTHENTICATED, ApiError
from shared.clock import utcnow

log = logging.getLogger(__name__)

ADMIN = "admin"
TOKEN_PREFIX = "tm_"


@dataclass(frozen=True)
class Principal:
    user_name: str
    projects: frozenset[str]
    is_admin: bool = False

    def require_project(self, project_id: str) -> None:
        if not self.is_admin and project_id not in self.projects:
            raise ApiError(403, NO_PERMISSION, f"no operation permission on project {project_id}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise ApiError(403, NO_PERMISSION, "only the admin may do this")


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tokens:
    def __init__(self, users: AsyncCollection, tokens: AsyncCollection) -> None:
        self.users, self.tokens = users, tokens

    async def issue(self, user_name: str) -> str:
        token = new_token()
        await self.tokens.insert_one({"_id": digest(token), "user_name": user_name, "created_at": utcnow()})
        return token

    async def principal(self, token: str) -> Principal | None:
        record = await self.tokens.find_one({"_id": digest(token)})
        if record is None:
            return None
        user = await self.users.find_one({"_id": record["user_name"]})
        if user is None or user.get("disabled"):
            return None
        return Principal(user_name=user["_id"], projects=frozenset(user.get("projects", [])),
                         is_admin=bool(user.get("admin")))

    async def bootstrap_admin(self, *, configured: str | None, data_dir: Path) -> str | None:
        """Make sure the admin exists with a token; return a newly generated token (to print once), else None."""
        await self.users.update_one({"_id": ADMIN}, {"$setOnInsert": {"projects": [], "admin": True,
                                                                       "created_at": utcnow()}}, upsert=True)
        if configured:
            await self.tokens.update_one({"_id": digest(configured)},
                                         {"$setOnInsert": {"user_name": ADMIN, "created_at": utcnow()}}, upsert=True)
            return None
        if await self.tokens.find_one({"user_name": ADMIN}):
            return None
        token = await self.issue(ADMIN)
        path = data_dir / "admin-token"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token + "\n")
        path.chmod(0o600)
        return token


async def authenticate(request: Request) -> Principal:
    """FastAPI dependency: the caller, from `Authorization: Bearer <token>`."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, UNAUTHENTICATED, "missing Authorization: Bearer <token> header")
    principal = await request.app.state.tokens.principal(token.strip())
    if principal is None:
        raise ApiError(401, UNAUTHENTICATED, "token is not valid")
    return principal
