"""Job events that need a person: kept per project and delivered to its webhook, retried with backoff."""
import asyncio
import logging
import time
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, Query, Request
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field
from pymongo import DESCENDING
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from shared.egress import Policy, Refused, check_url, guarded_client
from shared.events import Notification
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.errors import ApiError
from services.submitter.views import ProjectId

log = logging.getLogger(__name__)
router = APIRouter(tags=["notifications"])
MAX_ATTEMPTS = 8
CLAIM_S = 60.0  # longer than one delivery may take (its timeouts)
BACKOFF_S = 1.0  # doubles each failed try, capped below
MAX_BACKOFF_S = 300.0


class NotificationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    webhook_url: AnyHttpUrl | None = Field(None, description="POSTed a JSON notification; none: keep them only.")


async def record(db: AsyncDatabase, event: Notification) -> None:
    """Keep a notification once (a redelivered event adds nothing) for the delivery loop."""
    try:
        await db.api_notifications.insert_one({
            "_id": event.event_id, "project_id": event.project_id, "job_id": event.job_id,
            "user_name": event.user_name, "kind": event.kind, "message": event.message,
            "created_at": event.occurred_at, "state": "pending", "attempts": 0, "next_try": 0.0, "error": "",
        })
    except DuplicateKeyError:
        pass


def backoff(attempts: int) -> float:
    return min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (attempts - 1))


async def deliver_forever(db: AsyncDatabase, *, policy: Policy, interval_s: float = 0.5) -> None:
    """Deliver due notifications; slow or failing webhooks never hold up the bus."""
    async with guarded_client(policy) as client:
        while True:
            now = time.time()
            due = [d async for d in db.api_notifications.find({"state": "pending", "next_try": {"$lte": now}})]
            mine = [doc for doc in due if await claim(db, doc, now=now)]
            await asyncio.gather(*(deliver(db, client, doc) for doc in mine))
            await asyncio.sleep(interval_s)


async def claim(db: AsyncDatabase, doc: dict[str, Any], *, now: float) -> bool:
    """Whether this replica of the API delivers it now: the first to move its next try on takes it (the others,
    and this one should it die mid-delivery, see it again only after CLAIM_S)."""
    taken = await db.api_notifications.update_one(
        {"_id": doc["_id"], "state": "pending", "next_try": doc["next_try"]}, {"$set": {"next_try": now + CLAIM_S}})
    return taken.modified_count == 1


async def deliver(db: AsyncDatabase, client: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    project = await db.api_projects.find_one({"_id": doc["project_id"]}) or {}
    url = project.get("webhook_url")
    if not url:
        await db.api_notifications.update_one({"_id": doc["_id"]}, {"$set": {"state": "kept"}})
        return
    payload = {k: doc[k] for k in ("project_id", "job_id", "user_name", "kind", "message")}
    payload["id"] = doc["_id"]
    attempts = doc["attempts"] + 1
    error = await post(client, url, payload)
    if not error:
        update = {"state": "delivered", "attempts": attempts, "error": ""}
    else:
        failed = attempts >= MAX_ATTEMPTS
        update = {"state": "failed" if failed else "pending", "attempts": attempts, "error": error,
                  "next_try": time.time() + backoff(attempts)}
    await db.api_notifications.update_one({"_id": doc["_id"]}, {"$set": update})


async def post(client: httpx.AsyncClient, url: str, payload: dict) -> str:
    """POST once; "" when answered 2xx, else only "HTTP <status>" or "unreachable" (nothing about the network)."""
    try:
        async with client.stream("POST", url, json=payload) as response:  # the body is never read
            if response.is_success:
                return ""
            log.warning("webhook %s answered HTTP %d", url, response.status_code)
            return f"HTTP {response.status_code}"
    except (httpx.HTTPError, OSError) as exc:  # refused by policy, DNS, connection, TLS, timeout: all alike
        log.warning("webhook %s unreachable: %r", url, exc)
        return "unreachable"


@router.put("/v2/{project_id}/notifications", response_model=NotificationSettings,
            summary="Where the project's notifications go")
async def configure(project_id: ProjectId, body: NotificationSettings, request: Request,
                    principal: Principal = Depends(authenticate)):
    principal.require_project(project_id)
    url = str(body.webhook_url) if body.webhook_url else None
    if url:
        try:
            await check_url(request.app.state.egress, url)
        except Refused as exc:
            raise ApiError(400, errors.PARAM_INVALID, f"param[webhook_url] invalid: {exc}; webhooks go to public "
                           "addresses only (an operator may allow hosts: TRAINMASTER_WEBHOOK_ALLOW_HOSTS)") from None
    await request.app.state.repo.db.api_projects.update_one({"_id": project_id}, {"$set": {"webhook_url": url}},
                                                            upsert=True)
    return NotificationSettings(webhook_url=url)


@router.get("/v2/{project_id}/notifications", summary="The project's notification settings and recent ones")
async def recent(project_id: ProjectId, request: Request, principal: Principal = Depends(authenticate),
                 limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict:
    principal.require_project(project_id)
    db = request.app.state.repo.db
    project = await db.api_projects.find_one({"_id": project_id}) or {}
    docs = [d async for d in db.api_notifications.find({"project_id": project_id})
            .sort("created_at", DESCENDING).limit(limit)]
    items = [{"id": d["_id"], **{k: d[k] for k in ("job_id", "user_name", "kind", "message", "state", "attempts",
                                                  "error")}, "created_at": d["created_at"].isoformat()}
             for d in docs]
    return {"webhook_url": project.get("webhook_url"), "count": len(items), "items": items}
