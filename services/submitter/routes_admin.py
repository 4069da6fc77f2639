"""Everything around jobs: users and tokens, nodes, liveness (usage and quotas: routes_billing)."""
import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pymongo.errors import DuplicateKeyError

from shared.bus import RPC_HEALTH, RPC_NODES, SERVICES
from shared.clock import utcnow
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.errors import ApiError
from services.submitter.rpc import ask

router = APIRouter()


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    projects: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = Field(default_factory=list,
                                                                                     max_length=100)
    admin: bool = False


class User(BaseModel):
    user_name: str
    projects: list[str]
    admin: bool


class IssuedToken(User):
    token: str = Field(description="Shown once; only its hash is stored.")


@router.post("/v2/users", status_code=201, response_model=IssuedToken, tags=["users"], summary="Create a user")
async def create_user(body: UserCreate, request: Request, principal: Principal = Depends(authenticate)):
    principal.require_admin()
    tokens = request.app.state.tokens
    try:
        await tokens.users.insert_one({"_id": body.user_name, "projects": body.projects, "admin": body.admin,
                                       "created_at": utcnow()})
    except DuplicateKeyError:
        raise ApiError(409, errors.USER_EXISTS, f"user {body.user_name} already exists") from None
    token = await tokens.issue(body.user_name)
    return IssuedToken(user_name=body.user_name, projects=body.projects, admin=body.admin, token=token)


@router.get("/v2/users", response_model=list[User], tags=["users"], summary="List users")
async def list_users(request: Request, principal: Principal = Depends(authenticate)):
    principal.require_admin()
    docs = [d async for d in request.app.state.tokens.users.find({}).sort("_id", 1)]
    return [User(user_name=d["_id"], projects=d.get("projects", []), admin=bool(d.get("admin"))) for d in docs]


@router.post("/v2/users/{user_name}/tokens", status_code=201, response_model=IssuedToken, tags=["users"],
             summary="Issue another token")
async def issue_token(user_name: str, request: Request, principal: Principal = Depends(authenticate)):
    if principal.user_name != user_name:
        principal.require_admin()
    tokens = request.app.state.tokens
    user = await tokens.users.find_one({"_id": user_name})
    if user is None:
        raise ApiError(404, errors.NOT_FOUND, f"user {user_name} does not exist")
    return IssuedToken(user_name=user_name, projects=user.get("projects", []), admin=bool(user.get("admin")),
                       token=await tokens.issue(user_name))


@router.get("/v2/me", response_model=User, tags=["users"], summary="Who the token belongs to")
async def me(principal: Principal = Depends(authenticate)):
    return User(user_name=principal.user_name, projects=sorted(principal.projects), admin=principal.is_admin)


@router.get("/v2/nodes", tags=["nodes"], summary="Registered nodes and their state")
async def nodes(request: Request, principal: Principal = Depends(authenticate)) -> dict:
    records = await ask(request, RPC_NODES, {})
    items = []
    for record in records:
        info = record.get("info") or {}
        state = record["state"] if record["state"] == "lost" or not record.get("running") else "busy"
        items.append({**info, "node_id": record["node_id"], "state": state, "last_seen": record["last_seen"],
                      "running": record.get("running", []), "boot_id": record.get("boot_id", "")})
    return {"count": len(items), "items": items}


@router.get("/healthz", tags=["health"], summary="Liveness of every service")
async def healthz(request: Request) -> JSONResponse:
    async def probe(service: str) -> dict:
        try:
            reply = await request.app.state.broker.request({}, RPC_HEALTH.format(service=service), timeout=2)
            return {"ok": True, **(await reply.decode())}
        except Exception as exc:
            return {"ok": False, "error": repr(exc)}

    async def database() -> dict:
        try:
            await request.app.state.repo.db.command("ping")
            return {"ok": True}
        except Exception as exc:
            return {"ok": False, "error": repr(exc)}

    *answers, db, bus = await asyncio.gather(*(probe(s) for s in SERVICES), database(),
                                             request.app.state.broker.ping(timeout=2))
    services = {"submitter": {"ok": True}, **dict(zip(SERVICES, answers)), "database": db, "bus": {"ok": bus}}
    ok = all(s["ok"] for s in services.values())
    return JSONResponse(status_code=200 if ok else 503, content={"status": "ok" if ok else "degraded",
                                                                 "services": services})
