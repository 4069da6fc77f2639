"""The audit log: every change a person makes through the API — who, when, what, from where — in api_audit.

Written ahead: the record is stored before the change runs, and a change whose record cannot be stored is refused
(503, nothing changed). Its outcome (HTTP status, target id, a small summary) is added when the request ends,
retried a few times; a record whose outcome could not be added stays `begun` (the change may have happened)."""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pymongo import DESCENDING
from pymongo.asynchronous.collection import AsyncCollection
from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.clock import as_utc, utcnow
from shared.grouped import insert_grouped, update_grouped
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.errors import ApiError

log = logging.getLogger(__name__)
router = APIRouter(tags=["audit"])
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
KEEP_BYTES = 64 * 1024  # of a request or response body, to summarise it; larger ones are summarised without it
TRIES = 3
HOLDER = "audit"  # the request state key where the middleware and the dependency meet
# A job's creation asks placement and billing before it changes anything: its record is written meanwhile and
# awaited just before the job is stored (`recorded`); every other change waits for its record before its route runs.
RECORDED_LATER = {("POST", "/v2/{project_id}/training-jobs")}
Summary = Callable[[dict, dict, dict], tuple[str | None, dict]]  # (path params, request, response) -> target, summary


def _text(value: Any, limit: int = 128) -> Any:
    """A scalar from a hostile body, bounded; anything else becomes its type's name."""
    if value is None or isinstance(value, bool | int | float):
        return value
    return value[:limit] if isinstance(value, str) else type(value).__name__


def _job_create(params: dict, body: dict, answer: dict) -> tuple[str | None, dict]:
    meta, resource = body.get("metadata") or {}, (body.get("spec") or {}).get("resource") or {}
    if not isinstance(meta, dict) or not isinstance(resource, dict):
        return None, {}
    target = (answer.get("metadata") or {}).get("id") if isinstance(answer.get("metadata"), dict) else None
    return target, {
        "name": _text(meta.get("name")),
        "gpu_count": _text(resource.get("gpu_count")),
        "node_count": _text(resource.get("node_count")),
    }


def _v1_create(params: dict, body: dict, answer: dict) -> tuple[str | None, dict]:
    return _text(answer.get("job_id")), {"name": _text(body.get("job_name")), "dialect": "v1"}


def url_origin(url: Any) -> str | None:
    """Scheme, host and port of a webhook: its path and query may hold a secret (a Slack or Teams hook's does)."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        return _text(f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else ""))
    except ValueError:
        return "invalid"


def _numbers(body: dict) -> dict:
    return {k: _text(v) for k, v in list(body.items())[:10] if isinstance(v, int | float | None)}


ACTIONS: dict[tuple[str, str], tuple[str, Summary]] = {
    ("POST", "/v2/{project_id}/training-jobs"): ("job.create", _job_create),
    ("POST", "/v1/{project_id}/training-jobs"): ("job.create", _v1_create),
    ("POST", "/v2/{project_id}/training-jobs/{job_id}/actions"): (
        "job.action",
        lambda p, b, a: (p.get("job_id"), {"action_type": _text(b.get("action_type"))}),
    ),
    ("DELETE", "/v2/{project_id}/training-jobs/{job_id}"): ("job.delete", lambda p, b, a: (p.get("job_id"), {})),
    ("POST", "/v2/users"): (
        "user.create",
        lambda p, b, a: (
            _text(b.get("user_name")),
            {
                "projects": [_text(x, 64) for x in (b.get("projects") or [])[:20]]
                if isinstance(b.get("projects"), list)
                else None,
                "admin": _text(b.get("admin")),
                "token_id": _text(a.get("token_id")),
                "expires_in": _text(b.get("expires_in")),
            },
        ),
    ),
    ("POST", "/v2/users/{user_name}/tokens"): (
        "token.create",
        lambda p, b, a: (
            _text(a.get("token_id")),
            {"user_name": p.get("user_name"), "expires_in": _text(b.get("expires_in"))},
        ),
    ),
    ("DELETE", "/v2/users/{user_name}/tokens/{token_id}"): (
        "token.revoke",
        lambda p, b, a: (p.get("token_id"), {"user_name": p.get("user_name")}),
    ),
    ("PUT", "/v2/{project_id}/quotas"): (
        "quota.set",
        lambda p, b, a: (
            p.get("project_id"),
            {**_numbers(b), "users": sorted(b["users"])[:20] if isinstance(b.get("users"), dict) else None},
        ),
    ),
    ("PUT", "/v2/{project_id}/quotas/users/{user_name}"): (
        "quota.set_user",
        lambda p, b, a: (p.get("user_name"), _numbers(b)),
    ),
    ("PUT", "/v2/{project_id}/notifications"): (
        "webhook.set",
        lambda p, b, a: (
            p.get("project_id"),
            {"webhook": url_origin(b.get("webhook_url")), "new_secret": bool(a.get("signing_secret"))},
        ),
    ),
}


def describe(method: str, template: str, params: dict, body: bytes, answer: bytes) -> tuple[str, str | None, dict]:
    """(action, target id, summary) of a request; a route missing from ACTIONS is recorded by its method and path."""
    action, summarise = ACTIONS.get((method, template), (f"{method} {template}", None))
    if summarise is None:
        return action, None, {}
    try:
        request, response = json.loads(body or b"{}"), json.loads(answer or b"{}")
        target, summary = summarise(
            params, request if isinstance(request, dict) else {}, response if isinstance(response, dict) else {}
        )
    except (ValueError, TypeError, AttributeError, KeyError):
        target, summary = None, {"unreadable": True}
    if action == "job.action" and summary.get("action_type") in ("terminate", "migrate"):
        action = f"job.{summary['action_type']}"
    return action, _identifier(target), summary


def _identifier(value: Any) -> str | None:
    """A target id as text, whatever a hostile body put there (a number, a list), bounded."""
    value = _text(value)
    return None if value is None else str(value)


def is_dry_run(scope: Scope) -> bool:
    """Whether the request is a dry run as the route it reaches reads it: only a route with a `dry_run` query
    parameter has one (any other makes its change whatever the query says), and of several values it binds the
    last, parsed as it parses a bool. Until 2026-11-29 any route with any true `dry_run` went unrecorded
    (`DELETE ...?dry_run=true` deleted, `POST ...?dry_run=true&dry_run=false` created; found by review)."""
    dependant = getattr(scope.get("route"), "dependant", None)
    if dependant is None or not any(param.alias == "dry_run" for param in dependant.query_params):
        return False
    value = QueryParams(scope.get("query_string", b"")).get("dry_run")
    try:
        return value is not None and _BOOL.validate_python(value)
    except ValidationError:  # the route refuses it (400): recorded as any other refused change
        return False


_BOOL = TypeAdapter(bool)


class AuditLog:
    def __init__(self, collection: AsyncCollection) -> None:
        self.collection = collection

    async def prepare(self) -> None:
        await self.collection.create_index([("at_s", DESCENDING)])
        await self.collection.create_index([("project_id", 1), ("at_s", DESCENDING)])

    async def _retry(self, write) -> None:
        for attempt in range(1, TRIES + 1):
            try:
                await write()  # an insert refused by its id is one an earlier try stored, its answer lost
                return
            except Exception:
                if attempt == TRIES:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)

    async def begin(
        self,
        *,
        principal: Principal | None,
        action: str,
        method: str,
        path: str,
        template: str,
        project_id: str | None,
        target_id: str | None,
        client_ip: str,
        summary: dict | None = None,
        state: str = "begun",
    ) -> str:
        """Store the record of a change about to happen; raises when it cannot be stored."""
        entry_id = uuid.uuid4().hex
        doc = {
            "_id": entry_id,
            "at": utcnow(),
            "at_s": time.time(),
            "action": action,
            "method": method,
            "path": path[:512],
            "route": template,
            "project_id": project_id,
            "target_id": target_id,
            "user_name": principal.user_name if principal else "system",
            "token_id": principal.token_id if principal else "",
            "client_ip": client_ip,
            "state": state,
            "status": None,
            "summary": summary or {},
        }
        await self._retry(lambda: insert_grouped(self.collection, doc))  # with others begun at the same moment
        return entry_id

    async def finish(self, entry_id: str, *, action: str, status: int, target_id: str | None, summary: dict) -> None:
        update = {"state": "done", "action": action, "status": status, "summary": summary}
        if target_id:
            update["target_id"] = target_id
        await self._retry(lambda: update_grouped(self.collection, [({"_id": entry_id}, {"$set": update})]))

    async def page(self, query: dict[str, Any], *, offset: int, limit: int) -> tuple[int, list[dict]]:
        """How many entries match, and a page of them, newest first."""
        total = await self.collection.count_documents(query)
        cursor = self.collection.find(query).sort("at_s", DESCENDING).skip(offset).limit(limit)
        return total, [d async for d in cursor]


async def record(request: Request) -> None:
    """App-wide dependency: before a mutating route runs, store who is about to change what (or refuse, 503)."""
    holder = request.scope.get("state", {}).get(HOLDER)
    if holder is None or request.method not in MUTATING or is_dry_run(request.scope):
        return
    principal = await authenticate(request)
    route = request.scope.get("route")
    template, params = getattr(route, "path", request.url.path), dict(request.path_params)
    action, _, _ = describe(request.method, template, params, b"", b"")
    begun = asyncio.ensure_future(
        request.app.state.audit.begin(
            principal=principal,
            action=action,
            method=request.method,
            path=request.url.path,
            template=template,
            project_id=_text(params.get("project_id")),
            target_id=_text(params.get("job_id")),
            client_ip=request.client.host if request.client else "",
        )
    )
    holder.update(template=template, params=params, begun=begun)
    if (request.method, template) not in RECORDED_LATER:
        await recorded(request)


async def recorded(request: Request) -> None:
    """The record `record` began, stored: awaited before anything is changed (by `record` itself for every route
    but those `RECORDED_LATER`, which await it before their change); 503 where it cannot be, nothing changed."""
    holder = request.scope.get("state", {}).get(HOLDER)
    if holder is None or "begun" not in holder:
        return
    try:
        await holder["begun"]
    except Exception:  # logged once the request is answered (`AuditMiddleware._finish`)
        raise ApiError(
            503, errors.SERVICE_UNAVAILABLE, "the audit log cannot be written; nothing was changed, try again"
        ) from None


class AuditMiddleware:
    """Keeps the bodies of a mutating request and its answer (bounded) and, once answered, adds the outcome to the
    record `record` stored before the route ran."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING:
            return await self.app(scope, receive, send)
        holder: dict[str, Any] = {}
        scope.setdefault("state", {})[HOLDER] = holder
        request_body, response_body, status = bytearray(), bytearray(), [0]

        async def tee_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(request_body) <= KEEP_BYTES:
                request_body.extend(message.get("body", b"")[: KEEP_BYTES + 1])
            return message

        async def tee_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and len(response_body) <= KEEP_BYTES:
                response_body.extend(message.get("body", b"")[: KEEP_BYTES + 1])
            await send(message)

        try:
            await self.app(scope, tee_receive, tee_send)
        finally:
            if "begun" in holder:
                await self._finish(scope, holder, bytes(request_body), bytes(response_body), status[0] or 500)

    @staticmethod
    async def _finish(scope: Scope, holder: dict, body: bytes, answer: bytes, status: int) -> None:
        try:
            entry_id = await holder["begun"]  # a record that could not be stored has no outcome to add
        except Exception as exc:  # the change refused (503), or refused earlier for a reason of its own
            log.error("audit log unavailable, %s %s answered %d: %r", scope["method"], scope["path"], status, exc)
            return
        body, answer = (b if len(b) <= KEEP_BYTES else b"" for b in (body, answer))
        action, target, summary = describe(scope["method"], holder["template"], holder["params"], body, answer)
        try:
            await scope["app"].state.audit.finish(
                entry_id, action=action, status=status, target_id=target, summary=summary
            )
        except Exception as exc:
            log.error(
                "audit record %s of %s %s kept without its outcome: %r",
                entry_id,
                scope["method"],
                scope["path"],
                exc,
            )


class AuditEntry(BaseModel):
    id: str
    at: str
    user_name: str
    token_id: str
    action: str = Field(
        description="job.create, job.terminate, job.migrate, job.delete, user.create, token.create, "
        "token.revoke, quota.set, quota.set_user, webhook.set, admin_token.rotate, ..."
    )
    method: str
    path: str
    project_id: str | None
    target_id: str | None
    client_ip: str
    state: str = Field(description="done, or begun when the outcome could not be recorded")
    status: int | None = Field(description="The HTTP status the request was answered with.")
    summary: dict


class AuditPage(BaseModel):
    total: int
    count: int
    offset: int
    limit: int
    items: list[AuditEntry]


@router.get("/v2/audit", response_model=AuditPage, summary="Who changed what, when, from where (admin)")
async def list_entries(
    request: Request,
    principal: Principal = Depends(authenticate),
    project: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = None,
    user: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = None,
    from_: Annotated[datetime | None, Query(alias="from")] = None,
    to: Annotated[datetime | None, Query()] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> AuditPage:
    principal.require_admin()
    query: dict[str, Any] = {}
    if project:
        query["project_id"] = project
    if user:
        query["user_name"] = user
    span = {op: as_utc(t).timestamp() for op, t in (("$gte", from_), ("$lt", to)) if t is not None}
    if span:
        query["at_s"] = span
    if from_ and to and as_utc(to) <= as_utc(from_):
        raise ApiError(400, errors.PARAM_INVALID, "param[to] invalid: must be after from")
    total, docs = await request.app.state.audit.page(query, offset=offset, limit=limit)
    items = [
        AuditEntry(
            id=d["_id"],
            at=datetime.fromtimestamp(d["at_s"], UTC).isoformat(),
            target_id=_identifier(d.get("target_id")),  # entries written before ids were text
            **{
                k: d.get(k)
                for k in (
                    "user_name",
                    "token_id",
                    "action",
                    "method",
                    "path",
                    "project_id",
                    "client_ip",
                    "state",
                    "status",
                    "summary",
                )
            },
        )
        for d in docs
    ]
    return AuditPage(total=total, count=len(items), offset=offset, limit=limit, items=items)
